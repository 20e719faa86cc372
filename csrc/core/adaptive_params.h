// The adaptive policy's driver: chooses the speculative tier among the
// candidate tiers, fed one observe(RoundObservation) per round, through the
// Policy config.policy names (core/policy.h; docs/policy.md):
//  - sglang (sglang_policy.h): an EMA of accepted draft tokens per verify
//    against the fixed thresholds `tier - 0.5` (SGLang's semantics, kept bit
//    for bit);
//  - goodput (goodput_policy.h): a per-token acceptance probability alpha and
//    a measured cost per round and tier (acceptance_cost.h); picks argmax
//    E(k) / cost(k) with a hysteresis;
//  - python: a Policy the caller builds (the Python bindings wrap a Python
//    object in one).
// Callable from a C++ serving loop without Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/acceptance_cost.h"
#include "core/adaptive_config.h"
#include "core/goodput_policy.h"
#include "core/policy.h"

namespace specswap {

class AdaptiveSpeculativeParams {
 public:
  static constexpr double kNoTiming = RoundObservation::kNoTiming;
  static constexpr int kNumBuckets = CostModel::kNumBuckets;
  static constexpr int kNumTables = CostModel::kNumTables;
  // Builds the policy over the candidates (in candidate_tiers() order) from the initial index.
  using PolicyFactory =
      std::function<std::unique_ptr<Policy>(const AdaptiveConfig&, const std::vector<int>&, std::size_t)>;

  // policy: builds the policy (empty: make_policy(), config.policy's built-in one; 'python' needs one).
  AdaptiveSpeculativeParams(int initial_tier, AdaptiveConfig config, const PolicyFactory& policy = {});

  // The candidates of a config started at initial_tier (what candidate_tiers() will be) and the index of the
  // initial tier among them. Throws std::invalid_argument on a bad config or initial tier.
  static std::pair<std::vector<int>, std::size_t> tiers_for(int initial_tier, const AdaptiveConfig& config);

  // Feeds one round (RoundObservation: a verify made at current_tier(), a
  // plain decode in its place, shadows). A verify moves the EMA and counts a
  // batch. Returns true only if the tier changed, which only a verify
  // can do. Throws std::invalid_argument on a round that is both a verify and
  // a plain decode, or whose chain lengths and depths differ in length;
  // std::logic_error if the policy moved on a round without a verify. No
  // allocation (the built-in policies).
  bool observe(const RoundObservation& round);
  // observe() of a round that is a verify alone.
  bool update(std::span<const int> accept_lengths, double round_seconds = kNoTiming, bool sampled = false);
  // The verify's relative cost per row count, measured at start-up (empty:
  // none): goodput prices tiers never timed from it (GoodputPolicy::
  // set_row_costs). Allocates; any time, usually before the first update.
  void set_row_costs(RowCosts row_costs);
  const RowCosts& row_costs() const noexcept { return row_costs_; }
  // The drafter sends shadows at tier 0 (goodput then leaves blind_zero_margin off and runs no tier-0 probes).
  void expect_shadows() noexcept { policy_->expect_shadows(); }
  // Seconds added to each candidate's estimated cost (Policy::set_tier_surcharges), one per candidate in order.
  // Throws std::invalid_argument on another count. No allocation.
  void set_tier_surcharges(std::span<const double> seconds);

  int current_tier() const noexcept { return candidates_[index_]; }
  // EMA of the batch-mean accepted draft tokens (sglang's signal; kept for
  // every policy, PolicyState::ema).
  double ema() const noexcept { return ema_; }
  std::uint64_t num_batches() const noexcept { return num_batches_; }
  const std::vector<int>& candidate_tiers() const noexcept {
    return candidates_;
  }
  const AdaptiveConfig& config() const noexcept { return config_; }

  // goodput's acceptance model (the other policies report its prior): alpha =
  // EMA(successes) / EMA(trials) over batches (weighted by their size:
  // ema_alpha is the weight of 4 requests), where a request that accepted a
  // of k drafts gives a successes and a + 1 trials if a < k, else k trials.
  // 0.5 before any trial.
  double alpha() const noexcept { return policy_->estimates().acceptance().alpha(); }
  // Expected tokens per round at tier k, bonus included:
  // sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha).
  static double expected_tokens(double alpha, int steps) noexcept {
    return specswap::expected_tokens(alpha, steps);
  }
  // Expected tokens per round at `steps` under the configured acceptance
  // model (geometric: expected_tokens(alpha(), steps)), as goodput's decisions price it now
  // (GoodputPolicy::model_tokens).
  double model_tokens(int steps) const noexcept { return policy_->estimates().model_tokens(steps); }
  // positional model: acceptance rate of draft position 1..kMaxSteps given
  // the earlier ones were accepted (EMA ratio, shrunk toward alpha()).
  double position_acceptance(int position) const noexcept {
    return policy_->estimates().acceptance().at(position);
  }

  // Seconds per round of every candidate (in candidate_tiers() order) for a
  // batch of batch_size requests (0: the last batch's table): measured where
  // measured, else estimated (docs/policy.md). Allocates; for statistics.
  std::vector<double> cost_estimates(int batch_size = 0, bool sampled = false) const;
  // Whether a drafting tier could pay at the last batch's table with every draft accepted
  // (GoodputPolicy::drafting_can_pay; a model-free policy's priors: true). The drafter's tier-0 checks pause
  // while it is false.
  bool drafting_can_pay() const noexcept { return policy_->estimates().drafting_can_pay(); }
  // Measured EMA of seconds per round, per table and candidate (NaN where
  // never measured); rows are tables 0..kNumTables-1.
  std::vector<std::vector<double>> measured_costs() const { return policy_->estimates().costs().measured(); }
  static int bucket_of(int batch_size) noexcept { return CostModel::bucket_of(batch_size); }
  static int table_of(int batch_size, bool sampled) noexcept { return CostModel::table_of(batch_size, sampled); }

 private:
  AdaptiveSpeculativeParams(AdaptiveConfig config, std::pair<std::vector<int>, std::size_t> tiers,
                            const PolicyFactory& policy);

  AdaptiveConfig config_;
  std::vector<int> candidates_;  // tier keys (core/tier_key.h), unique, by verified drafts
  std::size_t index_ = 0;        // into candidates_
  double ema_ = 0.0;
  std::uint64_t num_batches_ = 0;  // non-empty batches seen
  std::unique_ptr<Policy> policy_;
  RowCosts row_costs_;
};

}  // namespace specswap
