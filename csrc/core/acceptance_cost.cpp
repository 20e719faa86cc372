#include "core/acceptance_cost.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace specswap {
namespace {

constexpr double kPriorAlpha = 0.5;  // before any draft was verified
// Slow spells (docs/policy.md): on a shared CPU every round can run several
// times slower for tens of rounds at a time. A round at kSpellRatio of its
// tier's cost is suspect, kSpellRounds of them start a spell, a round under
// kSpellEnd ends it.
constexpr int kSpellRounds = 3;
constexpr double kSpellRatio = 1.6;
constexpr double kSpellEnd = 1.3;

}  // namespace

double expected_tokens(double alpha, int steps) noexcept {
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

// ---- acceptance -------------------------------------------------------------

AcceptanceEstimate::AcceptanceEstimate(double weight, bool per_request, bool forget_unreached)
    : weight(weight),
      per_request(per_request),
      forget_unreached(forget_unreached),
      position_successes(AdaptiveConfig::kMaxSteps + 1, 0.0),
      position_trials(AdaptiveConfig::kMaxSteps + 1, 0.0) {}

double AcceptanceEstimate::alpha() const noexcept {
  // Both EMAs start at 0 and decay alike, so their ratio needs no bias
  // correction: after one batch it is that batch's successes / trials.
  if (!(trials > 0.0)) return kPriorAlpha;
  return successes / trials;
}

double AcceptanceEstimate::at(int position) const noexcept {
  // Shrunk toward the pooled alpha by one pseudo-trial, so a position reached
  // by few requests does not swing the estimate.
  return (position_successes[position] + alpha()) / (position_trials[position] + 1.0);
}

void AcceptanceEstimate::forget(double fraction) noexcept {
  successes *= fraction;
  trials *= fraction;
  for (double& count : position_successes) count *= fraction;
  for (double& count : position_trials) count *= fraction;
}

void AcceptanceEstimate::observe(std::size_t requests, long long batch_successes, long long batch_trials,
                                 const double* reached, const double* accepted_at, int steps) noexcept {
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

void AcceptanceEstimate::observe_position(int position, std::size_t requests, std::size_t accepted) noexcept {
  if (requests == 0 || position < 1 || position > AdaptiveConfig::kMaxSteps) return;
  const double keep = per_request ? std::pow(1.0 - weight, static_cast<double>(requests) / kRequestsPerWeight)
                                  : 1.0 - weight;
  position_successes[position] = keep * position_successes[position] + weight * static_cast<double>(accepted);
  position_trials[position] = keep * position_trials[position] + weight * static_cast<double>(requests);
}

double AcceptanceEstimate::tokens(AcceptanceModel model, int depth, int steps) const noexcept {
  return tokens_with_first(model, depth, steps, -1.0);
}

double AcceptanceEstimate::tokens_with_first(AcceptanceModel model, int depth, int steps,
                                             double first) const noexcept {
  if (model == AcceptanceModel::kGeometric) return expected_tokens(first < 0.0 ? alpha() : first, steps);
  // positional: observed hazards up to the current tier (fresh), the deepest
  // of them beyond it; the pooled alpha where nothing was observed.
  double tokens = 1.0;
  double survive = 1.0;
  double hazard = alpha();
  for (int i = 1; i <= steps; ++i) {
    if (i <= depth && position_trials[i] > 0.0) hazard = at(i);
    if (i == 1 && first >= 0.0) hazard = first;
    survive *= hazard;
    tokens += survive;
  }
  return tokens;
}

bool AcceptanceEstimate::first_position_read(AcceptanceModel model, int depth) const noexcept {
  return model == AcceptanceModel::kPositional && depth >= 1 && position_trials[1] > 0.0;
}

double AcceptanceEstimate::first_rate(AcceptanceModel model, int depth) const noexcept {
  return first_position_read(model, depth) ? at(1) : alpha();
}

double AcceptanceEstimate::first_evidence(AcceptanceModel model, int depth) const noexcept {
  // Each request's trial enters with `weight` and ages by r = (1 - weight)^(1/4) per later request
  // (per_request), so count / weight sums r^age, 1 / (1 - r) at steady state, and the effective sample size
  // (sum of weights)^2 / sum of squares is (1 + r) / (1 - r) = 2 * count / weight - 1: about 36 requests at
  // weight 0.2. Early (few requests, nearly equal weights) this counts up to twice the requests seen.
  const double count = (first_position_read(model, depth) ? position_trials[1] : trials) / weight;
  return count > 0.0 ? std::max(0.0, 2.0 * count - 1.0) : 0.0;
}

// ---- row costs --------------------------------------------------------------

RowCosts::RowCosts(std::vector<int> rows, std::vector<double> costs) : rows_(std::move(rows)), costs_(std::move(costs)) {
  if (rows_.size() != costs_.size()) {
    throw std::invalid_argument("row costs: " + std::to_string(rows_.size()) + " row counts but " +
                                std::to_string(costs_.size()) + " costs");
  }
  if (rows_.size() < 2 || rows_[0] != 1) {
    throw std::invalid_argument("row costs need at least two row counts, the first 1 (a forward of one row)");
  }
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    if (i > 0 && rows_[i] <= rows_[i - 1]) {
      throw std::invalid_argument("row costs: row counts must be strictly increasing, got " +
                                  std::to_string(rows_[i - 1]) + " then " + std::to_string(rows_[i]));
    }
    if (!std::isfinite(costs_[i]) || !(costs_[i] > 0.0)) {
      throw std::invalid_argument("row costs: the cost at " + std::to_string(rows_[i]) +
                                  " rows must be a finite number > 0, got " + format_number(costs_[i]));
    }
  }
  const double one = costs_[0];
  for (double& cost : costs_) cost /= one;
}

double RowCosts::at(int rows) const noexcept {
  if (rows_.empty()) return 1.0;
  if (rows <= rows_.front()) return costs_.front();
  const std::size_t n = rows_.size();
  std::size_t hi = 1;
  while (hi + 1 < n && rows_[hi] < rows) ++hi;  // the segment [hi - 1, hi] holding rows, or the last one
  const double x0 = rows_[hi - 1], x1 = rows_[hi];
  const double y0 = costs_[hi - 1], y1 = costs_[hi];
  // beyond the last count: along the last segment, never below its end
  const double slope = rows > rows_.back() ? std::max(0.0, (y1 - y0) / (x1 - x0)) : (y1 - y0) / (x1 - x0);
  if (rows > rows_.back()) return y1 + slope * (rows - x1);
  return y0 + slope * (rows - x0);
}

// ---- costs ------------------------------------------------------------------

CostModel::CostModel(const std::vector<int>& candidates, const AdaptiveConfig& config)
    : candidates_(candidates),
      ema_alpha_(config.ema_alpha),
      stale_after_(2 * static_cast<std::uint64_t>(config.update_interval)),
      prior_slope_(config.cost_prior_slope),
      cost_ema_(kNumTables * candidates.size(), std::numeric_limits<double>::quiet_NaN()),
      timed_at_(cost_ema_.size(), 0),
      run_(cost_ema_.size(), 0),
      level_at_(cost_ema_.size(), 1.0),
      level_(kNumTables, 1.0),
      last_index_(kNumTables, -1),
      rounds_in_a_row_(kNumTables, 0) {}

void CostModel::set_prior(std::vector<double> prior) {
  if (!prior.empty() && prior.size() != candidates_.size()) {
    throw std::invalid_argument("cost prior: " + std::to_string(prior.size()) + " values for " +
                                std::to_string(candidates_.size()) + " candidates");
  }
  for (double value : prior) {
    if (!std::isfinite(value) || !(value > 0.0)) throw std::invalid_argument("cost prior: values must be > 0");
  }
  prior_ = std::move(prior);
}

int CostModel::bucket_of(int batch_size) noexcept {
  if (batch_size <= 1) return 0;
  const int bucket = static_cast<int>(std::bit_width(static_cast<unsigned>(batch_size))) - 1;
  return std::min(bucket, kNumBuckets - 1);
}

int CostModel::table_of(int batch_size, bool sampled) noexcept {
  return (sampled ? kNumBuckets : 0) + bucket_of(batch_size);
}

void CostModel::learn(int table, std::size_t index, double seconds, std::uint64_t batch, bool probing) noexcept {
  const std::size_t slot = table * candidates_.size() + index;
  double before = 0.0;
  if (!absorb(table, slot, seconds, batch, probing, &before)) return;
  const int tier = static_cast<int>(index);
  rounds_in_a_row_[table] = last_index_[table] == tier ? rounds_in_a_row_[table] + 1 : 1;
  last_index_[table] = tier;
  // A settled tier's cost moves with the machine's speed, and the level with it.
  if (!probing && rounds_in_a_row_[table] > kSettleRounds && before > 0.0) {
    level_[table] *= cost_ema_[slot] / before;
    level_at_[slot] = level_[table];
  }
}

void CostModel::learn_beside(int table, std::size_t index, double seconds, std::uint64_t batch) noexcept {
  double before = 0.0;
  absorb(table, table * candidates_.size() + index, seconds, batch, /*probing=*/false, &before);
}

bool CostModel::absorb(int table, std::size_t slot, double seconds, std::uint64_t batch, bool probing,
                       double* before) noexcept {
  double& cost = cost_ema_[slot];
  // Bring the slot to the table's level before anything compares with it.
  if (!std::isnan(cost)) cost *= level_[table] / level_at_[slot];
  level_at_[slot] = level_[table];
  if (slow_spell(slot, seconds)) return false;
  *before = cost;
  // A running mean over this run of samples that turns into the EMA. A
  // tier not timed for two decision intervals starts a new run: its old
  // cost, measured under another load or in another phase, then counts as
  // one sample against the fresh ones instead of outweighing them.
  if (batch > timed_at_[slot] + stale_after_) run_[slot] = 0;
  timed_at_[slot] = batch;
  if (std::isnan(cost)) {
    cost = seconds / spell_level_;  // first timed in a spell: as it would be outside it
    run_[slot] = 0;                 // the first sample stands as the old value would
  } else if (probing) {
    // Start-up probes: the fastest of a tier's probe rounds. The first
    // rounds of a new engine run cold (graph buffers, allocator) and are
    // never faster than warm ones; a tier priced by a cold round looks dear
    // and is hardly visited again.
    cost = std::min(cost, seconds);
  } else {
    const double run = static_cast<double>(++run_[slot]);
    const double w = std::max(ema_alpha_, 1.0 / (run + 1.0));
    cost = (1.0 - w) * cost + w * seconds;
  }
  return true;
}

double CostModel::cost_now(int table, std::size_t index) const noexcept {
  const std::size_t slot = table * candidates_.size() + index;
  return cost_ema_[slot] * (level_[table] / level_at_[slot]);
}

bool CostModel::slow_spell(std::size_t slot, double seconds) noexcept {
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
  const double sigma = std::sqrt(noise_);
  if (spell_level_ > 1.0) {
    if (ratio >= std::max(kSpellEnd, std::exp(2.0 * sigma))) return true;
    spell_level_ = 1.0;
    return false;
  }
  if (ratio < std::max(kSpellRatio, std::exp(3.0 * sigma))) {
    suspects_ = 0;
    const double deviation = std::log(ratio);
    noise_ = (1.0 - ema_alpha_) * noise_ + ema_alpha_ * deviation * deviation;
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

bool CostModel::fit(int table, double* intercept, double* slope, std::size_t skip) const noexcept {
  // Least squares cost = intercept + slope * k through the measured tiers.
  const std::size_t n = candidates_.size();
  double count = 0.0, sum_k = 0.0, sum_c = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double cost = cost_now(table, j);
    if (std::isnan(cost) || j == skip) continue;
    count += 1.0;
    sum_k += candidates_[j];
    sum_c += cost;
  }
  if (count < 2.0) return false;
  const double mean_k = sum_k / count, mean_c = sum_c / count;
  double sxy = 0.0, sxx = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double cost = cost_now(table, j);
    if (std::isnan(cost) || j == skip) continue;
    sxy += (candidates_[j] - mean_k) * (cost - mean_c);
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

double CostModel::line_cost(int table, std::size_t index) const noexcept {
  double a = 0.0, s = 0.0;
  if (!fit(table, &a, &s, index)) return std::numeric_limits<double>::quiet_NaN();
  return a + s * candidates_[index];
}

int CostModel::measured_in(int table) const noexcept {
  const std::size_t n = candidates_.size();
  int count = 0;
  for (std::size_t j = 0; j < n; ++j) count += !std::isnan(cost_ema_[table * n + j]);
  return count;
}

void CostModel::estimate(int table, double* out) const noexcept {
  const std::size_t n = candidates_.size();
  // Neighbours are other batch buckets of the same kind of round: sampled
  // rounds pay per verified position for the distributions, so their cost
  // grows faster with k and their table is no guide for greedy rounds.
  const int first = table - table % kNumBuckets;
  const int bucket = table - first;
  if (measured_in(table) == 0) {
    // Another batch size's table, nearest first (only ratios matter), else
    // the prior: a round costs 1 + cost_prior_slope * k, or from the row
    // costs (set_prior).
    for (int d = 1; d < kNumBuckets; ++d) {
      for (int b : {bucket - d, bucket + d}) {
        if (b >= 0 && b < kNumBuckets && measured_in(first + b) > 0) {
          estimate(first + b, out);
          return;
        }
      }
    }
    for (std::size_t j = 0; j < n; ++j) out[j] = prior(j);
    return;
  }
  double a = 0.0, s = 0.0;
  if (!fit(table, &a, &s)) {
    // One tier timed here: a line through it with the relative slope of the
    // nearest bucket that has a fit, else the prior scaled through it.
    double relative = prior_slope_;
    bool fitted = false;
    for (int d = 1; d < kNumBuckets; ++d) {
      double other_a = 0.0, other_s = 0.0;
      if ((bucket - d >= 0 && fit(first + bucket - d, &other_a, &other_s)) ||
          (bucket + d < kNumBuckets && fit(first + bucket + d, &other_a, &other_s))) {
        relative = other_s / other_a;
        fitted = true;
        break;
      }
    }
    if (!fitted && !prior_.empty()) {
      // the row costs' prior (not a line in k): its shape through the timed tier
      std::size_t timed = 0;
      while (std::isnan(cost_now(table, timed))) ++timed;
      const double scale = cost_now(table, timed) / prior_[timed];
      for (std::size_t j = 0; j < n; ++j) {
        const double cost = cost_now(table, j);
        out[j] = std::isnan(cost) ? scale * prior_[j] : cost;
      }
      return;
    }
    for (std::size_t j = 0; j < n; ++j) {
      const double cost = cost_now(table, j);
      if (std::isnan(cost)) continue;
      a = cost / (1.0 + relative * candidates_[j]);
      s = a * relative;
    }
  }
  for (std::size_t j = 0; j < n; ++j) {
    const double cost = cost_now(table, j);
    out[j] = std::isnan(cost) ? a + s * candidates_[j] : cost;
  }
}

std::vector<std::vector<double>> CostModel::measured() const {
  const std::size_t n = candidates_.size();
  std::vector<std::vector<double>> out(kNumTables);
  for (int t = 0; t < kNumTables; ++t) {
    out[t].resize(n);
    for (std::size_t j = 0; j < n; ++j) out[t][j] = cost_now(t, j);
  }
  return out;
}

}  // namespace specswap
