#include "core/goodput_policy.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace specswap {
namespace {

// Predicted goodput ratio that still moves up while bounces block up moves,
// and that is acted on at once between two decisions: a gain this large is a
// new phase (acceptance jumped or collapsed), not noise for the interval to
// smooth, and waiting out the interval would spend a short high phase at the
// old tier.
constexpr double kPhaseChangeGain = 1.5;
// EMA weight of the short-memory acceptance estimate that detects a phase
// change between two decisions (the decisions use config.ema_alpha).
constexpr double kFastEmaWeight = 0.5;
// At batch size 1, requests (one per batch) that must all point at the same
// tier before a phase change is acted on: two lucky requests in a row are not
// a phase. A batch of 2 or more shows a phase change in every request and is
// acted on at once: waiting there keeps each high phase longer at the old tier.
// At tier 0 the requests counted are those whose shadow observations arrived.
constexpr std::uint64_t kPhaseChangeRequests = 6;
// Rounds of one kind (greedy, sampled) after which a return to the other kind, seen before, is a phase of its own
// (kind_returned_): mixed traffic whose batches flip between the kinds round by round decides on its schedule.
constexpr std::uint64_t kKindRunRounds = 20;
// A refresh probe goes to a neighbour tier only when its predicted goodput is
// within this fraction of the current tier's, with its cost or the line
// through the other tiers, whichever is lower: a tier predicted far worse
// either way would need its cost that far off to win, and its probe rounds
// would cost more.
constexpr double kRefreshGap = 0.15;
// The first batch size from which start-up probing also times tier 0 (startup_probe_batches).
constexpr std::size_t kProbeZeroBatch = 4;
// A tree round teaches its recovered fraction only where its chain is predicted
// to fall short of depth + 1 tokens by at least this much (tokens per round):
// below it the fraction is noise over a near-zero denominator.
constexpr double kMinShortfall = 0.05;
// What a phase change acted on leaves of the decisions' acceptance memory: the old phase's rates would
// otherwise outweigh the new one's for tens of requests, and the next decisions would take the move back
// (a high phase's rates holding tier 1 in a low phase where tier 0 pays, or a low phase's pulling a
// phase-change move to 7 back down). The rounds after the move then teach the new rates within a decision.
constexpr double kPhaseChangeMemory = 0.05;

// The collapse test's clamp on the decisions' first-draft rate: at 0.98 one failure weighs log(0.51 / 0.02) = 3.2
// nats, so one alone never reaches a threshold above that, and a rate read as 1 does not make it infinite.
constexpr double kCollapseRateLimit = 0.98;

std::vector<int> depths_of(const std::vector<int>& keys) {
  std::vector<int> out;
  for (int key : keys) out.push_back(tier_shape(key)[0]);
  return out;
}

// The cost model's x: verified drafts (a chain's steps; a tree's nodes).
std::vector<int> widths_of(const std::vector<int>& keys) {
  std::vector<int> out;
  for (int key : keys) out.push_back(tier_width(key));
  return out;
}

// One estimate for each kind of round (greedy, sampled), both starting as `estimate`.
std::array<AcceptanceEstimate, 2> per_kind(const AcceptanceEstimate& estimate) { return {estimate, estimate}; }

}  // namespace

GoodputPolicy::GoodputPolicy(const AdaptiveConfig& config, std::vector<int> candidates, std::size_t initial_index)
    : config_(config),
      candidates_(std::move(candidates)),
      depth_(depths_of(candidates_)),
      tree_(candidates_.size(), 0),
      recovered_(2 * candidates_.size(), 0.0),
      recovered_seen_(2 * candidates_.size(), 0),
      index_(initial_index),
      initial_index_(initial_index),
      slow_(per_kind(AcceptanceEstimate(config.ema_alpha, /*per_request=*/true, /*forget_unreached=*/false))),
      fast_(per_kind(AcceptanceEstimate(std::max(config.ema_alpha, kFastEmaWeight), /*per_request=*/false,
                                        /*forget_unreached=*/true))),
      collapse_fast_(fast_[0]),
      segment_counts_(2 * (AdaptiveConfig::kMaxSteps + 1), 0.0),
      costs_(widths_of(candidates_), config),
      phase_change_tier_(initial_index),
      scratch_(candidates_.size(), 0.0),
      surcharge_(candidates_.size(), 0.0),
      zero_wait_(first_zero_wait()),
      position_scratch_(2 * (AdaptiveConfig::kMaxSteps + 1), 0.0) {
  for (std::size_t j = 0; j < candidates_.size(); ++j) tree_[j] = is_tree_key(candidates_[j]);
}

void GoodputPolicy::set_row_costs(const RowCosts& row_costs) {
  std::vector<double> prior;
  if (!row_costs.empty()) {
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      const TierShape shape = tier_shape(candidates_[j]);  // a chain's rows: steps + 1; a tree's: its nodes
      prior.push_back(config_.cost_prior_slope * shape[0] + row_costs.at(shape[2]));
    }
  }
  costs_.set_prior(std::move(prior));
}

std::uint64_t GoodputPolicy::first_zero_wait() const noexcept {
  return static_cast<std::uint64_t>(std::min(2 * config_.update_interval, config_.probe_interval));
}

std::uint64_t GoodputPolicy::startup_probe_batches(std::size_t batch_size) const noexcept {
  const bool trees = std::any_of(tree_.begin(), tree_.end(), [](char tree) { return tree != 0; });
  std::uint64_t tiers = candidates_.size();
  if (shadow_seen_ && costs_.has_prior() && !trees) {
    // The initial tier; from batch kProbeZeroBatch also tier 0 (candidate 0, the next in the probe order) where
    // it is a candidate: the row-cost table is measured at batch 1 up to 8 rows, so there it prices the tiers
    // against a plain decode far too cheaply (batch 8, EAGLE tier 3: 1.13x a plain decode by the table, 4.1x
    // timed), and without a timed plain decode the initial tier's own cost cannot tell whether drafting pays.
    tiers = batch_size >= kProbeZeroBatch && initial_index_ != 0 && candidates_.front() == 0 ? 2 : 1;
  }
  return static_cast<std::uint64_t>(config_.probe_rounds) * tiers;
}

std::size_t GoodputPolicy::observe(const RoundObservation& round, const PolicyState& /*state*/) {
  if (round.has_verify() || round.plain_requests > 0) set_kind(round.sampled);  // shadows alone: no kind of their own
  shadow(round.shadow_accept_lengths, round.shadow_steps);
  plain_round(round.plain_requests, round.round_seconds, round.sampled);
  tree_chain(round.chain_accept_lengths, round.chain_depths);
  deep_checks(round.deep_checks);
  return round.has_verify() ? update(round.accept_lengths, round.round_seconds, round.sampled) : index_;
}

std::size_t GoodputPolicy::update(std::span<const int> accept_lengths, double round_seconds, bool sampled) {
  if (++num_batches_ == 1) probe_batches_ = startup_probe_batches(accept_lengths.size());
  const auto warmup = static_cast<std::uint64_t>(config_.warmup_batches);
  const auto interval = static_cast<std::uint64_t>(config_.update_interval);
  const std::size_t before = index_;
  const std::uint64_t shadowed_requests = std::exchange(shadow_requests_, 0);

  learn_verify(accept_lengths, round_seconds, sampled);
  ++batches_on_tier_;
  if (num_batches_ <= probe_batches_) {
    // Start-up probing: the initial tier first, then the others ascending,
    // probe_rounds batches each; decide as soon as every probed tier was timed.
    if (num_batches_ < probe_batches_) {
      const std::size_t slot = static_cast<std::size_t>(num_batches_ / config_.probe_rounds);
      const std::size_t next = slot == 0 ? initial_index_ : (slot - 1 < initial_index_ ? slot - 1 : slot);
      move_to(next, /*is_decision=*/false);
    } else {
      // Probing may end at tier 0: the estimate is the probed tiers' of just now, not the one tier 0 came down
      // with, so decide() may move up on it.
      shadow_fresh_ = true;
      decide(/*min_gain=*/0.0, /*with_noise=*/false);
    }
    return index_;
  }
  if (zero_probe_left_ > 0) {
    // The end of a probe out of tier 0: decide at once. Back to 0 again
    // doubles the wait before the next probe (up to probe_interval).
    if (--zero_probe_left_ > 0) return index_;
    decide(config_.min_gain);
    zero_wait_ = current_tier() == 0 ? std::min<std::uint64_t>(2 * zero_wait_, config_.probe_interval)
                                      : first_zero_wait();
    return index_;
  }
  if (refresh_left_ > 0) {
    // The end of a refresh probe: back to the tier it left, then decide
    // from there, so the probe itself does not tilt the decision.
    if (--refresh_left_ > 0) return index_;
    move_to(refresh_from_, /*is_decision=*/false);
    // A decision's probe of an untimed tier: its verifies are fresh evidence, as tier 0's shadows would be.
    if (std::exchange(deciding_probe_, false)) shadow_fresh_ = true;
    decide(config_.min_gain);
    return index_;
  }
  if (current_tier() == 0 && !shadow_seen_ && batches_on_tier_ >= zero_wait_) {
    // Tier 0 verifies no drafts, so alpha is frozen there for a blind drafter: try the best
    // speculative tier for probe_rounds batches (at least one). A drafter that sends shadows is not
    // blind there: rounds without them are rounds it had nothing to check, where a drafting tier
    // would have gained nothing either.
    estimate_costs();
    std::size_t best = index_;
    double best_goodput = -1.0;
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      if (candidates_[j] == 0) continue;
      const double goodput = predicted(slow(), j) / scratch_[j];
      if (goodput > best_goodput) best_goodput = goodput, best = j;
    }
    move_to(best, /*is_decision=*/false);
    zero_probe_left_ = std::max(1, config_.probe_rounds);
    return index_;
  }
  if (num_batches_ <= warmup) return index_;
  // A kind seen before is back (kind_returned_): this batch is a decision on its own estimate, as fresh as a
  // shadow, before any collapse test.
  const bool returned = kind_returned_;
  if (returned) shadow_fresh_ = true;
  // The collapse test acts on any batch, a decision's included: it weighs evidence the decision's estimate has
  // hardly taken in yet.
  const std::size_t collapse = returned ? index_ : collapse_target();
  if (collapse != index_) {
    fast() = collapse_fast_;
    phase_change_to(collapse);
  } else if (!returned && (num_batches_ - warmup) % interval != 0) {
    // Between decisions only a phase change moves the tier (tier 0 observes
    // no acceptance unless shadowed: its probes above handle it).
    if (current_tier() == 0 && !shadowed()) return index_;
    const std::size_t target = phase_change_target();
    if (target != phase_change_tier_) phase_change_tier_ = target, phase_change_requests_ = 0;
    if (target == index_) return index_;
    // The evidence is the requests that observed: at tier 0 the shadowed ones (a lookup checked now and
    // then), not the batch; one lucky lookup beside unchecked requests is not a phase.
    const std::uint64_t evidence = current_tier() == 0 ? shadowed_requests : accept_lengths.size();
    phase_change_requests_ += evidence;
    if (evidence < 2 && phase_change_requests_ < kPhaseChangeRequests) return index_;
    phase_change_to(target);
  } else if (!decide(config_.min_gain)) {
    start_refresh();
  }
  if (index_ != before && current_tier() == 0) zero_wait_ = first_zero_wait();
  return index_;
}

void GoodputPolicy::set_kind(bool sampled) noexcept {
  const int kind = sampled ? 1 : 0;
  const bool first = !kind_seen_[kind];
  if (first) {  // its first rounds: the current kind's rates until its own come in (same sizes)
    kind_seen_[kind] = true;
    slow_[kind] = slow_[kind_];  // the very first round: itself, or an unused estimate as empty as its own
    fast_[kind] = fast_[kind_];
  }
  if (kind == kind_) {
    ++kind_rounds_;
    return;
  }
  kind_returned_ = !first && kind_rounds_ >= kKindRunRounds;
  kind_rounds_ = 1;
  kind_ = kind;
  phase_change_tier_ = index_;
  phase_change_requests_ = 0;
  reset_collapse();  // its segment was the other kind's rounds
}

void GoodputPolicy::observe_acceptance(std::span<const int> accept_lengths, int steps,
                                       std::span<const int> drafted, bool own) {
  // Truncated geometric observations: a of k drafts accepted is a successes,
  // plus one failure when the run stopped before k. Per draft position i:
  // reached (a trial) by requests with a >= i - 1 that drafted i, accepted by
  // those with a >= i.
  long long successes = 0;
  long long trials = 0;
  std::fill(position_scratch_.begin(), position_scratch_.begin() + 2 * (steps + 1), 0.0);
  double* reached = position_scratch_.data();
  double* accepted_at = reached + (steps + 1);
  for (std::size_t r = 0; r < accept_lengths.size(); ++r) {
    const int k = drafted.empty() ? steps : std::clamp(drafted[r], 0, steps);
    const int a = std::clamp(accept_lengths[r], 0, k);
    successes += a;
    trials += a + (a < k ? 1 : 0);
    if (k > 0) {
      reached[std::min(a + 1, k)] += 1.0;  // reached 1..min(a+1,k): counted as a suffix later
      accepted_at[a] += 1.0;               // accepted 1..a
    }
  }
  if (own && config_.collapse_evidence > 0.0 && steps > 0) {
    watch_first(accept_lengths.size(), successes, trials, reached, accepted_at, steps);
  }
  slow().observe(accept_lengths.size(), successes, trials, reached, accepted_at, steps);
  fast().observe(accept_lengths.size(), successes, trials, reached, accepted_at, steps);
}

void GoodputPolicy::tree_chain(std::span<const int> accept_lengths, std::span<const int> depths) {
  if (accept_lengths.empty() || !tree_[index_] || depths.size() != accept_lengths.size()) return;
  observe_acceptance(accept_lengths, depth_[index_], depths);
}

void GoodputPolicy::deep_checks(std::span<const int> outcomes) {
  if (tree_[index_] || current_tier() == 0) return;
  const int position = depth_[index_] + 1;
  if (position > AdaptiveConfig::kMaxSteps) return;
  std::size_t checked = 0, accepted = 0;
  for (int outcome : outcomes) {
    if (outcome < 0) continue;
    ++checked;
    if (outcome > 0) ++accepted;
  }
  if (checked == 0) return;
  slow().observe_position(position, checked, accepted);
  fast().observe_position(position, checked, accepted);
  checked_past_ = true;
}

void GoodputPolicy::observe_tree(std::span<const int> accept_lengths, bool sampled) {
  long long total = 0;
  for (int accepted : accept_lengths) total += accepted;
  const double n = static_cast<double>(accept_lengths.size());
  const double tokens = static_cast<double>(total) / n + 1.0;
  const double chain = slow().tokens(config_.acceptance_model, observed_depth(), depth_[index_]);
  const double shortfall = depth_[index_] + 1.0 - chain;
  if (!(shortfall > kMinShortfall)) return;  // the chain accepts (nearly) all: nothing to tell a tree by
  const double recovered = std::clamp((tokens - chain) / shortfall, -1.0, 1.0);
  // weighted per request as the acceptance estimates are (ema_alpha per 4 requests)
  const double weight = 1.0 - std::pow(1.0 - config_.ema_alpha, n / AcceptanceEstimate::kRequestsPerWeight);
  const std::size_t slot = recovered_slot(sampled, index_);
  recovered_[slot] = recovered_seen_[slot] ? (1.0 - weight) * recovered_[slot] + weight * recovered : recovered;
  recovered_seen_[slot] = 1;
}

void GoodputPolicy::learn_verify(std::span<const int> accept_lengths, double round_seconds, bool sampled) {
  if (tree_[index_]) {
    observe_tree(accept_lengths, sampled);
  } else {
    observe_acceptance(accept_lengths, depth_[index_]);  // a chain: its depth, its steps
  }
  if (sampled) checked_past_ = false;  // checks come from greedy rounds: their rate says little of sampled ones
  last_table_ = CostModel::table_of(static_cast<int>(accept_lengths.size()), sampled);
  if (std::isfinite(round_seconds) && round_seconds > 0.0) {
    costs_.learn(last_table_, index_, round_seconds, num_batches_, /*probing=*/num_batches_ <= probe_batches_);
  }
}

void GoodputPolicy::shadow(std::span<const int> accept_lengths, int steps) {
  if (accept_lengths.empty() || steps <= 0 || current_tier() > 0) return;  // a drafting tier observes itself
  shadow_depth_ = std::min(steps, AdaptiveConfig::kMaxSteps);
  shadow_requests_ += accept_lengths.size();
  observe_acceptance(accept_lengths, shadow_depth_, {}, /*own=*/false);
  shadow_fresh_ = true;
  shadow_seen_ = true;
}

bool GoodputPolicy::drafting_can_pay() const noexcept {
  const auto zero = std::find(candidates_.begin(), candidates_.end(), 0);
  if (zero == candidates_.end() || num_batches_ == 0) return true;
  const auto z = static_cast<std::size_t>(zero - candidates_.begin());
  if (costs_.timed_at(last_table_, z) == 0) return true;  // a plain decode's cost unknown here: nothing to tell by
  estimate_costs();
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    if (j != z && (depth_[j] + 1.0) * scratch_[z] > scratch_[j]) return true;
  }
  return false;
}

void GoodputPolicy::plain_round(int batch_size, double round_seconds, bool sampled) noexcept {
  if (current_tier() == 0 || batch_size <= 0 || !std::isfinite(round_seconds) || round_seconds <= 0.0) return;
  const auto zero = std::find(candidates_.begin(), candidates_.end(), 0);
  if (zero == candidates_.end()) return;
  costs_.learn_beside(CostModel::table_of(batch_size, sampled), static_cast<std::size_t>(zero - candidates_.begin()),
                      round_seconds, num_batches_);
}

double GoodputPolicy::credited(std::size_t j, double goodput) const noexcept {
  if (candidates_[j] != 0 || current_tier() == 0 || shadow_seen_) return goodput;
  return goodput / (1.0 + config_.blind_zero_margin);
}

void GoodputPolicy::set_tier_surcharges(std::span<const double> seconds) noexcept {
  for (std::size_t j = 0; j < surcharge_.size(); ++j) {
    const double value = j < seconds.size() ? seconds[j] : 0.0;
    surcharge_[j] = std::isfinite(value) && value > 0.0 ? value : 0.0;
  }
}

void GoodputPolicy::estimate_costs(int table, double* out) const noexcept {
  costs_.estimate(table, out);
  for (std::size_t j = 0; j < surcharge_.size(); ++j) out[j] += surcharge_[j];
}

std::size_t GoodputPolicy::phase_change_target() const noexcept {
  // The short-memory estimate must predict kPhaseChangeGain over the current
  // tier. (It forgets positions the recent batches did not reach, so after a
  // phase change their old rates do not hold a move back.)
  estimate_costs();
  const double fast_current = predicted(fast(), index_) / scratch_[index_];
  std::size_t best = index_;
  double best_goodput = fast_current * kPhaseChangeGain;
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    const double goodput = credited(j, predicted(fast(), j) / scratch_[j]);
    if (goodput >= best_goodput) best_goodput = goodput, best = j;
  }
  return best;
}

void GoodputPolicy::watch_first(std::size_t requests, long long successes, long long trials, const double* reached,
                                const double* accepted_at, int steps) {
  const double rate = slow().first_rate(config_.acceptance_model, observed_depth());
  const double p0 = std::clamp(rate, 1.0 - kCollapseRateLimit, kCollapseRateLimit), p1 = p0 / 2.0;
  double accepted = 0.0;
  for (int i = 1; i <= steps; ++i) accepted += accepted_at[i];
  const double llr = collapse_llr_ + accepted * std::log(p1 / p0) +
                     accepted_at[0] * std::log((1.0 - p1) / (1.0 - p0));  // accepted_at[0]: failed at the first
  if (!(llr > 0.0)) {  // back at 0: the change, if one comes, starts after this batch
    reset_collapse();
    return;
  }
  collapse_llr_ = llr;
  segment_requests_ += requests;
  segment_successes_ += successes;
  segment_trials_ += trials;
  segment_steps_ = std::max(segment_steps_, steps);
  for (int i = 0; i <= steps; ++i) {
    segment_counts_[i] += reached[i];
    segment_counts_[AdaptiveConfig::kMaxSteps + 1 + i] += accepted_at[i];
  }
}

void GoodputPolicy::reset_collapse() noexcept {
  collapse_llr_ = 0.0;
  segment_requests_ = 0;
  segment_successes_ = segment_trials_ = 0;
  segment_steps_ = 0;
  std::fill(segment_counts_.begin(), segment_counts_.end(), 0.0);
}

void GoodputPolicy::to_segment(AcceptanceEstimate& estimate) const noexcept {
  estimate.forget(kPhaseChangeMemory);
  const double* reached = segment_counts_.data();
  estimate.observe(segment_requests_, segment_successes_, segment_trials_, reached,
                   reached + (AdaptiveConfig::kMaxSteps + 1), segment_steps_);
}

void GoodputPolicy::phase_change_to(std::size_t target) noexcept {
  ++decisions_;
  if (!untimed_probe(target)) move_to(target, /*is_decision=*/true);  // untimed: probed first, as by decide()
  slow().forget(kPhaseChangeMemory);
}

bool GoodputPolicy::untimed_probe(std::size_t index) noexcept {
  if (!costs_.has_prior() || costs_.timed_at(last_table_, index) != 0) return false;
  refresh_probe(index);
  deciding_probe_ = true;
  return true;
}

std::size_t GoodputPolicy::collapse_target() {
  if (!(config_.collapse_evidence > 0.0 && collapse_llr_ >= config_.collapse_evidence)) return index_;
  collapse_fast_ = fast();  // same sizes: no allocation
  to_segment(collapse_fast_);
  estimate_costs();
  const double current = predicted(collapse_fast_, index_) / scratch_[index_];
  std::size_t best = index_;
  double best_goodput = current * (1.0 + config_.min_gain);
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    if (depth_[j] >= depth_[index_]) continue;  // the deeper positions' rates are the old phase's: down only
    const double goodput = credited(j, predicted(collapse_fast_, j) / scratch_[j]);
    if (goodput > best_goodput) best_goodput = goodput, best = j;
  }
  if (best == index_) reset_collapse();  // no shallower tier pays at the new rate: the drop does not matter here
  return best;
}

double GoodputPolicy::estimate_noise(std::size_t j) const noexcept {
  const AcceptanceModel model = config_.acceptance_model;
  const int depth = observed_depth();
  const double evidence = slow().first_evidence(model, depth);
  if (!(evidence >= 1.0)) return 0.0;
  const double rate = std::clamp(slow().first_rate(model, depth), 0.0, 1.0);
  constexpr double kStep = 0.01;
  const double low = std::max(0.0, rate - kStep), high = std::min(1.0, rate + kStep);
  // d ln(predicted tokens) / d rate of a candidate; the costs do not depend on the rate
  auto slope = [&](std::size_t k) {
    const double at = predicted(slow(), k);
    return at > 0.0 ? (predicted(slow(), k, high) - predicted(slow(), k, low)) / ((high - low) * at) : 0.0;
  };
  return std::abs(slope(j) - slope(index_)) * std::sqrt(rate * (1.0 - rate) / evidence);
}

bool GoodputPolicy::decide(double min_gain, bool with_noise) {
  ++decisions_;
  // At tier 0 a drafter that sends shadows moves up only on shadows seen since the last decision: without them
  // the estimate is what it was when the policy came down (after a phase change, the old phase's rates, which
  // took tier 0 straight back to 3 at the start of prose in the NGRAM main job), and a round without one is a
  // round where no lookup matched, where a drafting tier would have drafted nothing either.
  const bool stale_zero = current_tier() == 0 && shadow_seen_ && !shadow_fresh_;
  shadow_fresh_ = false;
  kind_returned_ = false;
  const bool allow_up = decisions_ >= up_blocked_until_;
  estimate_costs();
  const double current = predicted(slow(), index_) / scratch_[index_];
  std::size_t best = index_;
  double best_goodput = current;
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    const double goodput = credited(j, predicted(slow(), j) / scratch_[j]);
    // While up moves are blocked after bounces, only a large predicted gain
    // lifts the block: the guard is for a model that over-promised by a
    // little, not for a workload whose acceptance has changed (a new phase).
    if (!allow_up && j > index_ && !(goodput > current * kPhaseChangeGain)) continue;
    if (stale_zero && j > index_) continue;
    if (goodput > best_goodput) best_goodput = goodput, best = j;
  }
  const double margin = min_gain + (with_noise && best > index_ ? config_.noise_margin * estimate_noise(best) : 0.0);
  if (best == index_ || !(best_goodput > current * (1.0 + margin))) {
    if (allow_up && bounces_ > 0 && decisions_ > last_switch_decision_ + 2) --bounces_;
    return false;
  }
  if (untimed_probe(best)) {
    // A tier no round has timed in this table is chosen on the row-cost table's word alone, or on the line
    // through the timed ones: time it first (a refresh probe: probe_rounds batches there, back, and decide again
    // with its own cost). A noisy table that calls it cheap otherwise holds it until the next decision; tier 0
    // included: the line through tiers 3 and 4, the first two timed, put it at zero (a round's cost is convex in
    // its drafts) and held it for 7 rounds of greedy code where tier 3 paid 2.5x.
    return true;
  }
  move_to(best, /*is_decision=*/true);
  return true;
}

bool GoodputPolicy::start_refresh() {
  if (current_tier() == 0 || config_.probe_rounds <= 0 || config_.refresh_interval <= 0) return false;
  const auto wait = static_cast<std::uint64_t>(config_.refresh_interval);
  estimate_costs();
  const double current = predicted(slow(), index_) / scratch_[index_];
  std::size_t oldest = index_;
  std::uint64_t oldest_at = num_batches_;
  for (std::size_t j : {index_ - 1, index_ + 1}) {
    if (j >= candidates_.size()) continue;  // index_ - 1 wraps past 0
    const std::uint64_t at = costs_.timed_at(last_table_, j);
    // A neighbour no round has timed in this table is priced by the row-cost table's shape alone: a noisy
    // table (a non-monotone start-up measurement, another machine's) can call it far dearer than it is, and
    // nothing else would ever time it. It is probed at the first decision that keeps the tier, whatever its
    // predicted goodput.
    if (at == 0 && costs_.has_prior()) {
      oldest = j, oldest_at = 0;
      break;
    }
    if (batches_on_tier_ < wait) continue;
    // Its own cost, or the line through the other tiers where that is lower: a tier priced by one slow
    // probe far above the line is worth timing again.
    const double line = costs_.line_cost(last_table_, j);
    const double cost = std::isnan(line) ? scratch_[j] : std::min(scratch_[j], line);
    const double goodput = credited(j, predicted(slow(), j) / cost);
    if (num_batches_ - at >= wait && at < oldest_at && goodput >= current * (1.0 - kRefreshGap)) {
      oldest = j, oldest_at = at;
    }
  }
  if (oldest == index_) return false;
  refresh_probe(oldest);
  return true;
}

void GoodputPolicy::refresh_probe(std::size_t index) noexcept {
  refresh_from_ = index_;
  move_to(index, /*is_decision=*/false);
  refresh_left_ = std::max(1, config_.probe_rounds);
}

void GoodputPolicy::move_to(std::size_t index, bool is_decision) noexcept {
  if (index == index_) return;
  const bool up = index > index_;
  if (is_decision) {
    if (!up && last_switch_up_ && decisions_ <= last_switch_decision_ + 2) {
      // Up, then straight back down: the model over-promised the higher tier
      // (say acceptance falls along the draft). Refuse up moves for 2, 4, 8,
      // ... decisions while it keeps happening.
      bounces_ = std::min(bounces_ + 1, 6);
      up_blocked_until_ = decisions_ + 1 + (std::uint64_t{1} << bounces_);
    }
    last_switch_up_ = up;
    last_switch_decision_ = decisions_;
  } else {
    last_switch_up_ = false;  // a probe is not an up move to bounce from
  }
  index_ = index;
  batches_on_tier_ = 0;
  checked_past_ = false;
  phase_change_tier_ = index;
  phase_change_requests_ = 0;
  reset_collapse();
}

}  // namespace specswap
