// SGLang's adaptive policy, kept bit for bit: an EMA of accepted draft tokens
// per verify against the fixed thresholds `tier - 0.5`, widened by the
// configured hysteresis.
#pragma once

#include <cstddef>
#include <vector>

#include "core/adaptive_config.h"
#include "core/policy.h"

namespace specswap {

// The candidate index the EMA calls for, starting from `index` (candidates
// sorted, unique); moves as many tiers as the thresholds allow.
std::size_t sglang_tier(const std::vector<int>& candidates, std::size_t index, double ema,
                        const AdaptiveConfig& config) noexcept;

// After warmup_batches verifies, every update_interval-th verify moves to sglang_tier() of the EMA
// (PolicyState::ema); reads nothing else of a round.
class SglangPolicy final : public ModelFreePolicy {
 public:
  SglangPolicy(const AdaptiveConfig& config, const std::vector<int>& candidates, std::size_t index);
  std::size_t observe(const RoundObservation& round, const PolicyState& state) override;

 private:
  AdaptiveConfig config_;
  std::vector<int> candidates_;
};

}  // namespace specswap
