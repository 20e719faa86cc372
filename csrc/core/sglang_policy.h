// SGLang's adaptive policy, kept bit for bit: an EMA of accepted draft tokens
// per verify against the fixed thresholds `tier - 0.5`, widened by the
// configured hysteresis.
#pragma once

#include <cstddef>
#include <vector>

#include "core/adaptive_config.h"

namespace specswap {

// The candidate index the EMA calls for, starting from `index` (candidates
// sorted, unique); moves as many tiers as the thresholds allow.
std::size_t sglang_tier(const std::vector<int>& candidates, std::size_t index, double ema,
                        const AdaptiveConfig& config) noexcept;

}  // namespace specswap
