// The adaptive policy: chooses the speculative step count among candidate
// tiers once per verify. Two policies (see docs/policy.md):
//  - sglang: an EMA of accepted draft tokens per verify against the fixed
//    thresholds `tier - 0.5` (SGLang's semantics, kept bit for bit);
//  - goodput: a per-token acceptance probability alpha and a measured cost
//    per round and tier; picks argmax E(k) / cost(k) with a hysteresis.
// Callable from a C++ serving loop without Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/adaptive_config.h"

namespace specswap {

class AdaptiveSpeculativeParams {
 public:
  static constexpr double kNoTiming = std::numeric_limits<double>::quiet_NaN();
  // Costs are kept per batch-size bucket (powers of two: 1, 2-3, 4-7, ...;
  // the last bucket holds every larger batch) and per kind of round (greedy,
  // sampled): tables 0..15 greedy, 16..31 sampled.
  static constexpr int kNumBuckets = 16;
  static constexpr int kNumTables = 2 * kNumBuckets;

  AdaptiveSpeculativeParams(int initial_steps, AdaptiveConfig config);

  // Feeds one verify: accepted draft tokens per request (bonus excluded),
  // made at current_steps(); round_seconds is the wall time of that decode
  // round (NaN or <= 0: no timing, goodput then uses the cost prior for tiers
  // never timed); sampled: the round built probability distributions (not
  // all-greedy), which costs more per verified position. sglang ignores both.
  // Returns true only if the step count changed. No allocation.
  bool update(std::span<const int> accept_lengths,
              double round_seconds = kNoTiming, bool sampled = false);

  int current_steps() const noexcept { return candidates_[index_]; }
  // EMA of the batch-mean accepted draft tokens (sglang's signal; kept for
  // both policies as a statistic).
  double ema() const noexcept { return ema_; }
  std::uint64_t num_batches() const noexcept { return num_batches_; }
  const std::vector<int>& candidate_steps() const noexcept {
    return candidates_;
  }
  const AdaptiveConfig& config() const noexcept { return config_; }

  // goodput's acceptance model: alpha = EMA(successes) / EMA(trials) over
  // batches (weighted by their size: ema_alpha is the weight of 4 requests),
  // where a request that accepted a of k drafts gives a successes
  // and a + 1 trials if a < k, else k trials. 0.5 before any trial.
  double alpha() const noexcept { return slow_.alpha(); }
  // Expected tokens per round at tier k, bonus included:
  // sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha).
  static double expected_tokens(double alpha, int steps) noexcept;
  // Expected tokens per round at `steps` under the configured acceptance
  // model (geometric: expected_tokens(alpha(), steps)).
  double model_tokens(int steps) const noexcept { return model_tokens(slow_, steps); }
  // positional model: acceptance rate of draft position 1..kMaxSteps given
  // the earlier ones were accepted (EMA ratio, shrunk toward alpha()).
  double position_acceptance(int position) const noexcept { return slow_.at(position); }

  // Seconds per round of every candidate (in candidate_steps() order) for a
  // batch of batch_size requests (0: the last batch's table): measured where
  // measured, else estimated (docs/policy.md). Allocates; for statistics.
  std::vector<double> cost_estimates(int batch_size = 0, bool sampled = false) const;
  // Measured EMA of seconds per round, per table and candidate (NaN where
  // never measured); rows are tables 0..kNumTables-1.
  std::vector<std::vector<double>> measured_costs() const;
  static int bucket_of(int batch_size) noexcept;
  static int table_of(int batch_size, bool sampled) noexcept;

 private:
  void recompute_sglang();
  bool decide_goodput(double min_gain);
  // Between decisions: the tier a phase change calls for (index_ if none).
  std::size_t phase_change_target() const noexcept;
  void update_goodput(std::span<const int> accept_lengths, double round_seconds,
                      bool sampled, int steps);
  void estimate_costs(int table, double* out) const noexcept;
  bool fit_table(int table, double* intercept, double* slope) const noexcept;
  // Whether this cost sample falls in a slow spell (and so is not learned).
  bool slow_spell(std::size_t slot, double seconds) noexcept;
  void move_to(std::size_t index, bool is_decision) noexcept;
  std::uint64_t first_zero_wait() const noexcept;

  AdaptiveConfig config_;
  std::vector<int> candidates_;  // sorted, unique
  std::size_t index_ = 0;        // into candidates_
  double ema_ = 0.0;
  std::uint64_t num_batches_ = 0;  // non-empty batches seen

  // goodput state
  std::size_t initial_index_ = 0;
  // An acceptance estimate: pooled successes / trials and, per draft
  // position 1..kMaxSteps, the EMAs of reaching and accepting it.
  struct Acceptance {
    // EMA weight per batch; when per_request, per kRequestsPerWeight
    // requests: a batch of n keeps (1 - weight)^(n/4) of the old counts and
    // adds its own with weight `weight`, so every request weighs the same and
    // the estimate remembers as many requests at batch 1 as at batch 8.
    static constexpr double kRequestsPerWeight = 4.0;
    double weight = 0.2;
    bool per_request = false;
    bool forget_unreached = false;  // unreached positions fade toward alpha
    double successes = 0.0;
    double trials = 0.0;
    std::vector<double> position_successes;
    std::vector<double> position_trials;
    double alpha() const noexcept;
    double at(int position) const noexcept;  // shrunk toward alpha()
    void observe(std::size_t requests, long long batch_successes, long long batch_trials,
                 const double* reached, const double* accepted_at, int steps) noexcept;
  };
  double model_tokens(const Acceptance& estimate, int steps) const noexcept;
  Acceptance slow_;  // config.ema_alpha: what decisions use
  Acceptance fast_;  // kFastEmaWeight: detects phase changes between decisions
  std::size_t phase_change_tier_ = 0;        // where the last batches pointed
  std::uint64_t phase_change_requests_ = 0;  // requests in those batches
  // [table * candidates + index]: EMA of seconds per round; NaN = never.
  std::vector<double> cost_ema_;
  std::vector<std::uint64_t> cost_timed_at_;  // same layout: num_batches_ of the last sample
  std::vector<std::uint64_t> cost_run_;       // samples since the slot last went stale
  // slow spells: rounds in a row far above their tier's cost
  double spell_level_ = 1.0;    // > 1 while in a spell: its rounds' ratio to the costs
  int suspects_ = 0;            // such rounds in a row before a spell is called
  double suspect_ratios_ = 0.0;  // the sum of their ratios
  double cost_noise_ = 0.0;     // EMA of squared log(round time / its tier's cost)
  mutable std::vector<double> scratch_;  // candidates_.size(): costs
  int last_table_ = 0;
  std::uint64_t probe_batches_ = 0;      // candidates * probe_rounds
  std::uint64_t batches_on_tier_ = 0;    // since the last switch
  std::uint64_t zero_wait_ = 0;          // batches at tier 0 before a probe
  int zero_probe_left_ = 0;              // batches left in a probe out of 0
  std::vector<double> position_scratch_;  // per-batch counts
  // oscillation guard: an up move followed at once by a down move is a
  // bounce; each bounce in a row doubles how many decisions refuse up moves.
  std::uint64_t decisions_ = 0;
  std::uint64_t last_switch_decision_ = 0;
  bool last_switch_up_ = false;
  int bounces_ = 0;
  std::uint64_t up_blocked_until_ = 0;   // decision count
};

}  // namespace specswap
