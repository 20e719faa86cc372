// The policy from C++ alone (a serving loop without Python).
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/adaptive_params.h"

using namespace specswap;

int main() {
  AdaptiveConfig fast;
  fast.ema_alpha = 1.0;
  fast.warmup_batches = 0;
  fast.update_interval = 1;

  AdaptiveSpeculativeParams params(3, fast);
  CHECK(params.current_steps() == 3 && params.ema() == 2.0);
  const std::vector<int> high{3, 3}, low{0}, mid{2, 3};
  CHECK(params.update(high) && params.current_steps() == 7);
  CHECK(params.update(low) && params.current_steps() == 1);
  CHECK(!params.update(std::vector<int>{}) && params.num_batches() == 2);
  CHECK(params.update(mid) && params.current_steps() == 3);  // 2.5: up to 3, not 7

  AdaptiveConfig snap;
  snap.snap_initial_steps = true;
  AdaptiveSpeculativeParams snapped(2, snap);
  CHECK(snapped.current_steps() == 3 && snapped.ema() == 2.0);
  AdaptiveSpeculativeParams added(2, AdaptiveConfig{});
  CHECK(added.candidate_steps().size() == 4 && added.current_steps() == 2);

  AdaptiveConfig bad;
  bad.ema_alpha = 0.0;
  CHECK(throws([&] { bad.validate(); }));
  bad = AdaptiveConfig{};
  bad.candidate_steps = {3};
  CHECK(throws([&] { bad.validate(); }));
  bad = AdaptiveConfig{};
  bad.update_interval = 0;
  CHECK(throws([&] { bad.validate(); }));
  bad = AdaptiveConfig{};
  bad.min_gain = -0.1;
  CHECK(throws([&] { bad.validate(); }));
  CHECK(throws([] { policy_from_name("fastest"); }));
  CHECK(policy_from_name("goodput") == PolicyKind::kGoodput);

  // goodput: E(k), alpha from truncated geometric observations, decisions
  // from timed rounds.
  CHECK(AdaptiveSpeculativeParams::expected_tokens(0.5, 3) == 1.875);
  CHECK(AdaptiveSpeculativeParams::expected_tokens(1.0, 7) == 8.0);
  CHECK(AdaptiveSpeculativeParams::expected_tokens(0.3, 0) == 1.0);
  AdaptiveConfig goodput;
  goodput.policy = PolicyKind::kGoodput;
  goodput.candidate_steps = {0, 1, 3, 7};
  goodput.ema_alpha = 1.0;
  goodput.probe_rounds = 1;  // batches 1-4 time tiers 3, 0, 1, 7; decide after
  goodput.warmup_batches = 0;
  goodput.update_interval = 1;
  AdaptiveSpeculativeParams picker(3, goodput);
  const std::vector<int> tiers{3, 0, 1, 7};
  for (int expected : tiers) {
    CHECK(picker.current_steps() == expected);
    std::vector<int> accepted(4, expected);  // every draft accepted
    if (expected > 0) accepted[0] = expected - 1;
    picker.update(accepted, 1.0 + 0.1 * expected);
  }
  CHECK(picker.alpha() > 0.9 && picker.alpha() < 1.0);
  CHECK(picker.current_steps() == 7);
  const std::vector<int> none{0, 0, 0, 0};
  CHECK(picker.update(none, 1.7) && picker.alpha() == 0.0 &&
        picker.current_steps() == 0);  // nothing accepted: speculation off
  const auto costs = picker.cost_estimates(4);
  CHECK(costs.size() == 4 && costs[3] == 1.7);

  // positional: a bursty drafter (0 or all of 3) promises more at 7 than
  // the geometric alpha (3/4) says.
  AdaptiveConfig positional;
  positional.policy = PolicyKind::kGoodput;
  positional.acceptance_model = acceptance_model_from_name("positional");
  positional.ema_alpha = 1.0;
  positional.probe_rounds = 0;
  positional.warmup_batches = 1000;
  AdaptiveSpeculativeParams bursty(3, positional);
  std::vector<int> half(32, 0);
  for (std::size_t i = 0; i < half.size(); i += 2) half[i] = 3;
  bursty.update(half);
  CHECK(bursty.alpha() == 0.75);
  // per position about 1/2, 1, 1 (shrunk toward 3/4 by one pseudo-trial)
  CHECK(bursty.model_tokens(7) >
        AdaptiveSpeculativeParams::expected_tokens(bursty.alpha(), 7) + 0.5);
  CHECK(throws([] { acceptance_model_from_name("bursty"); }));

  // the field table: every row is walked once, in order, and a check says the row's valid words
  std::vector<std::string> names;
  for_each_config_field([&](const auto& field) { names.emplace_back(field.name); });
  CHECK(names.size() == 18 && names.front() == "policy" && names.back() == "acceptance_model");
  const auto message = [](const AdaptiveConfig& config) -> std::string {
    try {
      config.validate();
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "";
  };
  AdaptiveConfig worded;
  worded.ema_alpha = 1.5;
  CHECK(message(worded) == "ema_alpha must be a number in (0, 1], got 1.5");
  worded = AdaptiveConfig{};
  worded.probe_interval = 0;
  CHECK(message(worded) == "probe_interval must be an integer >= 1, got 0");
  worded = AdaptiveConfig{};
  worded.refresh_interval = -2;
  CHECK(message(worded) == "refresh_interval must be an integer >= 0, got -2");
  worded = AdaptiveConfig{};
  worded.blind_zero_margin = -1;
  CHECK(message(worded) == "blind_zero_margin must be a finite number >= 0, got -1");
  worded = AdaptiveConfig{};
  worded.noise_margin = -0.5;
  CHECK(message(worded) == "noise_margin must be a finite number >= 0, got -0.5");
  worded = AdaptiveConfig{};
  worded.collapse_evidence = -1;
  CHECK(message(worded) == "collapse_evidence must be a finite number >= 0, got -1");
  worded = AdaptiveConfig{};
  worded.candidate_steps = {1, 65};
  CHECK(message(worded).find("[0, 64]") != std::string::npos);
  CHECK(message(AdaptiveConfig{}).empty());

  // draft trees among the tiers: keys, checks, and their place among the chains
  CHECK(tier_key({3, 1, 4}) == 3 && tier_key({3, 2, 6}) == 30206 && tier_shape(30206) == (TierShape{3, 2, 6}));
  CHECK(tier_shape(7) == (TierShape{7, 1, 8}) && is_tree_key(30206) && !is_tree_key(64));
  worded = AdaptiveConfig{};
  worded.candidate_trees = {{3, 2, 6}};
  CHECK(message(worded) == "candidate_trees needs policy 'goodput' (SGLang's thresholds are per step count, not per "
                           "tree), got policy 'sglang'");
  worded.policy = PolicyKind::kGoodput;
  CHECK(message(worded).empty());
  worded.candidate_trees = {{3, 2, 3}};
  CHECK(message(worded) ==
        "candidate_trees: tree [3, 2, 3]: speculative_num_draft_tokens must be in [4, 11]");
  AdaptiveConfig trees;
  trees.policy = PolicyKind::kGoodput;
  trees.candidate_steps = {0, 1, 3, 7};
  trees.candidate_trees = {{3, 2, 6}, {2, 2, 4}};
  AdaptiveSpeculativeParams over_trees(30206, trees);
  CHECK((over_trees.candidate_steps() == std::vector<int>{0, 1, 3, 20204, 30206, 7}));
  CHECK(over_trees.current_steps() == 30206 && over_trees.ema() == 2.0);

  // measured row costs: interpolated between counts, extrapolated along the last segment, checked
  auto near = [](double a, double b) { return std::fabs(a - b) < 1e-12; };
  const RowCosts avx2({1, 4, 8}, {2.0, 2.78, 4.76});  // divided by the 1-row cost: 1, 1.39, 2.38
  CHECK(near(avx2.at(1), 1.0) && near(avx2.at(4), 1.39) && near(avx2.at(8), 2.38));
  CHECK(near(avx2.at(2), 1.13) && near(avx2.at(6), 1.885) && near(avx2.at(10), 2.875));
  CHECK(near(RowCosts({1, 2, 4}, {1.0, 1.2, 1.1}).at(6), 1.1));  // never falling beyond the last count
  CHECK(RowCosts{}.empty() && RowCosts{}.at(5) == 1.0);
  CHECK(throws([] { RowCosts({2, 4}, {1.0, 1.5}); }));          // no 1-row count
  CHECK(throws([] { RowCosts({1, 4, 4}, {1.0, 1.5, 1.6}); }));  // not increasing
  CHECK(throws([] { RowCosts({1, 4}, {1.0, 0.0}); }));          // not > 0
  CHECK(throws([] { RowCosts({1, 4}, {1.0}); }));               // sizes differ
  CHECK(throws([] { RowCosts({1}, {1.0}); }));                  // one count
  // untimed tiers: cost_prior_slope per draft step plus the verify at their rows (a tree's: its nodes)
  over_trees.set_row_costs(avx2);
  const std::vector<double> prior{1.0, 0.1 + 1.13, 0.3 + 1.39, 0.2 + 1.39, 0.3 + 1.885, 0.7 + 2.38};
  auto untimed = over_trees.cost_estimates(1);
  for (std::size_t j = 0; j < prior.size(); ++j) CHECK(near(untimed[j], prior[j]));
  // one tier timed: the others are the prior's shape through it
  AdaptiveConfig quiet = trees;
  quiet.probe_rounds = 0;
  quiet.warmup_batches = 1000;
  AdaptiveSpeculativeParams one_timed(30206, quiet);
  one_timed.set_row_costs(avx2);
  one_timed.update(std::vector<int>{2}, 3.0);
  const auto scaled = one_timed.cost_estimates(1);
  for (std::size_t j = 0; j < prior.size(); ++j) CHECK(near(scaled[j], 3.0 * prior[j] / prior[4]));
  // no table: the slope again
  over_trees.set_row_costs(RowCosts{});
  untimed = over_trees.cost_estimates(1);
  CHECK(over_trees.row_costs().empty() && untimed[4] == 1.0 + 0.1 * 5 && untimed[5] == 1.0 + 0.1 * 7);
  return 0;
}
