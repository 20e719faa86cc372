// The adaptive policy: chooses the speculative step count among candidate
// tiers once per verify, by config.policy (see docs/policy.md):
//  - sglang (sglang_policy.h): an EMA of accepted draft tokens per verify
//    against the fixed thresholds `tier - 0.5` (SGLang's semantics, kept bit
//    for bit);
//  - goodput (goodput_policy.h): a per-token acceptance probability alpha and
//    a measured cost per round and tier (acceptance_cost.h); picks argmax
//    E(k) / cost(k) with a hysteresis.
// Callable from a C++ serving loop without Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/acceptance_cost.h"
#include "core/adaptive_config.h"
#include "core/goodput_policy.h"

namespace specswap {

class AdaptiveSpeculativeParams {
 public:
  static constexpr double kNoTiming = std::numeric_limits<double>::quiet_NaN();
  static constexpr int kNumBuckets = CostModel::kNumBuckets;
  static constexpr int kNumTables = CostModel::kNumTables;

  AdaptiveSpeculativeParams(int initial_steps, AdaptiveConfig config);

  // Feeds one verify: accepted draft tokens per request (bonus excluded),
  // made at current_steps(); round_seconds is the wall time of that decode
  // round (NaN or <= 0: no timing, goodput then uses the cost prior for tiers
  // never timed); sampled: the round built probability distributions (not
  // all-greedy), which costs more per verified position. sglang ignores both.
  // Returns true only if the step count changed. No allocation.
  bool update(std::span<const int> accept_lengths,
              double round_seconds = kNoTiming, bool sampled = false);

  // What deterministic drafts of `steps` tokens would have accepted per
  // request, measured against the tokens emitted since (GoodputPolicy::shadow;
  // taken at tier 0 only, by goodput only). Never switches by itself.
  void shadow(std::span<const int> accept_lengths, int steps);
  // A tree tier's verify read as its chain's: per request, the drafts on the tree's first-child path accepted
  // and that path's depth (GoodputPolicy::tree_chain; goodput only, at a tree tier only; call before update()).
  // Throws std::invalid_argument if the two differ in length. Never switches.
  void tree_chain(std::span<const int> accept_lengths, std::span<const int> depths);
  // A chain tier's checks one draft past it, per request: 1 / 0 accepted / rejected, -1 not checked
  // (GoodputPolicy::deep_checks; goodput only; call before update()). Never switches.
  void deep_checks(std::span<const int> outcomes);
  // A plain decode run in place of the current drafting tier, timed
  // (GoodputPolicy::plain_round; goodput only). Never switches.
  void plain_round(int batch_size, double round_seconds, bool sampled);
  // The verify's relative cost per row count, measured at start-up (empty:
  // none): goodput prices tiers never timed from it (GoodputPolicy::
  // set_row_costs). Allocates; any time, usually before the first update.
  void set_row_costs(RowCosts row_costs);
  const RowCosts& row_costs() const noexcept { return row_costs_; }
  // The drafter sends shadows at tier 0 (goodput then leaves blind_zero_margin off and runs no tier-0 probes).
  void expect_shadows() noexcept { goodput_.expect_shadows(); }

  int current_steps() const noexcept { return candidates_[index_]; }
  // EMA of the batch-mean accepted draft tokens (sglang's signal; kept for
  // both policies as a statistic).
  double ema() const noexcept { return ema_; }
  std::uint64_t num_batches() const noexcept { return num_batches_; }
  const std::vector<int>& candidate_steps() const noexcept {
    return candidates_;
  }
  const AdaptiveConfig& config() const noexcept { return config_; }

  // goodput's acceptance model (sglang leaves it at its prior): alpha =
  // EMA(successes) / EMA(trials) over batches (weighted by their size:
  // ema_alpha is the weight of 4 requests), where a request that accepted a
  // of k drafts gives a successes and a + 1 trials if a < k, else k trials.
  // 0.5 before any trial.
  double alpha() const noexcept { return goodput_.acceptance().alpha(); }
  // Expected tokens per round at tier k, bonus included:
  // sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha).
  static double expected_tokens(double alpha, int steps) noexcept {
    return specswap::expected_tokens(alpha, steps);
  }
  // Expected tokens per round at `steps` under the configured acceptance
  // model (geometric: expected_tokens(alpha(), steps)), as goodput's decisions price it now
  // (GoodputPolicy::model_tokens).
  double model_tokens(int steps) const noexcept { return goodput_.model_tokens(steps); }
  // positional model: acceptance rate of draft position 1..kMaxSteps given
  // the earlier ones were accepted (EMA ratio, shrunk toward alpha()).
  double position_acceptance(int position) const noexcept { return goodput_.acceptance().at(position); }

  // Seconds per round of every candidate (in candidate_steps() order) for a
  // batch of batch_size requests (0: the last batch's table): measured where
  // measured, else estimated (docs/policy.md). Allocates; for statistics.
  std::vector<double> cost_estimates(int batch_size = 0, bool sampled = false) const;
  // Measured EMA of seconds per round, per table and candidate (NaN where
  // never measured); rows are tables 0..kNumTables-1.
  std::vector<std::vector<double>> measured_costs() const { return goodput_.costs().measured(); }
  static int bucket_of(int batch_size) noexcept { return CostModel::bucket_of(batch_size); }
  static int table_of(int batch_size, bool sampled) noexcept { return CostModel::table_of(batch_size, sampled); }

 private:
  AdaptiveSpeculativeParams(AdaptiveConfig config, std::pair<std::vector<int>, std::size_t> tiers);

  AdaptiveConfig config_;
  std::vector<int> candidates_;  // tier keys (core/tier_key.h), unique, by verified drafts
  std::size_t index_ = 0;        // into candidates_
  double ema_ = 0.0;
  std::uint64_t num_batches_ = 0;  // non-empty batches seen
  // Built for either policy: under sglang it only answers the statistics
  // (alpha, costs) from its priors.
  GoodputPolicy goodput_;
  RowCosts row_costs_;
};

}  // namespace specswap
