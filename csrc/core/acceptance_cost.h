// The estimates both policies can report and the goodput policy decides on
// (docs/policy.md): how many drafts are accepted (AcceptanceEstimate, the
// expected tokens per round) and what a round costs per tier, batch size and
// kind of round (CostModel). Allocation-free after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/adaptive_config.h"

namespace specswap {

// Expected tokens per round at `steps` drafts, bonus included, when each
// draft is accepted with probability alpha given the earlier ones were:
// sum_{i=0..k} alpha^i.
double expected_tokens(double alpha, int steps) noexcept;

// Acceptance as EMAs: pooled successes / trials and, per draft position
// 1..kMaxSteps, the EMAs of reaching and accepting it.
struct AcceptanceEstimate {
  // EMA weight per batch; when per_request, per kRequestsPerWeight requests:
  // a batch of n keeps (1 - weight)^(n/4) of the old counts and adds its own
  // with weight `weight`, so every request weighs the same and the estimate
  // remembers as many requests at batch 1 as at batch 8.
  static constexpr double kRequestsPerWeight = 4.0;

  AcceptanceEstimate(double weight, bool per_request, bool forget_unreached);

  double weight;
  bool per_request;
  bool forget_unreached;  // unreached positions fade toward alpha
  double successes = 0.0;
  double trials = 0.0;
  std::vector<double> position_successes;
  std::vector<double> position_trials;

  // successes / trials; 0.5 before any trial.
  double alpha() const noexcept;
  // Acceptance rate of a draft position, shrunk toward alpha().
  double at(int position) const noexcept;
  // Keeps `fraction` of every count (what a new phase leaves of the old one's memory); ratios stay as they were.
  void forget(double fraction) noexcept;
  // One batch: `reached` / `accepted_at` are per-position counts of the
  // deepest position each request reached / accepted (suffix-summed here).
  void observe(std::size_t requests, long long batch_successes, long long batch_trials,
               const double* reached, const double* accepted_at, int steps) noexcept;
  // One position's trials alone (a check one draft past a chain, of requests that accepted all before it):
  // `requests` reached `position`, `accepted` of them accepted it. Only that position's EMAs move, with the
  // weight of those requests; the pooled counts and the other positions stay as they were.
  void observe_position(int position, std::size_t requests, std::size_t accepted) noexcept;
  // Expected tokens per round at `steps` under `model`; the positional model
  // uses the observed rates of positions up to `depth` (the tier the
  // observations came from), the deepest of them beyond it.
  double tokens(AcceptanceModel model, int depth, int steps) const noexcept;
  // The same with the first draft's acceptance rate set to `first` (the pooled alpha under the geometric model).
  double tokens_with_first(AcceptanceModel model, int depth, int steps, double first) const noexcept;
  // The first draft's rate as tokens() reads it, and how many requests' worth of evidence it rests on (the
  // effective sample size of its exponentially weighted counts, 0 before any).
  double first_rate(AcceptanceModel model, int depth) const noexcept;
  double first_evidence(AcceptanceModel model, int depth) const noexcept;

 private:
  // Whether tokens() reads the first draft's own position (positional, observed), not the pooled alpha.
  bool first_position_read(AcceptanceModel model, int depth) const noexcept;
};

// The verify's relative cost per row count (docs/policy.md): a forward of n
// new rows over one of a single row, measured at a few row counts (1 among
// them) where the engine starts. Between measured counts linear, below the
// first its value, beyond the last along the last segment (never falling).
// Empty: no table (the cost prior is 1 + cost_prior_slope * drafts).
class RowCosts {
 public:
  RowCosts() = default;
  // rows strictly increasing from 1; costs finite and > 0, stored divided by
  // the cost at 1 row. Throws std::invalid_argument naming what is wrong.
  RowCosts(std::vector<int> rows, std::vector<double> costs);

  bool empty() const noexcept { return rows_.empty(); }
  // The relative cost of a forward of `rows` new rows (1 for an empty table).
  double at(int rows) const noexcept;
  const std::vector<int>& rows() const noexcept { return rows_; }
  const std::vector<double>& costs() const noexcept { return costs_; }

 private:
  std::vector<int> rows_;
  std::vector<double> costs_;
};

// Seconds per round: an EMA per table (batch-size bucket x kind of round) and
// candidate tier, slow spells kept out of it, and estimates for tiers never
// timed. Each table also follows the machine's speed (its level): a tier
// that has run for kSettleRounds rounds in a row moves the level with its
// cost, and every tier's cost is rescaled by how far the level moved since
// it was last timed, so the costs of tiers timed minutes apart stay
// comparable while the machine speeds up or slows down.
class CostModel {
 public:
  // Costs are kept per batch-size bucket (powers of two: 1, 2-3, 4-7, ...;
  // the last bucket holds every larger batch) and per kind of round (greedy,
  // sampled): tables 0..15 greedy, 16..31 sampled.
  static constexpr int kNumBuckets = 16;
  static constexpr int kNumTables = 2 * kNumBuckets;
  // Rounds in a row at one tier before its cost changes move the level: the
  // first rounds after a switch measure the tier against the others (what
  // a switch can tell), later ones the machine's speed.
  static constexpr int kSettleRounds = 4;
  static int bucket_of(int batch_size) noexcept;
  static int table_of(int batch_size, bool sampled) noexcept;

  CostModel(const std::vector<int>& candidates, const AdaptiveConfig& config);

  // One timed round at candidate `index` in `table`; `batch` counts the
  // policy's batches (staleness), `probing` marks the start-up probes.
  void learn(int table, std::size_t index, double seconds, std::uint64_t batch, bool probing) noexcept;
  // One round of candidate `index` timed while another tier runs (a plain
  // decode run in its place): learned into its cost as any round is, but
  // it neither moves the level nor counts as a round of the running tier.
  void learn_beside(int table, std::size_t index, double seconds, std::uint64_t batch) noexcept;
  // Seconds per round of every candidate in `table` (candidates order):
  // measured where measured, else estimated.
  void estimate(int table, double* out) const noexcept;
  // The measured EMAs at the table's current level, [table][candidate], NaN
  // where never measured.
  std::vector<std::vector<double>> measured() const;
  // Candidate `index`'s cost as the line through the table's other measured
  // tiers puts it (NaN with fewer than two of them).
  double line_cost(int table, std::size_t index) const noexcept;
  // Candidate `index`'s cost before any timing, relative to a round without
  // drafts: 1 + cost_prior_slope * drafts, or what set_prior() gave.
  double prior(std::size_t index) const noexcept {
    return prior_.empty() ? 1.0 + prior_slope_ * candidates_[index] : prior_[index];
  }
  // Replaces the prior (one value per candidate, > 0; empty: back to the
  // slope). Allocates: at start-up, not per round.
  void set_prior(std::vector<double> prior);
  // Whether set_prior() gave a measured prior (the row costs), not the slope.
  bool has_prior() const noexcept { return !prior_.empty(); }
  // The policy batch at which candidate `index` was last timed in `table` (0: never).
  std::uint64_t timed_at(int table, std::size_t index) const noexcept {
    return timed_at_[table * candidates_.size() + index];
  }

 private:
  // Least squares through the table's measured tiers, leaving out candidate `skip` (none if out of range).
  bool fit(int table, double* intercept, double* slope, std::size_t skip = SIZE_MAX) const noexcept;
  int measured_in(int table) const noexcept;
  // A slot's cost at its table's current level (NaN if never timed).
  double cost_now(int table, std::size_t index) const noexcept;
  // The slot brought to its table's level, then `seconds` learned into its
  // EMA; false if the sample fell in a slow spell (not learned). `before`:
  // the slot's cost ahead of the sample (NaN if never timed).
  bool absorb(int table, std::size_t slot, double seconds, std::uint64_t batch, bool probing,
              double* before) noexcept;
  // Whether this sample falls in a slow spell (and so is not learned).
  bool slow_spell(std::size_t slot, double seconds) noexcept;

  std::vector<int> candidates_;
  double ema_alpha_;
  std::uint64_t stale_after_;  // batches untimed before a slot starts a new run
  double prior_slope_;
  std::vector<double> prior_;  // [candidate]: set_prior()'s, or empty for the slope
  // [table * candidates + index]: EMA of seconds per round; NaN = never.
  std::vector<double> cost_ema_;
  std::vector<std::uint64_t> timed_at_;  // same layout: batch of the last sample
  std::vector<std::uint64_t> run_;       // samples since the slot last went stale
  std::vector<double> level_at_;         // same layout: the table's level when the slot was last timed
  std::vector<double> level_;            // [table]: the machine's speed, 1 at the start
  std::vector<int> last_index_;          // [table]: the tier of the last round learned (-1: none)
  std::vector<int> rounds_in_a_row_;     // [table]: rounds learned in a row at that tier
  // slow spells: rounds in a row far above their tier's cost
  double spell_level_ = 1.0;     // > 1 while in a spell: its rounds' ratio to the costs
  int suspects_ = 0;             // such rounds in a row before a spell is called
  double suspect_ratios_ = 0.0;  // the sum of their ratios
  double noise_ = 0.0;           // EMA of squared log(round time / its tier's cost)
};

}  // namespace specswap
