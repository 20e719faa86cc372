// The cost-aware goodput policy (docs/policy.md): picks argmax E(k) / cost(k)
// over the candidate tiers from the acceptance and cost estimates, with
// start-up probes, probes out of tier 0 (or shadow observations there), a
// bounce guard and moves on phase changes between decisions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/acceptance_cost.h"
#include "core/adaptive_config.h"
#include "core/policy.h"

namespace specswap {

class GoodputPolicy final : public Policy {
 public:
  // candidates: tier keys (core/tier_key.h: a chain's step count, a tree's encoded shape), unique, ordered
  // by verified drafts; initial_index into them. A chain's expected tokens come from the acceptance
  // estimates; a tree's are its chain's (same depth) times the tree's measured gain over it.
  GoodputPolicy(const AdaptiveConfig& config, std::vector<int> candidates, std::size_t initial_index);

  // One round, its parts in this order: the shadows (shadow()), a plain decode (plain_round()), a tree round's
  // chain (tree_chain()) and a chain round's checks past it (deep_checks()), then the verify (update()). Returns
  // the candidate index to run next (it moves on a verify only). No allocation.
  std::size_t observe(const RoundObservation& round, const PolicyState& state) override;
  // The verify's measured relative cost per row count (empty: none): tiers
  // never timed are then priced cost_prior_slope per draft step plus the
  // verify at their row count (a chain's steps + 1, a tree's nodes), instead
  // of 1 + cost_prior_slope per verified draft. Allocates: at start-up.
  void set_row_costs(const RowCosts& row_costs) override;
  // The drafter will send shadow observations at tier 0 (it is not blind there): blind_zero_margin is off,
  // tier 0 runs no probes, and with row costs set start-up probing runs the initial tier alone.
  void expect_shadows() noexcept override { shadow_seen_ = true; }
  void set_tier_surcharges(std::span<const double> seconds) noexcept override;
  // Per candidate into out (candidates' size): its estimated cost in cost table `table`, plus its surcharge
  // (set_tier_surcharges), as decisions price it.
  void estimate_costs(int table, double* out) const noexcept;
  const GoodputPolicy& estimates() const noexcept override { return *this; }

  std::size_t index() const noexcept { return index_; }
  // The estimate decisions use (EMA weight config.ema_alpha).
  // Kept per kind of round (greedy, sampled): the current kind's.
  const AcceptanceEstimate& acceptance() const noexcept { return slow(); }
  // Expected tokens per round at `steps` chain drafts under the configured model, as decisions price it now:
  // the positions observed up to observed_depth(), the deepest of them standing in beyond.
  double model_tokens(int steps) const noexcept {
    return slow().tokens(config_.acceptance_model, observed_depth(), steps);
  }
  const CostModel& costs() const noexcept { return costs_; }
  int last_table() const noexcept { return last_table_; }
  // Whether some drafting tier could beat tier 0 at the last batch's table were every draft accepted (depth + 1
  // tokens a request against 1, at the costs as estimated there). False only once tier 0 has been timed there:
  // then no acceptance a tier-0 check could show would move the policy up, and a model drafter's checks (a
  // catch-up forward each) are cost for nothing (EAGLE at batch 8 on the Xeon, where 16 rows cost 2.1x 8).
  bool drafting_can_pay() const noexcept;

 private:
  // One non-empty verify made at the current tier (accepted drafts per
  // request; round_seconds NaN or <= 0: untimed). Returns the candidate
  // index to run next.
  std::size_t update(std::span<const int> accept_lengths, double round_seconds, bool sampled);
  // What drafts of `steps` tokens would have accepted per request, measured
  // against the tokens the requests went on to emit (deterministic drafts:
  // prompt lookup). They feed the acceptance estimates as a verify at `steps`
  // would, with no timing and no batch counted. At tier 0 they stand in for
  // its blind spot: tier 0 decides on them as any tier does, and a drafter
  // that sent one (or announced them: expect_shadows) is never probed out of
  // tier 0.
  void shadow(std::span<const int> accept_lengths, int steps);
  // A tree tier's verify, read as its chain's (the path of first children: what the chain of the tree's depth
  // would have drafted): per request, the drafts on it accepted and its depth in the tree (drafted up to there:
  // a request whose chain was cut there and accepted all of it reached no failure). Feeds the acceptance
  // estimates as a verify at that chain would, with no timing and no batch counted, so that the chains (and
  // the trees, predicted from them) follow the workload while a tree runs. Ignored off a tree tier.
  void tree_chain(std::span<const int> accept_lengths, std::span<const int> depths);
  // A chain tier's check one draft past it, per request of the round: 1 or 0 for a request that accepted
  // every draft and whose next draft (what the chain one step deeper would have drafted) the emitted bonus
  // token accepted or rejected, -1 for one not checked. Feeds that position's rates alone
  // (AcceptanceEstimate::observe_position); once checks came at the current tier (and no sampled round since:
  // drafters check greedy rounds only), its decisions price the deeper tiers with that position's own rate, not
  // the deepest verified one standing in for it (greedy acceptance rises along a draft: 0.69 / 0.71 / 0.93 at
  // positions 1-3 on EAGLE's greedy tuning workload). Ignored at tier 0 and at tree tiers.
  void deep_checks(std::span<const int> outcomes);
  // A plain decode the worker ran in place of the current drafting tier
  // (NGRAM: no request had a match): a tier-0 round, so it times tier 0
  // beside the running tier (no acceptance, no batch counted, the level
  // untouched). Ignored at tier 0 (it times itself) and without tier 0 among
  // the candidates.
  void plain_round(int batch_size, double round_seconds, bool sampled) noexcept;
  int current_tier() const noexcept { return candidates_[index_]; }
  // Expected tokens per round at candidate j: a chain's from `estimate`; a tree's its chain's plus the part of
  // the chain's shortfall (depth + 1 tokens at most, less the chain's) that the tree recovers in rounds of the
  // last round's kind. A shortfall fraction, not a ratio to the chain: where the chain accepts nearly all, a
  // tree of that depth cannot add much, however much it added where acceptance was low.
  // `first` >= 0: with the first draft's rate set to it (decide()'s noise margin).
  double predicted(const AcceptanceEstimate& estimate, std::size_t j, double first = -1.0) const noexcept {
    const double chain = estimate.tokens_with_first(config_.acceptance_model, observed_depth(), depth_[j], first);
    if (!tree_[j]) return chain;
    const bool sampled = last_table_ >= CostModel::kNumBuckets;  // the last round's kind
    return chain + recovered_[recovered_slot(sampled, j)] * std::max(0.0, depth_[j] + 1.0 - chain);
  }
  // A tree's recovered fraction is kept per kind of round: sampled rounds accept a law-drawn tree's siblings
  // by recursive rejection, greedy rounds only an argmax child, so what a tree recovers in one kind says little
  // of the other (a sampled phase's gain carried into a greedy one priced a tree above chains it only matched).
  std::size_t recovered_slot(bool sampled, std::size_t j) const noexcept {
    return (sampled ? candidates_.size() : 0) + j;
  }
  // The deepest draft position the estimates saw lately: the current tier's (one more once checks past a
  // chain came there), or at tier 0 that of its shadow observations.
  int observed_depth() const noexcept {
    return current_tier() > 0 ? depth_[index_] + (checked_past_ ? 1 : 0) : shadow_depth_;
  }
  // Whether tier 0 saw shadow observations since the last decision.
  bool shadowed() const noexcept { return current_tier() == 0 && shadow_fresh_; }
  // The goodput a decision from the current tier credits candidate j with: tier 0's discounted by
  // blind_zero_margin from a drafting tier while the drafter is blind there.
  double credited(std::size_t j, double goodput) const noexcept;
  // A verify's acceptance (or a tree's gain) and its cost.
  void learn_verify(std::span<const int> accept_lengths, double round_seconds, bool sampled);
  // Both acceptance estimates take a verify's (or shadow's) accepted lengths at `steps`; `drafted` (empty: all
  // `steps`) cuts a request's drafts shorter.
  // `own`: the current tier's verify (not shadows), which the collapse test watches.
  void observe_acceptance(std::span<const int> accept_lengths, int steps, std::span<const int> drafted = {},
                          bool own = true);
  // A tree tier's verify: its tokens per round against its chain's prediction move its gain (the chain
  // estimates learn from tree_chain(), not from this: a tree accepts more than its chain would).
  void observe_tree(std::span<const int> accept_lengths, bool sampled);
  // Moves to the best tier if its predicted goodput beats the current tier's by more than min_gain, and, with
  // with_noise, an up move by config.noise_margin times estimate_noise() more: a gain within the estimate's own
  // noise is no evidence (NGRAM's shadows at tier 0 in sampled prose, a rate near 0.2 from about 36 requests, sent
  // the policy to tier 1 and back every few tens of rounds, each visit a loss). Down moves keep their pace: a
  // margin there also lengthened the excursions it could not prevent, and held a tier after acceptance fell.
  bool decide(double min_gain, bool with_noise = true);
  // The relative goodput gain of candidate j over the current tier that one standard error of the first draft's
  // acceptance rate can make (the rate that moves the predictions most): |d ln(goodput_j / goodput_current) /
  // d rate| * sqrt(rate (1 - rate) / evidence). 0 without evidence to weigh (start-up).
  double estimate_noise(std::size_t j) const noexcept;
  // After a decision that kept a drafting tier: the neighbour tier timed
  // longest ago, if that is refresh_interval batches or more, is run for
  // probe_rounds batches, so that its cost is measured beside the current
  // tier's again; a neighbour a row-cost table prices but no round has timed
  // is probed at once, whatever its prediction. Returns whether a refresh
  // probe started.
  bool start_refresh();
  // Between decisions: the tier a phase change calls for (index_ if none).
  std::size_t phase_change_target() const noexcept;
  // The collapse test (config.collapse_evidence): a CUSUM over the first draft's outcomes at a drafting tier,
  // the decisions' rate p against p / 2. A phase change's 1.5x predicted gain on the short-memory estimate waits
  // for several batches, each a verify that fails at its first draft (NGRAM at tier 7 at the start of prose: a
  // verify costs 2.8 plain rounds, and requests with nothing to look up give no evidence). Two requests failing
  // at the first draft where p = 0.97 are evidence enough. Takes a batch's counts as observe_acceptance() made
  // them (`accepted_at[0]`: the requests that failed at the first draft), before the estimates take them in.
  void watch_first(std::size_t requests, long long successes, long long trials, const double* reached,
                   const double* accepted_at, int steps);
  // Once the test fired: the shallower tier that pays with the short-memory estimate rebuilt from the outcomes
  // since the CUSUM last stood at 0 (left in collapse_fast_); index_ if the test did not fire, or if no such tier
  // pays (the test then restarts).
  std::size_t collapse_target();
  void reset_collapse() noexcept;
  // Brings `estimate` to the collapse segment: kPhaseChangeMemory of its counts, then the segment as one batch.
  void to_segment(AcceptanceEstimate& estimate) const noexcept;
  // A move between decisions on evidence of a new phase (a phase change, a collapse): counted as a decision,
  // and the decisions' estimate keeps kPhaseChangeMemory of its counts.
  void phase_change_to(std::size_t target) noexcept;
  void move_to(std::size_t index, bool is_decision) noexcept;
  // A refresh probe of candidate ``index``: probe_rounds batches (at least one) there, then back to the current
  // tier, which decides again (update's refresh branch).
  void refresh_probe(std::size_t index) noexcept;
  // A decision for candidate ``index``, untimed in this table where a row-cost table prices it: a refresh probe
  // of it (then true); false where it was timed or no table exists.
  bool untimed_probe(std::size_t index) noexcept;
  std::uint64_t first_zero_wait() const noexcept;
  // Batches of start-up probing, fixed at the first batch (of `batch_size` requests): probe_rounds for the
  // initial tier alone (from batch 4 with tier 0) when a measured row-cost table prices the tiers and the
  // drafter's shadows (announced) show what they would accept (chains only: a tree's gain over its chain is
  // learned only by running it), else for every candidate.
  std::uint64_t startup_probe_batches(std::size_t batch_size) const noexcept;

  AdaptiveConfig config_;
  std::vector<int> candidates_;
  std::vector<int> depth_;     // per candidate: draft depth (a chain's steps)
  std::vector<char> tree_;     // per candidate: a draft tree
  // per kind of round (recovered_slot) and tree: EMA of the part of its chain's predicted shortfall its rounds
  // of that kind recovered (0 before any: its chain)
  std::vector<double> recovered_;
  std::vector<char> recovered_seen_;
  std::size_t index_;
  std::size_t initial_index_;
  std::uint64_t num_batches_ = 0;  // batches seen (all non-empty)
  // The acceptance estimates per kind of round (0 greedy, 1 sampled; kind_ the last round's): a greedy draft's
  // acceptance says little of a sampled one's (EAGLE on the transition workload: tier 3 pays on greedy code, tier 1
  // on prose sampled at T = 1), so when the traffic's kind changes the decisions start from what this kind of
  // round accepted last time, not from the other kind's rates (which held tier 1 for tens of rounds at the start
  // of each greedy phase and sent the policy to tier 4 at the start of a sampled one). A kind's estimates start
  // as a copy of the other's the first time it is seen.
  AcceptanceEstimate& slow() noexcept { return slow_[kind_]; }
  const AcceptanceEstimate& slow() const noexcept { return slow_[kind_]; }
  AcceptanceEstimate& fast() noexcept { return fast_[kind_]; }
  const AcceptanceEstimate& fast() const noexcept { return fast_[kind_]; }
  // The kind of the round being observed; a change ends the collapse test's segment, and a return to a kind seen
  // before, after a run of the other kind, asks for a decision at once (kind_returned_). No allocation.
  void set_kind(bool sampled) noexcept;
  std::array<AcceptanceEstimate, 2> slow_;  // config.ema_alpha: what decisions use
  std::array<AcceptanceEstimate, 2> fast_;  // kFastEmaWeight: detects phase changes between decisions
  int kind_ = 0;
  std::array<bool, 2> kind_seen_{};
  std::uint64_t kind_rounds_ = 0;  // rounds of kind_ since it last changed
  // A kind seen before came back after at least kKindRunRounds rounds of the other: its own estimate from its last
  // run is this phase's best prior, so the next batch decides on it (as fresh as a shadow at tier 0) instead of
  // waiting for a decision batch, a shadow or a 1.5x phase change (NGRAM at tier 0 stayed 7-9 rounds there at the
  // start of each 47-round greedy phase of the transition, its greedy estimate saying tier 7 pays 2.4x). Cleared
  // by any decision.
  bool kind_returned_ = false;
  AcceptanceEstimate collapse_fast_;  // scratch for collapse_target(): fast_ rebuilt from the segment
  double collapse_llr_ = 0.0;           // the CUSUM (nats)
  // the segment (the requests since the CUSUM last stood at 0) as one batch for AcceptanceEstimate::observe()
  std::size_t segment_requests_ = 0;
  long long segment_successes_ = 0;
  long long segment_trials_ = 0;
  int segment_steps_ = 0;
  std::vector<double> segment_counts_;  // 2 * (kMaxSteps + 1): reached, accepted_at
  CostModel costs_;
  std::size_t phase_change_tier_;            // where the last batches pointed
  std::uint64_t phase_change_requests_ = 0;  // requests in those batches
  std::uint64_t shadow_requests_ = 0;        // shadow observations since the last update (tier 0's evidence)
  mutable std::vector<double> scratch_;      // candidates_.size(): costs
  std::vector<double> surcharge_;            // candidates_.size(): set_tier_surcharges()
  // scratch_ = estimate_costs(last_table_)
  void estimate_costs() const noexcept { estimate_costs(last_table_, scratch_.data()); }
  int last_table_ = 0;
  bool deciding_probe_ = false;          // the refresh probe running is a decision's, of an untimed tier
  std::uint64_t probe_batches_ = 0;      // start-up probing: startup_probe_batches(), set at the first batch
  std::uint64_t batches_on_tier_ = 0;    // since the last switch
  std::uint64_t zero_wait_;              // batches at tier 0 before a probe
  int zero_probe_left_ = 0;              // batches left in a probe out of 0
  int refresh_left_ = 0;                 // batches left in a refresh probe of a neighbour tier
  std::size_t refresh_from_ = 0;         // the tier a refresh probe left
  std::vector<double> position_scratch_;  // per-batch counts
  int shadow_depth_ = 0;                  // steps of the last shadow observations
  bool shadow_fresh_ = false;             // shadow observations since the last decision
  bool shadow_seen_ = false;              // shadows announced or seen: the drafter is not blind at tier 0
  bool checked_past_ = false;             // deep_checks() observed since the move and the last sampled round
  // oscillation guard: an up move followed at once by a down move is a
  // bounce; each bounce in a row doubles how many decisions refuse up moves.
  std::uint64_t decisions_ = 0;
  std::uint64_t last_switch_decision_ = 0;
  bool last_switch_up_ = false;
  int bounces_ = 0;
  std::uint64_t up_blocked_until_ = 0;  // decision count
};

}  // namespace specswap
