#include "core/adaptive_params.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/sglang_policy.h"

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
std::pair<std::vector<int>, std::size_t> initial_tiers(int initial_steps, const AdaptiveConfig& config) {
  config.validate();
  if (is_tree_key(initial_steps)) {
    const std::string error = tree_shape_error(tier_shape(initial_steps), AdaptiveConfig::kMaxSteps);
    if (!error.empty()) throw std::invalid_argument("initial tier " + std::to_string(initial_steps) + ": " + error);
  } else if (initial_steps < 0 || initial_steps > AdaptiveConfig::kMaxSteps) {
    throw std::invalid_argument("initial_steps must be an integer in [0, " +
                                std::to_string(AdaptiveConfig::kMaxSteps) + "] (or a tree's key), got " +
                                std::to_string(initial_steps));
  }
  std::vector<int> candidates = config.candidate_steps;
  for (const TierShape& tree : config.candidate_trees) candidates.push_back(tier_key(tree));
  std::sort(candidates.begin(), candidates.end(), tier_before);
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  if (config.snap_initial_steps) {
    // Nearest candidate by verified drafts; on a tie the larger one wins.
    std::size_t best = 0;
    const int width = tier_width(initial_steps);
    for (std::size_t i = 1; i < candidates.size(); ++i) {
      if (std::abs(tier_width(candidates[i]) - width) <= std::abs(tier_width(candidates[best]) - width)) best = i;
    }
    return {std::move(candidates), best};
  }
  auto it = std::lower_bound(candidates.begin(), candidates.end(), initial_steps, tier_before);
  if (it == candidates.end() || *it != initial_steps) it = candidates.insert(it, initial_steps);
  const auto index = static_cast<std::size_t>(it - candidates.begin());
  return {std::move(candidates), index};
}

}  // namespace

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(int initial_steps, AdaptiveConfig config)
    : AdaptiveSpeculativeParams(config, initial_tiers(initial_steps, config)) {}

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(AdaptiveConfig config,
                                                     std::pair<std::vector<int>, std::size_t> tiers)
    : config_(std::move(config)),
      candidates_(std::move(tiers.first)),
      index_(tiers.second),
      ema_(static_cast<double>(tier_shape(candidates_[index_])[0] - 1)),
      goodput_(config_, candidates_, index_) {}

bool AdaptiveSpeculativeParams::update(std::span<const int> accept_lengths, double round_seconds, bool sampled) {
  // Idle batches neither move the EMA nor use up warmup.
  if (accept_lengths.empty()) return false;
  long long total = 0;
  for (int accepted : accept_lengths) total += accepted;
  const double batch_mean = static_cast<double>(total) / static_cast<double>(accept_lengths.size());
  ema_ = (1.0 - config_.ema_alpha) * ema_ + config_.ema_alpha * batch_mean;
  ++num_batches_;
  const std::size_t before = index_;

  if (config_.policy == PolicyKind::kSglang) {
    const auto warmup = static_cast<std::uint64_t>(config_.warmup_batches);
    const auto interval = static_cast<std::uint64_t>(config_.update_interval);
    if (num_batches_ <= warmup) return false;
    if ((num_batches_ - warmup) % interval != 0) return false;
    index_ = sglang_tier(candidates_, index_, ema_, config_);
  } else {
    index_ = goodput_.update(accept_lengths, round_seconds, sampled);
  }
  return index_ != before;
}

void AdaptiveSpeculativeParams::set_row_costs(RowCosts row_costs) {
  goodput_.set_row_costs(row_costs);
  row_costs_ = std::move(row_costs);
}

void AdaptiveSpeculativeParams::shadow(std::span<const int> accept_lengths, int steps) {
  if (config_.policy == PolicyKind::kGoodput) goodput_.shadow(accept_lengths, steps);
}

void AdaptiveSpeculativeParams::tree_chain(std::span<const int> accept_lengths, std::span<const int> depths) {
  if (accept_lengths.size() != depths.size()) {
    throw std::invalid_argument("tree_chain: " + std::to_string(accept_lengths.size()) + " accept lengths but " +
                                std::to_string(depths.size()) + " depths; give one of each per request");
  }
  if (config_.policy == PolicyKind::kGoodput) goodput_.tree_chain(accept_lengths, depths);
}

void AdaptiveSpeculativeParams::deep_checks(std::span<const int> outcomes) {
  if (config_.policy == PolicyKind::kGoodput) goodput_.deep_checks(outcomes);
}

void AdaptiveSpeculativeParams::plain_round(int batch_size, double round_seconds, bool sampled) {
  if (config_.policy == PolicyKind::kGoodput) goodput_.plain_round(batch_size, round_seconds, sampled);
}

std::vector<double> AdaptiveSpeculativeParams::cost_estimates(int batch_size, bool sampled) const {
  std::vector<double> out(candidates_.size());
  goodput_.costs().estimate(batch_size > 0 ? table_of(batch_size, sampled) : goodput_.last_table(), out.data());
  return out;
}

}  // namespace specswap
