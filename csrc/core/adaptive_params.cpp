#include "core/adaptive_params.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace specswap {
namespace {

[[noreturn]] void invalid(const std::string& key, const std::string& rule,
                          const std::string& got) {
  throw std::invalid_argument(key + " must be " + rule + ", got " + got);
}

std::vector<int> sorted_unique(std::vector<int> steps) {
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

constexpr double kPriorAlpha = 0.5;  // before any draft was verified
// Predicted goodput ratio that still moves up while bounces block up moves,
// and that is acted on at once between two decisions: a gain this large is a
// new phase (acceptance jumped or collapsed), not noise for the interval to
// smooth. Waiting out the interval there costs a short high phase ~10%.
constexpr double kPhaseChangeGain = 1.5;
// EMA weight of the short-memory acceptance estimate that detects a phase
// change between two decisions (the decisions use config.ema_alpha).
constexpr double kFastEmaWeight = 0.5;
// At batch size 1, requests (one per batch) that must all point at the same
// tier before a phase change is acted on: two lucky requests in a row are not
// a phase. A batch of 2 or more is acted on at once: on the transition
// benchmark (concurrency 2) waiting for 6 requests left each high phase a
// round or two longer at the old tier (1.04x / 1.01x the best static mode in
// one run each, against 1.08x / 1.08x acting at once).
constexpr std::uint64_t kPhaseChangeRequests = 6;
// Slow spells (docs/policy.md): a trace of Gemma EAGLE on this 2-core CPU had
// every round ~2.5x slower for ~80 rounds at a time.
constexpr int kSpellRounds = 3;
constexpr double kSpellRatio = 1.6;
constexpr double kSpellEnd = 1.3;

}  // namespace

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(int initial_steps,
                                                     AdaptiveConfig config)
    : config_(std::move(config)) {
  config_.validate();
  if (initial_steps < 0 || initial_steps > AdaptiveConfig::kMaxSteps) {
    invalid("initial_steps",
            "an integer in [0, " + std::to_string(AdaptiveConfig::kMaxSteps) + "]",
            std::to_string(initial_steps));
  }
  candidates_ = sorted_unique(config_.candidate_steps);
  if (config_.snap_initial_steps) {
    // Nearest candidate; on a tie the larger one wins.
    std::size_t best = 0;
    for (std::size_t i = 1; i < candidates_.size(); ++i) {
      if (std::abs(candidates_[i] - initial_steps) <=
          std::abs(candidates_[best] - initial_steps)) {
        best = i;
      }
    }
    index_ = best;
  } else {
    auto it = std::lower_bound(candidates_.begin(), candidates_.end(),
                               initial_steps);
    if (it == candidates_.end() || *it != initial_steps) {
      it = candidates_.insert(it, initial_steps);
    }
    index_ = static_cast<std::size_t>(it - candidates_.begin());
  }
  ema_ = static_cast<double>(current_steps() - 1);

  initial_index_ = index_;
  phase_change_tier_ = index_;
  cost_ema_.assign(kNumTables * candidates_.size(),
                   std::numeric_limits<double>::quiet_NaN());
  cost_timed_at_.assign(cost_ema_.size(), 0);
  cost_run_.assign(cost_ema_.size(), 0);
  scratch_.assign(candidates_.size(), 0.0);
  probe_batches_ = static_cast<std::uint64_t>(config_.probe_rounds) *
                   candidates_.size();
  zero_wait_ = first_zero_wait();
  for (Acceptance* estimate : {&slow_, &fast_}) {
    estimate->position_successes.assign(AdaptiveConfig::kMaxSteps + 1, 0.0);
    estimate->position_trials.assign(AdaptiveConfig::kMaxSteps + 1, 0.0);
  }
  slow_.weight = config_.ema_alpha;
  slow_.per_request = true;
  fast_.weight = std::max(config_.ema_alpha, kFastEmaWeight);
  fast_.forget_unreached = true;
  position_scratch_.assign(2 * (AdaptiveConfig::kMaxSteps + 1), 0.0);
}

std::uint64_t AdaptiveSpeculativeParams::first_zero_wait() const noexcept {
  return static_cast<std::uint64_t>(
      std::min(2 * config_.update_interval, config_.probe_interval));
}

bool AdaptiveSpeculativeParams::update(std::span<const int> accept_lengths,
                                       double round_seconds, bool sampled) {
  // Idle batches neither move the EMA nor use up warmup.
  if (accept_lengths.empty()) return false;
  long long total = 0;
  for (int accepted : accept_lengths) total += accepted;
  const double batch_mean =
      static_cast<double>(total) / static_cast<double>(accept_lengths.size());
  ema_ = (1.0 - config_.ema_alpha) * ema_ + config_.ema_alpha * batch_mean;

  ++num_batches_;
  const auto warmup = static_cast<std::uint64_t>(config_.warmup_batches);
  const auto interval = static_cast<std::uint64_t>(config_.update_interval);
  const std::size_t before = index_;

  if (config_.policy == PolicyKind::kSglang) {
    if (num_batches_ <= warmup) return false;
    if ((num_batches_ - warmup) % interval != 0) return false;
    recompute_sglang();
    return index_ != before;
  }

  update_goodput(accept_lengths, round_seconds, sampled, current_steps());
  ++batches_on_tier_;
  if (num_batches_ <= probe_batches_) {
    // Start-up probing: the initial tier first, then the others ascending,
    // probe_rounds batches each; decide as soon as every tier was timed.
    if (num_batches_ < probe_batches_) {
      const std::size_t slot =
          static_cast<std::size_t>(num_batches_ / config_.probe_rounds);
      const std::size_t next =
          slot == 0 ? initial_index_ : (slot - 1 < initial_index_ ? slot - 1 : slot);
      move_to(next, /*is_decision=*/false);
    } else {
      decide_goodput(/*min_gain=*/0.0);
    }
    return index_ != before;
  }
  if (zero_probe_left_ > 0) {
    // The end of a probe out of tier 0: decide at once. Back to 0 again
    // doubles the wait before the next probe (up to probe_interval).
    if (--zero_probe_left_ > 0) return false;
    decide_goodput(config_.min_gain);
    zero_wait_ = current_steps() == 0 ? std::min<std::uint64_t>(2 * zero_wait_, config_.probe_interval)
                                      : first_zero_wait();
    return index_ != before;
  }
  if (current_steps() == 0 && batches_on_tier_ >= zero_wait_) {
    // Tier 0 verifies no drafts, so alpha is frozen there: try the best
    // speculative tier for probe_rounds batches (at least one).
    estimate_costs(last_table_, scratch_.data());
    std::size_t best = index_;
    double best_goodput = -1.0;
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      if (candidates_[j] == 0) continue;
      const double goodput = model_tokens(slow_, candidates_[j]) / scratch_[j];
      if (goodput > best_goodput) best_goodput = goodput, best = j;
    }
    move_to(best, /*is_decision=*/false);
    zero_probe_left_ = std::max(1, config_.probe_rounds);
    return index_ != before;
  }
  if (num_batches_ <= warmup) return false;
  if ((num_batches_ - warmup) % interval != 0) {
    // Between decisions only a phase change moves the tier (tier 0 observes
    // no acceptance: its probes above handle it).
    if (current_steps() == 0) return false;
    const std::size_t target = phase_change_target();
    if (target != phase_change_tier_) phase_change_tier_ = target, phase_change_requests_ = 0;
    if (target == index_) return false;
    phase_change_requests_ += accept_lengths.size();
    if (accept_lengths.size() < 2 && phase_change_requests_ < kPhaseChangeRequests) return false;
    ++decisions_;
    move_to(target, /*is_decision=*/true);
  } else {
    decide_goodput(config_.min_gain);
  }
  if (index_ != before && current_steps() == 0) zero_wait_ = first_zero_wait();
  return index_ != before;
}

std::size_t AdaptiveSpeculativeParams::phase_change_target() const noexcept {
  // The short-memory estimate must predict kPhaseChangeGain over the current
  // tier. (It forgets positions the recent batches did not reach, so after a
  // phase change their old rates do not hold a move back.)
  estimate_costs(last_table_, scratch_.data());
  const double fast_current = model_tokens(fast_, current_steps()) / scratch_[index_];
  std::size_t best = index_;
  double best_goodput = fast_current * kPhaseChangeGain;
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    const double goodput = model_tokens(fast_, candidates_[j]) / scratch_[j];
    if (goodput >= best_goodput) best_goodput = goodput, best = j;
  }
  return best;
}

void AdaptiveSpeculativeParams::recompute_sglang() {
  // A tier of k drafts pays off once about k - 0.5 of them are accepted on
  // average; the hysteresis terms widen that band so the tier does not flap.
  while (index_ > 0 &&
         ema_ <= candidates_[index_ - 1] - 0.5 + config_.down_hysteresis) {
    --index_;
  }
  while (index_ + 1 < candidates_.size() &&
         ema_ > candidates_[index_] - 0.5 + config_.up_hysteresis) {
    ++index_;
  }
}

// ---- goodput ------------------------------------------------------------

double AdaptiveSpeculativeParams::Acceptance::alpha() const noexcept {
  // Both EMAs start at 0 and decay alike, so their ratio needs no bias
  // correction: after one batch it is that batch's successes / trials.
  if (!(trials > 0.0)) return kPriorAlpha;
  return successes / trials;
}

double AdaptiveSpeculativeParams::Acceptance::at(int position) const noexcept {
  // Shrunk toward the pooled alpha by one pseudo-trial, so a position reached
  // by few requests does not swing the estimate.
  return (position_successes[position] + alpha()) / (position_trials[position] + 1.0);
}

void AdaptiveSpeculativeParams::Acceptance::observe(std::size_t requests,
                                                    long long batch_successes,
                                                    long long batch_trials,
                                                    const double* reached,
                                                    const double* accepted_at,
                                                    int steps) noexcept {
  // Each count enters with the weight `weight`; what was there keeps 1 -
  // weight per batch, or per kRequestsPerWeight requests when per_request
  // (every request then weighs the same, whatever the size of its batch).
  const double add = weight;
  const double keep = per_request ? std::pow(1.0 - weight, static_cast<double>(requests) / kRequestsPerWeight)
                                  : 1.0 - weight;
  if (batch_trials > 0) {  // tier 0 observes nothing: alpha stays as it was
    successes = keep * successes + add * static_cast<double>(batch_successes);
    trials = keep * trials + add * static_cast<double>(batch_trials);
  }
  // suffix sums: requests reaching position i = those whose last reached
  // position is >= i. Positions nobody reached this batch keep their EMAs,
  // or, when forgetting, fade toward the pooled alpha (at() shrinks to it).
  double reach = 0.0, accept = 0.0;
  for (int i = steps; i >= 1; --i) {
    reach += reached[i];
    accept += accepted_at[i];
    if (reach > 0.0) {
      position_successes[i] = keep * position_successes[i] + add * accept;
      position_trials[i] = keep * position_trials[i] + add * reach;
    } else if (forget_unreached) {
      position_successes[i] *= keep;
      position_trials[i] *= keep;
    }
  }
  if (forget_unreached) {
    for (int i = steps + 1; i <= AdaptiveConfig::kMaxSteps; ++i) {
      position_successes[i] *= keep;
      position_trials[i] *= keep;
    }
  }
}

double AdaptiveSpeculativeParams::model_tokens(const Acceptance& estimate,
                                               int steps) const noexcept {
  if (config_.acceptance_model == AcceptanceModel::kGeometric) {
    return expected_tokens(estimate.alpha(), steps);
  }
  // positional: observed hazards up to the current tier (fresh), the deepest
  // of them beyond it; the pooled alpha where nothing was observed.
  const int depth = current_steps();
  double tokens = 1.0;
  double survive = 1.0;
  double hazard = estimate.alpha();
  for (int i = 1; i <= steps; ++i) {
    if (i <= depth && estimate.position_trials[i] > 0.0) hazard = estimate.at(i);
    survive *= hazard;
    tokens += survive;
  }
  return tokens;
}

double AdaptiveSpeculativeParams::expected_tokens(double alpha,
                                                  int steps) noexcept {
  // The bonus token always comes; draft i survives with probability alpha^i.
  // A plain sum stays exact at alpha -> 1 (where it is steps + 1).
  alpha = std::clamp(alpha, 0.0, 1.0);
  double tokens = 1.0;
  double survive = 1.0;
  for (int i = 1; i <= steps; ++i) {
    survive *= alpha;
    tokens += survive;
  }
  return tokens;
}

int AdaptiveSpeculativeParams::bucket_of(int batch_size) noexcept {
  if (batch_size <= 1) return 0;
  const int bucket =
      static_cast<int>(std::bit_width(static_cast<unsigned>(batch_size))) - 1;
  return std::min(bucket, kNumBuckets - 1);
}

void AdaptiveSpeculativeParams::update_goodput(std::span<const int> accept_lengths,
                                               double round_seconds, bool sampled,
                                               int steps) {
  // Truncated geometric observations: a of k drafts accepted is a successes,
  // plus one failure when the run stopped before k.
  long long successes = 0;
  long long trials = 0;
  for (int accepted : accept_lengths) {
    const int a = std::clamp(accepted, 0, steps);
    successes += a;
    trials += a + (a < steps ? 1 : 0);
  }
  // Per draft position i: reached (a trial) by requests with a >= i - 1 that
  // drafted i, accepted by those with a >= i.
  std::fill(position_scratch_.begin(), position_scratch_.begin() + 2 * (steps + 1), 0.0);
  double* reached = position_scratch_.data();
  double* accepted_at = reached + (steps + 1);
  if (steps > 0) {
    for (int accepted : accept_lengths) {
      const int a = std::clamp(accepted, 0, steps);
      reached[std::min(a + 1, steps)] += 1.0;  // reached 1..min(a+1,k): counted as a suffix later
      accepted_at[a] += 1.0;                   // accepted 1..a
    }
  }
  slow_.observe(accept_lengths.size(), successes, trials, reached, accepted_at, steps);
  fast_.observe(accept_lengths.size(), successes, trials, reached, accepted_at, steps);
  last_table_ = table_of(static_cast<int>(accept_lengths.size()), sampled);
  if (std::isfinite(round_seconds) && round_seconds > 0.0) {
    const std::size_t slot = last_table_ * candidates_.size() + index_;
    if (slow_spell(slot, round_seconds)) return;
    // A running mean over this run of samples that turns into the EMA. A
    // tier not timed for two decision intervals starts a new run: its old
    // cost, measured under another load or in another phase, then counts as
    // one sample against the fresh ones instead of outweighing them.
    const auto stale_after = 2 * static_cast<std::uint64_t>(config_.update_interval);
    if (num_batches_ > cost_timed_at_[slot] + stale_after) cost_run_[slot] = 0;
    cost_timed_at_[slot] = num_batches_;
    double& cost = cost_ema_[slot];
    if (std::isnan(cost)) {
      cost = round_seconds / spell_level_;  // first timed in a spell: as it would be outside it
      cost_run_[slot] = 0;  // the first sample stands as the old value would
    } else if (num_batches_ <= probe_batches_) {
      // Start-up probes: the fastest of a tier's probe rounds. The first
      // rounds of a new engine run cold (graph buffers, allocator) and are
      // never faster than warm ones; a tier priced by a cold round looked
      // dear and was hardly visited again (EAGLE, code at batch 1: 16 rounds
      // of 505 at the best tier in one benchmark run).
      cost = std::min(cost, round_seconds);
    } else {
      const double run = static_cast<double>(++cost_run_[slot]);
      const double w = std::max(config_.ema_alpha, 1.0 / (run + 1.0));
      cost = (1.0 - w) * cost + w * round_seconds;
    }
  }
}

bool AdaptiveSpeculativeParams::slow_spell(std::size_t slot, double seconds) noexcept {
  // Only ratios between tiers matter, and a load that slows every round
  // alike leaves them as they were; but the tiers timed during it would keep
  // its costs after it. So a round at kSpellRatio or more of its tier's cost
  // is not learned; kSpellRounds of them in a row start a spell, in which no
  // cost learns until a round comes in under kSpellEnd of its tier's cost
  // (a tier first timed in the spell is scaled by the spell's level). An
  // outlier that is not followed by more is dropped.
  // Both bars widen with the noise of round times (sigma: an EMA of squared
  // log deviations of the rounds learned), to 3 and 2 sigma where that is
  // more, so that plain jitter is neither dropped nor taken for a spell.
  const double reference = cost_ema_[slot];
  if (std::isnan(reference)) return false;
  const double ratio = seconds / reference;
  const double sigma = std::sqrt(cost_noise_);
  if (spell_level_ > 1.0) {
    if (ratio >= std::max(kSpellEnd, std::exp(2.0 * sigma))) return true;
    spell_level_ = 1.0;
    return false;
  }
  if (ratio < std::max(kSpellRatio, std::exp(3.0 * sigma))) {
    suspects_ = 0;
    const double deviation = std::log(ratio);
    cost_noise_ = (1.0 - config_.ema_alpha) * cost_noise_ + config_.ema_alpha * deviation * deviation;
    return false;
  }
  if (suspects_ == 0) suspect_ratios_ = 0.0;
  suspect_ratios_ += ratio;
  if (++suspects_ >= kSpellRounds) {
    spell_level_ = suspect_ratios_ / suspects_;
    suspects_ = 0;
  }
  return true;
}

bool AdaptiveSpeculativeParams::fit_table(int table, double* intercept,
                                           double* slope) const noexcept {
  // Least squares cost = intercept + slope * k through the measured tiers.
  const std::size_t n = candidates_.size();
  const double* row = cost_ema_.data() + table * n;
  double count = 0.0, sum_k = 0.0, sum_c = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    if (std::isnan(row[j])) continue;
    count += 1.0;
    sum_k += candidates_[j];
    sum_c += row[j];
  }
  if (count < 2.0) return false;
  const double mean_k = sum_k / count, mean_c = sum_c / count;
  double sxy = 0.0, sxx = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    if (std::isnan(row[j])) continue;
    sxy += (candidates_[j] - mean_k) * (row[j] - mean_c);
    sxx += (candidates_[j] - mean_k) * (candidates_[j] - mean_k);
  }
  double b = sxx > 0.0 ? std::max(0.0, sxy / sxx) : 0.0;  // more drafts never cost less
  double a = mean_c - b * mean_k;
  if (a <= 0.0) {  // keep a positive cost at k = 0, through the mean point
    a = 1e-3 * mean_c;
    b = mean_k > 0.0 ? (mean_c - a) / mean_k : 0.0;
  }
  *intercept = a;
  *slope = b;
  return true;
}

int AdaptiveSpeculativeParams::table_of(int batch_size, bool sampled) noexcept {
  return (sampled ? kNumBuckets : 0) + bucket_of(batch_size);
}

void AdaptiveSpeculativeParams::estimate_costs(int table, double* out) const noexcept {
  const std::size_t n = candidates_.size();
  // Neighbours are other batch buckets of the same kind of round: sampled
  // rounds pay per verified position for the distributions, so their cost
  // grows faster with k and their table is no guide for greedy rounds.
  const int first = table - table % kNumBuckets;
  const int bucket = table - first;
  auto measured_in = [&](int t) {
    int count = 0;
    for (std::size_t j = 0; j < n; ++j) count += !std::isnan(cost_ema_[t * n + j]);
    return count;
  };
  const int measured = measured_in(table);
  if (measured == 0) {
    // Another batch size's table, nearest first (only ratios matter), else
    // the prior: a round costs 1 + cost_prior_slope * k.
    for (int d = 1; d < kNumBuckets; ++d) {
      for (int b : {bucket - d, bucket + d}) {
        if (b >= 0 && b < kNumBuckets && measured_in(first + b) > 0) {
          estimate_costs(first + b, out);
          return;
        }
      }
    }
    for (std::size_t j = 0; j < n; ++j) out[j] = 1.0 + config_.cost_prior_slope * candidates_[j];
    return;
  }
  double a = 0.0, s = 0.0;
  if (!fit_table(table, &a, &s)) {
    // One tier timed here: a line through it with the relative slope of the
    // nearest bucket that has a fit, else with the prior slope.
    double relative = config_.cost_prior_slope;
    for (int d = 1; d < kNumBuckets; ++d) {
      double other_a = 0.0, other_s = 0.0;
      if ((bucket - d >= 0 && fit_table(first + bucket - d, &other_a, &other_s)) ||
          (bucket + d < kNumBuckets && fit_table(first + bucket + d, &other_a, &other_s))) {
        relative = other_s / other_a;
        break;
      }
    }
    for (std::size_t j = 0; j < n; ++j) {
      const double cost = cost_ema_[table * n + j];
      if (std::isnan(cost)) continue;
      a = cost / (1.0 + relative * candidates_[j]);
      s = a * relative;
    }
  }
  for (std::size_t j = 0; j < n; ++j) {
    const double cost = cost_ema_[table * n + j];
    out[j] = std::isnan(cost) ? a + s * candidates_[j] : cost;
  }
}

bool AdaptiveSpeculativeParams::decide_goodput(double min_gain) {
  ++decisions_;
  const bool allow_up = decisions_ >= up_blocked_until_;
  estimate_costs(last_table_, scratch_.data());
  const double current = model_tokens(slow_, current_steps()) / scratch_[index_];
  std::size_t best = index_;
  double best_goodput = current;
  for (std::size_t j = 0; j < candidates_.size(); ++j) {
    const double goodput = model_tokens(slow_, candidates_[j]) / scratch_[j];
    // While up moves are blocked after bounces, only a large predicted gain
    // lifts the block: the guard is for a model that over-promised by a
    // little, not for a workload whose acceptance has changed (a new phase).
    if (!allow_up && j > index_ && !(goodput > current * kPhaseChangeGain)) continue;
    if (goodput > best_goodput) best_goodput = goodput, best = j;
  }
  if (best == index_ || !(best_goodput > current * (1.0 + min_gain))) {
    if (allow_up && bounces_ > 0 && decisions_ > last_switch_decision_ + 2) --bounces_;
    return false;
  }
  move_to(best, /*is_decision=*/true);
  return true;
}

void AdaptiveSpeculativeParams::move_to(std::size_t index, bool is_decision) noexcept {
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
  phase_change_tier_ = index;
  phase_change_requests_ = 0;
}

std::vector<double> AdaptiveSpeculativeParams::cost_estimates(int batch_size,
                                                              bool sampled) const {
  std::vector<double> out(candidates_.size());
  estimate_costs(batch_size > 0 ? table_of(batch_size, sampled) : last_table_, out.data());
  return out;
}

std::vector<std::vector<double>> AdaptiveSpeculativeParams::measured_costs() const {
  const std::size_t n = candidates_.size();
  std::vector<std::vector<double>> out(kNumTables);
  for (int t = 0; t < kNumTables; ++t) {
    out[t].assign(cost_ema_.begin() + t * n, cost_ema_.begin() + (t + 1) * n);
  }
  return out;
}

}  // namespace specswap
