// The policy from C++ alone (a serving loop without Python).
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/adaptive_params.h"

using namespace specswap;

namespace {

// validate()'s message ("" if valid).
std::string message(const AdaptiveConfig& config) {
  try {
    config.validate();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// One observe() carries a whole round: shadows, a tree round's chain, checks past a chain, a plain decode.
void check_one_observe_per_round() {
  AdaptiveConfig goodput;
  goodput.policy = PolicyKind::kGoodput;
  goodput.candidate_steps = {0, 1, 3};
  goodput.candidate_trees = {{3, 2, 6}};
  goodput.probe_rounds = 0;
  goodput.warmup_batches = 1000;
  goodput.acceptance_model = AcceptanceModel::kPositional;
  goodput.ema_alpha = 1.0;
  // at tier 0 the shadows are the acceptance observations
  AdaptiveSpeculativeParams zero(0, goodput);
  const std::vector<int> all_three{3, 3, 3, 3};
  RoundObservation shadows;
  shadows.shadow_accept_lengths = all_three;
  shadows.shadow_steps = 3;
  CHECK(!zero.observe(shadows) && zero.num_batches() == 0 && zero.alpha() == 1.0);
  // at a tree, the verify's chain moves the chains' estimates (alone it would not: a tree's verify is its gain)
  auto tree_alpha = [&](std::vector<int> chain) {
    AdaptiveSpeculativeParams tree(30206, goodput);
    const std::vector<int> accepted{3, 3}, depths(chain.size(), 3);
    RoundObservation round;
    round.accept_lengths = accepted;
    round.round_seconds = 1.0;
    round.chain_accept_lengths = chain;
    round.chain_depths = depths;
    tree.observe(round);
    return tree.alpha();
  };
  CHECK(tree_alpha({0, 0}) < tree_alpha({}) && tree_alpha({}) < tree_alpha({3, 3}));
  // at chain 1, a check past it reaches position 2 alone
  AdaptiveSpeculativeParams one(1, goodput);
  const std::vector<int> accepted{1, 1}, checks{0, 0};
  RoundObservation checked;
  checked.accept_lengths = accepted;
  checked.deep_checks = checks;
  one.observe(checked);
  CHECK(one.position_acceptance(1) == 1.0 && one.position_acceptance(2) < 0.5);
  // a plain decode in tier 3's place times tier 0 beside it, no batch counted
  AdaptiveSpeculativeParams three(3, goodput);
  RoundObservation plain;
  plain.plain_requests = 4;
  plain.round_seconds = 0.5;
  CHECK(!three.observe(plain) && three.num_batches() == 0 && three.measured_costs()[2][0] == 0.5);
  // a round is a verify or a plain decode; a chain's lengths and depths match
  plain.accept_lengths = accepted;
  CHECK(throws([&] { three.observe(plain); }));
  const std::vector<int> two{1, 1}, three_depths{3, 3, 3};
  RoundObservation uneven;
  uneven.accept_lengths = two;
  uneven.chain_accept_lengths = two;
  uneven.chain_depths = three_depths;
  CHECK(throws([&] { three.observe(uneven); }));
}

// A Policy of one's own behind the same driver: one that alternates tiers 1 and 3 on each verify.
class Alternate final : public ModelFreePolicy {
 public:
  Alternate(const AdaptiveConfig& config, const std::vector<int>& candidates, std::size_t index)
      : ModelFreePolicy(config, candidates, index), candidates_(candidates) {}
  std::size_t observe(const RoundObservation& round, const PolicyState& state) override {
    ++rounds;
    if (!round.has_verify()) return moves_without_verify ? index_of(3) : state.index;
    return candidates_[state.index] == 1 ? index_of(3) : index_of(1);
  }
  int rounds = 0;
  bool moves_without_verify = false;

 private:
  std::size_t index_of(int key) const {
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      if (candidates_[j] == key) return j;
    }
    return candidates_.size();
  }
  std::vector<int> candidates_;
};

void check_a_policy_of_ones_own() {
  AdaptiveConfig python;
  python.policy = PolicyKind::kPython;
  CHECK(throws([&] { AdaptiveSpeculativeParams none(1, python); }));  // the built-in factory cannot build it
  Alternate* policy = nullptr;
  AdaptiveSpeculativeParams params(1, python, [&](const AdaptiveConfig& config, const std::vector<int>& candidates,
                                                  std::size_t index) {
    auto made = std::make_unique<Alternate>(config, candidates, index);
    policy = made.get();
    return made;
  });
  const std::vector<int> accepted{0};
  std::vector<int> trace;
  for (int i = 0; i < 4; ++i) {
    CHECK(params.update(accepted));
    trace.push_back(params.current_tier());
  }
  CHECK((trace == std::vector<int>{3, 1, 3, 1}) && params.num_batches() == 4 && params.alpha() == 0.5);
  RoundObservation idle;
  CHECK(!params.observe(idle) && policy->rounds == 5);  // every round reaches it; a round without a verify stays
  policy->moves_without_verify = true;
  CHECK(throws([&] { params.observe(idle); }));  // a policy moves on verifies only
  python.python_policy = "policies:Alternate";
  CHECK(message(python).empty());
  python.python_policy = "Alternate";
  CHECK(message(python) == "python_policy must be 'module:Class', got 'Alternate'");
  python.policy = PolicyKind::kSglang;
  python.python_policy = "policies:Alternate";
  CHECK(message(python) == "python_policy names the class of policy 'python', got policy 'sglang'");
}

}  // namespace

int main() {
  AdaptiveConfig fast;
  fast.ema_alpha = 1.0;
  fast.warmup_batches = 0;
  fast.update_interval = 1;

  AdaptiveSpeculativeParams params(3, fast);
  CHECK(params.current_tier() == 3 && params.ema() == 2.0);
  const std::vector<int> high{3, 3}, low{0}, mid{2, 3};
  CHECK(params.update(high) && params.current_tier() == 7);
  CHECK(params.update(low) && params.current_tier() == 1);
  CHECK(!params.update(std::vector<int>{}) && params.num_batches() == 2);
  CHECK(params.update(mid) && params.current_tier() == 3);  // 2.5: up to 3, not 7

  AdaptiveConfig snap;
  snap.snap_initial_steps = true;
  AdaptiveSpeculativeParams snapped(2, snap);
  CHECK(snapped.current_tier() == 3 && snapped.ema() == 2.0);
  AdaptiveSpeculativeParams added(2, AdaptiveConfig{});
  CHECK(added.candidate_tiers().size() == 4 && added.current_tier() == 2);

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
    CHECK(picker.current_tier() == expected);
    std::vector<int> accepted(4, expected);  // every draft accepted
    if (expected > 0) accepted[0] = expected - 1;
    picker.update(accepted, 1.0 + 0.1 * expected);
  }
  CHECK(picker.alpha() > 0.9 && picker.alpha() < 1.0);
  CHECK(picker.current_tier() == 7);
  const std::vector<int> none{0, 0, 0, 0};
  CHECK(picker.update(none, 1.7) && picker.alpha() == 0.0 &&
        picker.current_tier() == 0);  // nothing accepted: speculation off
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
  CHECK(names.size() == 19 && names.front() == "policy" && names.back() == "acceptance_model");
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
  CHECK(message(worded) == "candidate_trees needs policy 'goodput' or 'python' (SGLang's thresholds are per step "
                           "count, not per tree), got policy 'sglang'");
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
  CHECK((over_trees.candidate_tiers() == std::vector<int>{0, 1, 3, 20204, 30206, 7}));
  CHECK(over_trees.current_tier() == 30206 && over_trees.ema() == 2.0);

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

  check_one_observe_per_round();
  check_a_policy_of_ones_own();
  return 0;
}
