#include "core/sglang_policy.h"

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

}  // namespace specswap
