#include "core/sglang_policy.h"

#include <cstdint>

namespace specswap {

std::size_t sglang_tier(const std::vector<int>& candidates, std::size_t index, double ema,
                        const AdaptiveConfig& config) noexcept {
  // A tier of k drafts pays off once about k - 0.5 of them are accepted on
  // average; the hysteresis terms widen that band so the tier does not flap.
  while (index > 0 && ema <= candidates[index - 1] - 0.5 + config.down_hysteresis) {
    --index;
  }
  while (index + 1 < candidates.size() && ema > candidates[index] - 0.5 + config.up_hysteresis) {
    ++index;
  }
  return index;
}

SglangPolicy::SglangPolicy(const AdaptiveConfig& config, const std::vector<int>& candidates, std::size_t index)
    : ModelFreePolicy(config, candidates, index), config_(config), candidates_(candidates) {}

std::size_t SglangPolicy::observe(const RoundObservation& round, const PolicyState& state) {
  if (!round.has_verify()) return state.index;
  const auto warmup = static_cast<std::uint64_t>(config_.warmup_batches);
  const auto interval = static_cast<std::uint64_t>(config_.update_interval);
  if (state.num_batches <= warmup) return state.index;
  if ((state.num_batches - warmup) % interval != 0) return state.index;
  return sglang_tier(candidates_, state.index, state.ema, config_);
}

}  // namespace specswap
