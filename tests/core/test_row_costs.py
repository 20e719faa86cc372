"""The goodput policy's prior from the verify's measured cost per row count (docs/policy.md, "Cost"): a tier never
timed is priced cost_prior_slope per draft step plus the verify at its row count, interpolated between the counts
measured; two tables make the policy choose differently."""

import random

import pytest

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams, RoundObservation
from specswap._core import tier_key
from specswap.controller import AdaptiveController
from test_goodput import geometric

AVX2 = {1: 1.0, 4: 1.39, 8: 2.38}                         # a row costs much: 8 rows 2.38x one
VNNI = {1: 1.0, 2: 1.07, 4: 1.18, 6: 1.41, 8: 1.71}      # cheaper rows
CHEAP = {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1}               # nearly free rows
TREE = tier_key(3, 2, 8)


def goodput(initial, **overrides):
    # no probes, a decision after every batch, the newest batch's acceptance only
    values = dict(policy="goodput", probe_rounds=0, warmup_batches=0, update_interval=1, ema_alpha=1.0)
    return AdaptiveSpeculativeParams(initial, AdaptiveConfig(**{**values, **overrides}))


def test_untimed_tiers_are_priced_from_the_table_interpolated():
    params = goodput(1, candidate_steps=[0, 1, 3, 7], candidate_trees=[[2, 2, 5], [3, 2, 6]], cost_prior_slope=0.1)
    params.set_row_costs({1: 2.0, 4: 2.78, 8: 4.76})  # any unit: divided by the 1-row cost
    assert params.row_costs == pytest.approx(AVX2)
    # rows: a chain's steps + 1, a tree's nodes; 2 rows 1.13, 5 rows 1.6375, 6 rows 1.885 (linear between 4 and 8)
    assert params.cost_estimates(1) == pytest.approx({0: 1.0, 1: 0.1 + 1.13, 3: 0.3 + 1.39, 7: 0.7 + 2.38,
                                                      tier_key(2, 2, 5): 0.2 + 1.6375, tier_key(3, 2, 6): 0.3 + 1.885})
    # beyond the last count: along the last segment
    far = goodput(1, candidate_steps=[1, 11], cost_prior_slope=0.0)
    far.set_row_costs(AVX2)
    assert far.cost_estimates(1)[11] == pytest.approx(2.38 + 4 * (2.38 - 1.39) / 4)
    # None: back to 1 + cost_prior_slope * k
    params.set_row_costs(None)
    assert params.row_costs == {} and params.cost_estimates(1)[7] == pytest.approx(1.7)


def test_one_timed_tier_scales_the_table_s_shape():
    params = goodput(3, candidate_steps=[1, 3, 7], cost_prior_slope=0.0, warmup_batches=1000)
    params.set_row_costs(AVX2)
    params.update([2, 2], 0.139)  # tier 3 (4 rows) timed: the others follow the table through it
    assert params.cost_estimates(2) == pytest.approx({1: 0.113, 3: 0.139, 7: 0.238})


def test_a_tier_s_own_timings_replace_the_table_s_prior_as_soon_as_it_has_them():
    # start-up probes at batch 1, a round each: tier 3, then 1, then 7, each timed against the table (which,
    # through tier 3, puts tier 1 at 0.113 and tier 7 at 0.238): a tier's estimate is its timing from its first one
    params = goodput(3, candidate_steps=[1, 3, 7], cost_prior_slope=0.0, probe_rounds=1)
    params.set_row_costs(AVX2)
    assert params.cost_estimates(1) == pytest.approx({1: 1.13, 3: 1.39, 7: 2.38})
    timed = {}
    for steps, seconds in [(3, 0.139), (1, 0.2), (7, 0.1)]:
        assert params.current_tier == steps
        params.update([1], seconds)
        timed[steps] = seconds
        estimates = params.cost_estimates(1)
        assert {k: estimates[k] for k in timed} == timed, estimates
    assert params.cost_estimates(1) == {1: 0.2, 3: 0.139, 7: 0.1}


@pytest.mark.parametrize("bad", [{2: 1.0, 4: 1.3}, {1: 1.0}, {1: 1.0, 4: 0.0}, {1: 1.0, 4: float("nan")}])
def test_a_bad_table_is_refused(bad):
    with pytest.raises(ValueError, match="row cost"):
        goodput(1, candidate_steps=[1, 3]).set_row_costs(bad)


def test_the_table_moves_the_choice_among_chains():
    """alpha 0.8 (one untimed batch at tier 1: 4 of 5 requests accepted their draft): with nearly free rows the 7-chain pays, with an AVX2
    CPU's rows (8 rows 2.38x) the 3-chain does; without a table the prior 1 + 0.1k picks 7."""
    chosen = {}
    for name, table in [("cheap", CHEAP), ("avx2", AVX2), ("none", None)]:
        params = goodput(1, candidate_steps=[1, 3, 7], cost_prior_slope=0.0 if table else 0.1)
        params.set_row_costs(table)
        params.update([1, 1, 1, 1, 0])  # at tier 1: 4 successes, 1 failure: alpha 0.8
        assert params.alpha == pytest.approx(0.8)
        chosen[name] = params.current_tier
    assert chosen == {"cheap": 7, "avx2": 3, "none": 7}


@pytest.mark.parametrize("table, expected", [(CHEAP, TREE), (AVX2, 3)])
def test_the_table_decides_whether_a_tree_s_gain_pays(table, expected):
    """A tree of 8 nodes at depth 3 delivers 2.5 tokens a round where its chain is predicted 1.875 (alpha 0.5):
    a gain of 1.33. With nearly free rows it stays; where 8 rows cost 2.38x one, its chain of 4 rows wins."""
    params = goodput(TREE, candidate_steps=[0, 3], candidate_trees=[[3, 2, 8]], cost_prior_slope=0.1)
    params.set_row_costs(table)
    params.update([2, 2, 1, 1])  # untimed: every tier priced by the prior from the table
    assert params.current_tier == expected


def test_the_controller_sets_and_reports_the_table():
    from specswap._core import SpecRuntimeState, StatePool
    pool = StatePool()
    for steps in (0, 1, 3):
        pool.register(SpecRuntimeState(steps, steps + 1))
    pool.activate(1)
    controller = AdaptiveController(pool, {"policy": "goodput", "candidate_steps": [0, 1, 3]}, row_costs=VNNI)
    assert controller.row_costs == pytest.approx(VNNI) and controller.stats()["row_costs"] == controller.row_costs
    assert controller.stats()["cost_estimates"][3] == pytest.approx(0.3 + 1.18)
    controller.set_row_costs(None)
    assert controller.stats()["row_costs"] == {}


def test_an_untimed_tier_zero_is_timed_before_it_is_held():
    """EAGLE on Gemma 3 270M at batch 2 (this EPYC, ms a round): the cost is convex in the drafts (tier 4's 10 rows
    jump), so the line through tiers 3 and 4, the first two timed (the initial tier, then tier 4 probed), puts tier 0
    at zero. Greedy code, where tier 3 pays 2.5x tier 0: a decision for tier 0 on that line is a probe (probe_rounds
    batches there, back, decide again with its own cost), not a stay; it was 7 rounds at tier 0 at every start."""
    cost = {0: 0.0122, 1: 0.0130, 3: 0.0173, 4: 0.0250}
    config = AdaptiveConfig(policy="goodput", candidate_steps=[0, 1, 3, 4], acceptance_model="positional",
                            probe_interval=100, refresh_interval=50, blind_zero_margin=0.25)
    for seed in range(3):
        params = AdaptiveSpeculativeParams(3, config)
        params.set_row_costs(VNNI)
        params.expect_shadows()
        rng, tiers = random.Random(seed), []
        for _ in range(60):
            steps = params.current_tier
            tiers.append(steps)
            accepted = [geometric(0.9, max(steps, 1), rng) for _ in range(2)]  # at tier 0: what tier 1 would have
            shadow = accepted if steps == 0 else []
            params.observe(RoundObservation(accept_lengths=accepted if steps else [0, 0], shadow_accept_lengths=shadow,
                                            shadow_steps=1, round_seconds=cost[steps]))
        assert tiers.count(0) <= 2 and tiers[-20:] == [3] * 20, (seed, "".join(map(str, tiers)))
