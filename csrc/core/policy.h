// What a round tells the adaptive policy (RoundObservation), and the interface every policy implements
// (Policy): sglang (sglang_policy.h), goodput (goodput_policy.h), or one written in Python
// (csrc/python/bind_core.cpp). AdaptiveSpeculativeParams feeds a policy one observe() per round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "core/adaptive_config.h"

namespace specswap {

class GoodputPolicy;
class RowCosts;

// Everything one round tells the policy, in one call. Views: the caller keeps the numbers alive for the call.
// A round is a verify at the current tier (accept_lengths), a plain decode run in its place (plain_requests), or
// neither (shadows alone); each part is empty where the round had none.
struct RoundObservation {
  static constexpr double kNoTiming = std::numeric_limits<double>::quiet_NaN();

  // the verify: accepted draft tokens (bonus excluded) of each request that speculated
  std::span<const int> accept_lengths;
  // the verify's or the plain decode's wall time (NaN or <= 0: untimed; the prior prices tiers never timed)
  double round_seconds = kNoTiming;
  bool sampled = false;  // the round built probability distributions (not all-greedy): dearer per position
  // at a tree tier, per request of accept_lengths: the drafts on the tree's first-child path (what the chain of
  // its depth would have drafted) accepted, and that path's depth (drafted up to there). Equal lengths.
  std::span<const int> chain_accept_lengths;
  std::span<const int> chain_depths;
  // at a chain tier, per request of accept_lengths: its check one draft past the chain, 1 / 0 the emitted bonus
  // token accepted / rejected the next draft of a request that accepted every draft, -1 not checked
  std::span<const int> deep_checks;
  // what deterministic drafts of shadow_steps tokens would have accepted per request, measured against the
  // tokens emitted since (the drafter's tier-0 checks)
  std::span<const int> shadow_accept_lengths;
  int shadow_steps = 0;
  // a plain decode of this many requests run in the current drafting tier's place (NGRAM: nothing to look up)
  int plain_requests = 0;

  bool has_verify() const noexcept { return !accept_lengths.empty(); }
};

// The bookkeeping AdaptiveSpeculativeParams keeps for every policy, this round's verify included.
struct PolicyState {
  std::size_t index;          // the current tier, into the candidates
  double ema;                 // EMA of the batch-mean accepted drafts per verify (ema_alpha per batch)
  std::uint64_t num_batches;  // verifies seen (non-empty)
};

// A policy over candidate tiers (keys, core/tier_key.h, ordered by verified drafts), fed every round. It moves
// only on a round with a verify (AdaptiveSpeculativeParams::observe checks that).
class Policy {
 public:
  virtual ~Policy() = default;
  // One round; returns the candidate index to run from the next round.
  virtual std::size_t observe(const RoundObservation& round, const PolicyState& state) = 0;
  // The verify's relative cost per row count, measured at start-up (goodput prices untimed tiers from it).
  virtual void set_row_costs(const RowCosts& row_costs) = 0;
  // The drafter sends shadow observations at tier 0 (it is not blind there).
  virtual void expect_shadows() noexcept = 0;
  // Seconds added to each candidate's estimated round cost where decisions price it (per candidate index): a cost
  // some of a tier's rounds pay whose rate moves faster than the tier is timed (a hybrid's model drafter, at its
  // current share of rounds), reported by the caller apart from the rounds' timings. Ignored by policies that
  // price no tier. No allocation.
  virtual void set_tier_surcharges(std::span<const double> /*seconds*/) noexcept {}
  // The acceptance and cost estimates the statistics report (alpha, model_tokens, costs): goodput's own; a
  // policy that learns none reports those of a goodput policy never fed (its priors).
  virtual const GoodputPolicy& estimates() const noexcept = 0;
};

// A policy that keeps no acceptance or cost model (sglang, Python): the statistics it reports are the priors of a
// goodput policy never fed, which only set_row_costs() and expect_shadows() change.
class ModelFreePolicy : public Policy {
 public:
  ~ModelFreePolicy() override;
  void set_row_costs(const RowCosts& row_costs) override;
  void expect_shadows() noexcept override;
  const GoodputPolicy& estimates() const noexcept override { return *priors_; }

 protected:
  ModelFreePolicy(const AdaptiveConfig& config, const std::vector<int>& candidates, std::size_t index);

 private:
  std::unique_ptr<GoodputPolicy> priors_;
};

// Builds config.policy's policy over `candidates`, starting at `index`: sglang or goodput. 'python' is built by
// the Python bindings (a C++ caller brings its own Policy); here it throws std::invalid_argument.
std::unique_ptr<Policy> make_policy(const AdaptiveConfig& config, const std::vector<int>& candidates,
                                    std::size_t index);

}  // namespace specswap
