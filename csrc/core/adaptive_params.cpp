#include "core/adaptive_params.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>


namespace specswap {
namespace {

// Tiers in the policy's order: by verified drafts, a chain before a tree of as many nodes.
bool tier_before(int a, int b) noexcept {
  const int wa = tier_width(a), wb = tier_width(b);
  return wa != wb ? wa < wb : a < b;
}

// The validated config's candidates (the chains of candidate_steps and the
// trees of candidate_trees, by their keys, core/tier_key.h), ordered and
// unique, with the initial tier placed among them; and the index of the
// initial tier.
std::pair<std::vector<int>, std::size_t> initial_tiers(int initial_tier, const AdaptiveConfig& config) {
  config.validate();
  if (is_tree_key(initial_tier)) {
    const std::string error = tree_shape_error(tier_shape(initial_tier), AdaptiveConfig::kMaxSteps);
    if (!error.empty()) throw std::invalid_argument("initial tier " + std::to_string(initial_tier) + ": " + error);
  } else if (initial_tier < 0 || initial_tier > AdaptiveConfig::kMaxSteps) {
    throw std::invalid_argument("the initial tier must be an integer in [0, " +
                                std::to_string(AdaptiveConfig::kMaxSteps) + "] (or a tree's key), got " +
                                std::to_string(initial_tier));
  }
  std::vector<int> candidates = config.candidate_steps;
  for (const TierShape& tree : config.candidate_trees) candidates.push_back(tier_key(tree));
  std::sort(candidates.begin(), candidates.end(), tier_before);
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  if (config.snap_initial_steps) {
    // Nearest candidate by verified drafts; on a tie the larger one wins.
    std::size_t best = 0;
    const int width = tier_width(initial_tier);
    for (std::size_t i = 1; i < candidates.size(); ++i) {
      if (std::abs(tier_width(candidates[i]) - width) <= std::abs(tier_width(candidates[best]) - width)) best = i;
    }
    return {std::move(candidates), best};
  }
  auto it = std::lower_bound(candidates.begin(), candidates.end(), initial_tier, tier_before);
  if (it == candidates.end() || *it != initial_tier) it = candidates.insert(it, initial_tier);
  const auto index = static_cast<std::size_t>(it - candidates.begin());
  return {std::move(candidates), index};
}

}  // namespace

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(int initial_tier, AdaptiveConfig config,
                                                     const PolicyFactory& policy)
    : AdaptiveSpeculativeParams(config, initial_tiers(initial_tier, config), policy) {}

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(AdaptiveConfig config,
                                                     std::pair<std::vector<int>, std::size_t> tiers,
                                                     const PolicyFactory& policy)
    : config_(std::move(config)),
      candidates_(std::move(tiers.first)),
      index_(tiers.second),
      ema_(static_cast<double>(tier_shape(candidates_[index_])[0] - 1)),
      policy_(policy ? policy(config_, candidates_, index_) : make_policy(config_, candidates_, index_)) {
  if (!policy_) throw std::invalid_argument("the policy factory built no policy");
}

std::pair<std::vector<int>, std::size_t> AdaptiveSpeculativeParams::tiers_for(int initial_tier,
                                                                                    const AdaptiveConfig& config) {
  return initial_tiers(initial_tier, config);
}

bool AdaptiveSpeculativeParams::observe(const RoundObservation& round) {
  if (round.has_verify() && round.plain_requests > 0) {
    throw std::invalid_argument("a round is a verify or a plain decode in the tier's place, not both (" +
                                std::to_string(round.accept_lengths.size()) + " accept lengths and plain_requests " +
                                std::to_string(round.plain_requests) + ")");
  }
  if (round.chain_accept_lengths.size() != round.chain_depths.size()) {
    throw std::invalid_argument("chain: " + std::to_string(round.chain_accept_lengths.size()) +
                                " accept lengths but " + std::to_string(round.chain_depths.size()) +
                                " depths; give one of each per request");
  }
  const std::size_t before = index_;
  if (round.has_verify()) {
    // Idle batches neither move the EMA nor use up warmup.
    long long total = 0;
    for (int accepted : round.accept_lengths) total += accepted;
    const double batch_mean = static_cast<double>(total) / static_cast<double>(round.accept_lengths.size());
    ema_ = (1.0 - config_.ema_alpha) * ema_ + config_.ema_alpha * batch_mean;
    ++num_batches_;
  }
  const std::size_t next = policy_->observe(round, PolicyState{index_, ema_, num_batches_});
  if (next >= candidates_.size()) {
    throw std::logic_error("the policy chose candidate " + std::to_string(next) + " of " +
                           std::to_string(candidates_.size()));
  }
  if (next != before && !round.has_verify()) {
    throw std::logic_error("the policy moved to tier " + std::to_string(candidates_[next]) +
                           " on a round without a verify; a policy moves on verifies only");
  }
  index_ = next;
  return index_ != before;
}

bool AdaptiveSpeculativeParams::update(std::span<const int> accept_lengths, double round_seconds, bool sampled) {
  RoundObservation round;
  round.accept_lengths = accept_lengths;
  round.round_seconds = round_seconds;
  round.sampled = sampled;
  return observe(round);
}

void AdaptiveSpeculativeParams::set_row_costs(RowCosts row_costs) {
  policy_->set_row_costs(row_costs);
  row_costs_ = std::move(row_costs);
}

void AdaptiveSpeculativeParams::set_tier_surcharges(std::span<const double> seconds) {
  if (seconds.size() != candidates_.size()) {
    throw std::invalid_argument("set_tier_surcharges: " + std::to_string(seconds.size()) + " values for " +
                                std::to_string(candidates_.size()) + " candidate tiers");
  }
  policy_->set_tier_surcharges(seconds);
}

std::vector<double> AdaptiveSpeculativeParams::cost_estimates(int batch_size, bool sampled) const {
  std::vector<double> out(candidates_.size());
  const GoodputPolicy& estimates = policy_->estimates();
  estimates.estimate_costs(batch_size > 0 ? table_of(batch_size, sampled) : estimates.last_table(), out.data());
  return out;
}

}  // namespace specswap
