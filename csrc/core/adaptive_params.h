// The adaptive policy: an EMA of accepted draft tokens per verify chooses the
// speculative step count among candidate tiers. Semantics follow SGLang's
// adaptive speculative decoding (see docs/policy.md); callable from a C++
// serving loop without Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace specswap {

struct AdaptiveConfig {
  std::vector<int> candidate_steps{1, 3, 7};
  double ema_alpha = 0.2;
  int update_interval = 5;
  int warmup_batches = 10;
  double down_hysteresis = -0.25;
  double up_hysteresis = 0.0;
  // false: the initial step count joins the candidates (no unused state is
  // built for it later). true: it snaps to the nearest candidate, ties to the
  // larger (SGLang's original behaviour).
  bool snap_initial_steps = false;

  static constexpr int kMaxSteps = 64;

  // Throws std::invalid_argument naming the key, the bad value and the valid
  // range.
  void validate() const;
};

class AdaptiveSpeculativeParams {
 public:
  AdaptiveSpeculativeParams(int initial_steps, AdaptiveConfig config);

  // Feeds one verify: accepted draft tokens per request (bonus excluded).
  // Returns true only if the step count changed. No allocation.
  bool update(std::span<const int> accept_lengths);

  int current_steps() const noexcept { return candidates_[index_]; }
  double ema() const noexcept { return ema_; }
  std::uint64_t num_batches() const noexcept { return num_batches_; }
  const std::vector<int>& candidate_steps() const noexcept {
    return candidates_;
  }
  const AdaptiveConfig& config() const noexcept { return config_; }

 private:
  void recompute();

  AdaptiveConfig config_;
  std::vector<int> candidates_;  // sorted, unique
  std::size_t index_ = 0;        // into candidates_
  double ema_ = 0.0;
  std::uint64_t num_batches_ = 0;  // non-empty batches seen
};

}  // namespace specswap
