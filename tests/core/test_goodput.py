"""The goodput policy: acceptance model, expected tokens, cost model, decisions (docs/policy.md)."""

import random

import pytest

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams, RoundObservation

expected_tokens = AdaptiveSpeculativeParams.expected_tokens


def goodput(initial=3, **overrides):
    return AdaptiveSpeculativeParams(initial, AdaptiveConfig(policy="goodput", **overrides))


def quiet(**overrides):
    # no start-up probing and no decision: the estimators alone
    return dict(probe_rounds=0, warmup_batches=1000, **overrides)


def geometric(alpha, steps, rng):
    accepted = 0
    while accepted < steps and rng.random() < alpha:
        accepted += 1
    return accepted


def run(params, alpha, cost, rounds, rng, batch=4):
    """Feed `rounds` verifies at the policy's own tier; return the tier of each round."""
    tiers = []
    for _ in range(rounds):
        steps = params.current_tier
        tiers.append(steps)
        params.update([geometric(alpha, steps, rng) for _ in range(batch)], cost(steps))
    return tiers


def best_tier(alpha, cost, candidates=(0, 1, 3, 7)):
    return max(candidates, key=lambda k: expected_tokens(alpha, k) / cost(k))


# ---- acceptance model ------------------------------------------------------------------------------------------


def test_alpha_prior_before_any_draft():
    assert goodput(**quiet()).alpha == 0.5


def test_alpha_from_truncated_geometric_observations():
    params = goodput(3, **quiet(ema_alpha=1.0))
    # 3 of 3: 3 successes, no failure; 1 of 3: 1 + 1 failure; 0 of 3: 1 failure
    params.update([3, 1, 0])
    assert params.alpha == pytest.approx(4 / 6)


def test_alpha_is_a_ratio_of_emas_over_requests():
    params = goodput(3, **quiet(ema_alpha=0.5))
    params.update([3, 3])  # 6 / 6 (zero-started EMAs: the first batch's ratio exactly)
    assert params.alpha == pytest.approx(1.0)
    # counts enter with weight 0.5; old counts keep 0.5 per 4 requests: 0.5 ** (n / 4) for a batch of n
    successes, trials = 0.5 * 6, 0.5 * 6
    params.update([0, 0])
    successes, trials = 0.5 ** 0.5 * successes, 0.5 ** 0.5 * trials + 0.5 * 2
    assert params.alpha == pytest.approx(successes / trials)
    params.update([2, 0, 1])  # 3 successes of 3 + 1 + 2 trials
    successes, trials = 0.5 ** 0.75 * successes + 0.5 * 3, 0.5 ** 0.75 * trials + 0.5 * 6
    assert params.alpha == pytest.approx(successes / trials)


def test_acceptance_memory_counts_requests_not_batches():
    # four batches of one request age the old estimate exactly as one batch of four does, so at batch 1 a
    # decision rests on as many requests as at batch 4 (at batch 1 one request per batch made it noisy)
    def after(batches):
        params = goodput(3, **quiet(ema_alpha=0.2))
        params.update([3, 3, 3, 3])
        for batch in batches:
            params.update(batch)
        return params.alpha

    high_weight = 0.2 * 12  # what the first batch left, in both cases
    old = high_weight * 0.8  # after 4 requests
    assert after([[0, 0, 0, 0]]) == pytest.approx(old / (old + 0.2 * 4))
    assert after([[0]] * 4) == pytest.approx(old / (old + 0.2 * sum(0.8 ** (i / 4) for i in range(4))))
    # a fixed weight per batch would have aged it as much as 16 requests: alpha 0.625 instead of 0.72
    per_batch = high_weight * 0.8 ** 4 / (high_weight * 0.8 ** 4 + 0.2 * sum(0.8 ** i for i in range(4)))
    assert after([[0]] * 4) > per_batch + 0.09


def test_alpha_frozen_at_tier_zero_and_clamped_at_k():
    params = goodput(0, **quiet(ema_alpha=1.0, candidate_steps=[0, 3]))
    params.update([0, 0, 0])  # tier 0 verifies no draft: nothing observed
    assert params.alpha == 0.5
    params = goodput(1, **quiet(ema_alpha=1.0, candidate_steps=[1, 3]))
    params.update([5, 0])  # 5 of 1 is read as 1 of 1
    assert params.alpha == pytest.approx(1 / 2)


def test_sglang_ema_still_reported_under_goodput():
    params = goodput(3, **quiet(ema_alpha=1.0))
    params.update([2, 3])
    assert params.ema == 2.5


# ---- expected tokens ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "alpha, steps, tokens",
    [
        (0.5, 0, 1.0),
        (0.5, 1, 1.5),
        (0.5, 3, 1.875),
        (0.9, 7, (1 - 0.9**8) / (1 - 0.9)),
        (0.3, 3, (1 - 0.3**4) / (1 - 0.3)),
        (1.0, 7, 8.0),  # alpha -> 1: k + 1
        (0.0, 7, 1.0),
    ],
)
def test_expected_tokens(alpha, steps, tokens):
    assert expected_tokens(alpha, steps) == pytest.approx(tokens)


# ---- decisions ------------------------------------------------------------------------------------------------


def linear_cost(c0, c1):
    return lambda k: c0 + c1 * k


@pytest.mark.parametrize(
    "alpha, cost, expected",
    [
        (0.9, linear_cost(1.0, 0.1), 7),   # high acceptance, cheap drafts: the deepest tier
        (0.3, linear_cost(1.0, 0.1), 1),   # low acceptance: one draft still pays
        (0.5, linear_cost(1.0, 1.0), 0),   # a draft step costs a whole round: speculation off
    ],
)
def test_synthetic_cost_table_picks_the_best_tier(alpha, cost, expected):
    assert best_tier(alpha, cost) == expected  # the table really has that optimum
    params = goodput(3, candidate_steps=[0, 1, 3, 7])
    tiers = run(params, alpha, cost, 60, random.Random(0))
    assert params.measured_costs()["greedy"][4] == {k: pytest.approx(cost(k)) for k in (0, 1, 3, 7)}  # probed
    if expected == 0:  # but for short probes back up
        assert tiers[-20:].count(0) >= 16, tiers
    else:
        assert tiers[-20:] == [expected] * 20, tiers


def test_jumps_three_to_seven_in_one_decision():
    params = goodput(3, **dict(quiet(ema_alpha=1.0), warmup_batches=0, update_interval=1))
    assert params.update([3, 3, 3, 3], 1.0) is True  # alpha 1, prior costs 1 + 0.1k: 8/1.7 beats 4/1.3
    assert params.current_tier == 7


def test_tier_surcharges_price_the_tiers_where_decisions_do():
    """set_tier_surcharges: seconds added to each candidate's estimate (a hybrid's model drafter at its share now)."""
    fast = dict(quiet(ema_alpha=1.0), warmup_batches=0, update_interval=1, candidate_steps=[3, 7])
    params = goodput(3, **fast)
    params.set_tier_surcharges([0.0, 1.0])  # tier 7: its estimate + 1.0
    assert params.cost_estimates() == {3: pytest.approx(1.3), 7: pytest.approx(2.7)}
    params.update([3, 3, 3, 3], 1.0)  # tier 3 timed at 1.0, 7 priced 1.7 / 1.3 + 1.0: 8 / 2.31 loses to 4 / 1.0
    assert params.current_tier == 3  # without the surcharge the same round jumps to 7 (as just below)
    params.set_tier_surcharges([float("nan"), -1.0])  # not a cost: none; tier 3 now timed at 1.0, 7 along the prior
    assert params.cost_estimates() == {3: pytest.approx(1.0), 7: pytest.approx(1.7 / 1.3)}
    params.update([3, 3, 3, 3], 1.0)
    assert params.current_tier == 7
    with pytest.raises(ValueError, match="1 values for 2 candidate tiers"):
        params.set_tier_surcharges([0.0])
    sglang = AdaptiveSpeculativeParams(3, AdaptiveConfig(policy="sglang", candidate_steps=[3, 7]))
    sglang.set_tier_surcharges([0.0, 1.0])  # prices no tier: ignored
    assert sglang.cost_estimates() == {3: pytest.approx(1.3), 7: pytest.approx(1.7)}


def test_untimed_updates_use_the_cost_prior():
    params = goodput(3, **dict(quiet(ema_alpha=1.0, cost_prior_slope=0.25), warmup_batches=0))
    params.update([3, 2, 3, 3])  # no round_seconds
    assert params.measured_costs() == {"greedy": {}, "sampled": {}}
    assert params.cost_estimates() == {k: pytest.approx(1 + 0.25 * k) for k in (1, 3, 7)}


def test_hysteresis_blocks_a_marginal_switch():
    batch = [3, 3, 3, 2]  # alpha 11/12
    alpha = 11 / 12
    tokens_ratio = expected_tokens(alpha, 7) / expected_tokens(alpha, 3)
    # prior slope s making tier 7 exactly 2% better than tier 3: (1 + 7s) / (1 + 3s) = tokens_ratio / 1.02
    target = tokens_ratio / 1.02
    slope = (target - 1) / (7 - 3 * target)
    for min_gain, expected in [(0.03, 3), (0.01, 7)]:
        params = goodput(3, **dict(quiet(ema_alpha=1.0, cost_prior_slope=slope, min_gain=min_gain),
                                   warmup_batches=0, update_interval=1, candidate_steps=[3, 7]))
        params.update(batch)
        assert params.alpha == pytest.approx(alpha)
        assert params.current_tier == expected, min_gain


def test_costs_of_unmeasured_tiers_are_linear_through_measured_ones():
    params = goodput(1, **quiet(candidate_steps=[1, 3, 7]))
    params.update([1], 2.0)
    assert params.cost_estimates(1) == {1: 2.0, 3: pytest.approx(2.0 * 1.3 / 1.1), 7: pytest.approx(2.0 * 1.7 / 1.1)}
    params = goodput(1, **dict(quiet(candidate_steps=[1, 3, 7]), probe_rounds=1))
    params.update([1], 2.0)  # probe: tier 1, then 3
    params.update([3], 3.0)
    assert params.cost_estimates(1) == {1: 2.0, 3: 3.0, 7: pytest.approx(5.0)}  # 1.5 + 0.5 k
    # a batch size never timed borrows the nearest timed bucket's table
    assert params.cost_estimates(8) == params.cost_estimates(1)


def test_cost_table_is_kept_per_batch_size_bucket():
    params = goodput(3, **quiet(candidate_steps=[1, 3, 7]))
    params.update([1], 1.0)
    params.update([1, 1], 1.5)
    params.update([1, 1, 1], 2.0)  # 3 shares the bucket 2-3 (its second sample: the mean of the two)
    assert params.measured_costs()["greedy"] == {1: {3: 1.0}, 2: {3: pytest.approx((1.5 + 2.0) / 2)}}


def test_start_up_probes_keep_each_tier_s_fastest_round():
    # the first rounds of a new engine run cold: a tier priced by one of them would look dear for good
    params = goodput(3, candidate_steps=[1, 3, 7])  # probes 3, 3, 1, 1, 7, 7
    for seconds in (3.0, 1.2, 1.1, 1.0, 2.0, 1.9):
        params.update([0, 0], seconds)
    assert params.measured_costs()["greedy"][2] == {1: 1.0, 3: 1.2, 7: 1.9}


ROW_COSTS = {1: 1.0, 2: 1.07, 4: 1.18, 8: 1.71}  # a measured table (AVX-512 VNNI)


@pytest.mark.parametrize("shadows, row_costs, trees, probed", [
    (True, True, False, {3, 0}),  # priced by the table, acceptance from the shadows: the initial tier, then 0
    (False, True, False, {0, 1, 3, 7}),      # a blind drafter learns a tier's acceptance only by running it
    (True, False, False, {0, 1, 3, 7}),      # without a table the slope would price them: time every tier
    (True, True, True, {0, 1, 3, 7, "tree"}),  # a tree's gain over its chain is learned only by running it
])
def test_start_up_probes_run_only_the_initial_tier_with_shadows_and_row_costs(shadows, row_costs, trees, probed):
    trees_config = {"candidate_trees": [[3, 2, 6]]} if trees else {}
    params = goodput(3, candidate_steps=[0, 1, 3, 7], probe_rounds=2, warmup_batches=1000, **trees_config)
    if shadows:
        params.expect_shadows()
    if row_costs:
        params.set_row_costs(ROW_COSTS)
    candidates = list(params.candidate_tiers)
    seen = []
    for _ in range(2 * len(candidates)):  # the longest start-up: every candidate's probe rounds
        steps = params.current_tier
        seen.append(steps if steps in (0, 1, 3, 7) else "tree")
        params.update([0, 0], 1.0 + 0.1 * (steps if steps in (0, 1, 3, 7) else 5))
    assert set(seen) == probed, seen  # nothing accepted at 3: the decision after its probe rounds takes 0
    assert seen[:2] == [3, 3]  # the initial tier first, either way


def test_a_slow_spell_is_not_learned_as_a_cost():
    # every round 2.5x slower for 80 rounds (as a trace of Gemma EAGLE on a 2-core CPU showed): the tier holds and
    # the cost table comes out of the spell as it went in, so no tier is left priced at the spell's level
    cost = {1: 1.0, 3: 1.2, 7: 2.2}
    rng = random.Random(5)
    params = goodput(3, candidate_steps=[1, 3, 7])
    run(params, 0.75, lambda k: cost[k], 60, rng)  # tier 3 is best at this acceptance
    assert params.current_tier == 3
    before = params.cost_estimates(4)
    during = run(params, 0.75, lambda k: 2.5 * cost[k], 80, rng)
    assert set(during) == {3}
    assert params.cost_estimates(4) == pytest.approx(before)
    after = run(params, 0.75, lambda k: cost[k], 40, rng)
    assert set(after) == {3}
    assert params.cost_estimates(4)[3] == pytest.approx(1.2)


def test_costs_follow_the_machine_s_speed_while_one_tier_runs():
    # probed at one speed, then tier 3 runs while the machine speeds up to 0.7x: the tiers not run since keep
    # their ratio to tier 3 instead of their old seconds (which would price them 1 / 0.7 too dear)
    cost = {1: 1.0, 3: 1.2, 7: 1.9}
    rng = random.Random(2)
    params = goodput(3, candidate_steps=[1, 3, 7])
    run(params, 0.75, lambda k: cost[k], 12, rng)  # probes 3, 3, 1, 1, 7, 7, then tier 3
    assert params.current_tier == 3
    speed = iter([1.0 - 0.3 * min(1.0, r / 80) for r in range(200)])
    tiers = run(params, 0.75, lambda k: next(speed) * cost[k], 120, rng)
    assert set(tiers) == {3}
    assert params.cost_estimates(4) == {k: pytest.approx(0.7 * cost[k], rel=0.02) for k in cost}


CostModelSettleRounds = 4  # CostModel::kSettleRounds (csrc/core/acceptance_cost.h)


def test_a_switch_measures_the_new_tier_against_the_others():
    # the first rounds at a tier after a switch are its ratio to the others: they move its cost, not the level
    params = goodput(3, candidate_steps=[1, 3, 7])
    for steps, seconds in ((3, 1.2), (3, 1.2), (1, 1.0), (1, 1.0), (7, 1.9), (7, 1.9)):
        assert params.current_tier == steps
        params.update([steps] * 4, seconds)  # all accepted: the deepest tier wins
    assert params.current_tier == 7
    for _ in range(CostModelSettleRounds - 2):  # with its 2 probe rounds: kSettleRounds in a row
        params.update([7] * 4, 2.3)  # tier 7 runs dearer than its probes said
    estimates = params.cost_estimates(4)
    assert estimates[1] == pytest.approx(1.0) and estimates[3] == pytest.approx(1.2)
    assert estimates[7] > 2.1


@pytest.mark.parametrize("candidates, slow", [
    ([1, 2], 1.3),      # within 15% of tier 2's goodput by its own cost
    ([1, 2, 3], 2.5),   # far off by its own cost, but the line through tiers 2 and 3 puts it close
])
def test_refresh_probes_remeasure_a_neighbour_priced_by_a_slow_probe(candidates, slow):
    # tier 1's start-up probe ran slow, so tier 2 looks best; tier 1 is 7% better. Refresh probes time tier 1
    # beside tier 2 again and the policy goes back to it; without them it never learns
    cost = {1: 1.0, 2: 1.15, 3: 1.3}

    def settle(refresh_interval):
        params = goodput(1, candidate_steps=candidates, refresh_interval=refresh_interval,
                         acceptance_model="geometric")
        rounds = iter(range(10**6))
        return run(params, 0.3, lambda k: cost[k] * (slow if next(rounds) < 2 else 1.0), 400, random.Random(7))

    assert settle(0)[-200:] == [2] * 200
    refreshed = settle(20)
    assert refreshed[-200:].count(1) >= 180, refreshed


def test_refresh_probes_visit_only_close_neighbours_and_come_back():
    cost = linear_cost(1.0, 0.1)
    params = goodput(3, candidate_steps=[0, 1, 3, 7], refresh_interval=20, blind_zero_margin=0.25)
    tiers = run(params, 0.95, cost, 200, random.Random(4))
    settled = tiers[20:]
    assert settled.count(7) >= 0.95 * len(settled)  # tier 3 is predicted 30% worse: never refreshed
    params = goodput(1, candidate_steps=[1, 2, 3], refresh_interval=20, probe_interval=1000)
    tiers = run(params, 0.45, linear_cost(1.0, 0.17), 200, random.Random(4))
    visits = [i for i in range(1, len(tiers)) if tiers[i] != tiers[i - 1]]
    assert visits, tiers
    for i in visits[2:]:  # past the start-up probes: each visit is probe_rounds (2) batches, then back
        if tiers[i - 1] == tiers[i + 2] != tiers[i]:
            assert tiers[i] == tiers[i + 1]


def test_one_slow_round_is_dropped_and_plain_jitter_is_learned():
    params = goodput(3, **quiet(candidate_steps=[1, 3, 7]))
    for _ in range(10):
        params.update([1], 1.0)
    params.update([1], 3.0)  # an outlier, followed by normal rounds: never learned
    params.update([1], 1.0)
    assert params.measured_costs()["greedy"][1][3] == pytest.approx(1.0)
    # round times with 30% log-normal jitter: the bar widens with the measured noise, so the tail is learned
    noisy = goodput(3, **quiet(candidate_steps=[1, 3, 7]))
    rng = random.Random(2)
    samples = [2.0 ** rng.gauss(0.0, 0.3 / 0.693) for _ in range(400)]
    for seconds in samples:
        noisy.update([1], seconds)
    assert noisy.measured_costs()["greedy"][1][3] == pytest.approx(sum(samples[-60:]) / 60, rel=0.2)
    assert sum(s > 1.6 for s in samples) > 10  # the sample did reach past the quiet machine's bar


def test_sampled_rounds_keep_their_own_table():
    # sampling pays per verified position: its costs must not stand in for greedy ones
    params = goodput(3, **dict(quiet(candidate_steps=[1, 3, 7]), probe_rounds=1))
    for cost in (2.0, 1.2, 3.6):  # probe 3, 1, 7 on sampled rounds; nothing accepted: the cheapest, 1
        params.update([0, 0], cost, sampled=True)
    assert params.current_tier == 1
    assert params.measured_costs() == {"greedy": {}, "sampled": {2: {1: 1.2, 3: 2.0, 7: 3.6}}}
    assert params.cost_estimates(2) == {k: pytest.approx(1 + 0.1 * k) for k in (1, 3, 7)}  # greedy: the prior
    params.update([1, 1], 1.0)  # one greedy round at 1: a line through it with the prior's relative slope
    assert params.cost_estimates(2) == {1: 1.0, 3: pytest.approx(1.3 / 1.1), 7: pytest.approx(1.7 / 1.1)}
    assert params.cost_estimates(2, sampled=True)[7] == 3.6


def test_phased_trace_reaches_the_best_tier_after_each_change():
    cost = linear_cost(1.0, 0.15)
    params = goodput(3, candidate_steps=[0, 1, 3, 7])
    rng = random.Random(7)
    phases = [0.9, 0.3, 0.9, 0.3]
    assert [best_tier(a, cost) for a in phases] == [7, 1, 7, 1]
    within = 20  # rounds after a phase change (warmup, EMA lag, one decision interval)
    for alpha in phases:
        tiers = run(params, alpha, cost, 80, rng)
        settled = tiers[within:]
        assert settled.count(best_tier(alpha, cost)) >= 0.9 * len(settled), (alpha, tiers)


def test_tier_zero_probes_back_up_and_returns_when_acceptance_recovers():
    cost = linear_cost(1.0, 0.3)
    params = goodput(3, candidate_steps=[0, 1, 3, 7], probe_interval=40)
    rng = random.Random(3)
    tiers = run(params, 0.05, cost, 200, rng)
    assert tiers[-100:].count(0) >= 94, tiers  # off, but for probes of 2 batches, ever rarer (10, 20, 40, 40...)
    assert 1 in tiers[-100:]  # the probe
    tiers = run(params, 0.95, cost, 80, rng)
    assert tiers[-20:] == [7] * 20, tiers  # the next probe sees the acceptance come back


def run_shadowed(params, alpha, cost, rounds, rng, batch=4, shadow_steps=7):
    """run(), with the shadow observations a deterministic drafter gives at tier 0: what drafts of
    shadow_steps tokens would have accepted, fed before each round's own verify."""
    tiers = []
    for _ in range(rounds):
        steps = params.current_tier
        tiers.append(steps)
        shadow = [geometric(alpha, shadow_steps, rng) for _ in range(batch)] if steps == 0 else []
        params.observe(RoundObservation(shadow_accept_lengths=shadow, shadow_steps=shadow_steps,
                                        accept_lengths=[geometric(alpha, steps, rng) for _ in range(batch)],
                                        round_seconds=cost(steps)))
    return tiers


def test_shadow_observations_replace_tier_zero_probes():
    cost = linear_cost(1.0, 0.3)
    params = goodput(3, candidate_steps=[0, 1, 3, 7], probe_interval=40)
    rng = random.Random(3)
    tiers = run_shadowed(params, 0.05, cost, 200, rng)
    assert tiers[-100:] == [0] * 100, tiers  # off, and no probe: the shadows say the drafts would fail
    tiers = run_shadowed(params, 0.95, cost, 25, rng)
    # the shadows see the acceptance come back at once (a phase change), the verifies then carry it to 7;
    # the blind policy stays off until its next probe
    assert 0 not in tiers[2:] and tiers[-5:] == [7] * 5, tiers
    blind = goodput(3, candidate_steps=[0, 1, 3, 7], probe_interval=40)
    run(blind, 0.05, cost, 200, random.Random(3))
    blind_tiers = run(blind, 0.95, cost, 25, random.Random(4))
    assert blind_tiers[:4] == [0] * 4, blind_tiers


def test_a_drafter_with_shadows_is_never_probed_out_of_tier_zero():
    # NGRAM at tier 0 in prose: most rounds check nothing (no lookup), now and then a check fails. A round
    # without a check is one where a drafting tier would have run a plain decode: nothing to probe for. A blind
    # drafter (no shadows) is probed as before
    cost = linear_cost(1.0, 0.3)

    def settle(shadows):
        params = goodput(0, candidate_steps=[0, 1, 3, 7], probe_rounds=0, warmup_batches=0)
        if shadows:
            params.expect_shadows()
        rng, tiers = random.Random(2), []
        for round_index in range(300):
            steps = params.current_tier
            tiers.append(steps)
            shadow = [0, 0] if steps == 0 and shadows and round_index % 16 == 0 else []
            params.observe(RoundObservation(shadow_accept_lengths=shadow, shadow_steps=7, round_seconds=cost(steps),
                                            accept_lengths=[geometric(0.05, steps, rng) for _ in range(2)]))
        return tiers

    assert set(settle(shadows=True)) == {0}
    assert set(settle(shadows=False)) > {0}  # the blind drafter's probes


def test_a_phase_change_forgets_the_old_phase_s_rates():
    # NGRAM-like: a long high phase at 7, then prose where tier 1 costs 1.2x tier 0 and nothing is accepted. The
    # 1.5x phase change leaves 7 within a few batches; the decisions after it must not take tier 1 (or 3) back up
    # on the high phase's memory. With that memory kept whole, tier 1 ran for 10 batches of the last 20 here
    for seed in (2, 9, 10):
        params = goodput(7, candidate_steps=[0, 1, 3, 7], probe_rounds=0, warmup_batches=0)
        params.expect_shadows()
        cost = linear_cost(1.0, 0.2)
        rng = random.Random(seed)
        run_shadowed(params, 0.97, cost, 300, rng, batch=2)
        assert params.current_tier == 7
        low = run_shadowed(params, 0.02, cost, 40, rng, batch=2)
        assert low[-20:] == [0] * 20 and low.index(0) <= 16, (seed, low)


def test_plain_rounds_in_a_drafting_tier_s_place_time_tier_zero_beside_it():
    # tier 0's start-up probes ran slow, so tier 1 looks best though its drafts hardly pay. A drafter with
    # nothing to look up (NGRAM) runs plain decodes at tier 1: fed as tier-0 rounds, they price tier 0 afresh
    # and the policy goes back to it; without them it never learns
    cost = {0: 1.0, 1: 1.12, 3: 1.36}

    def settle(plain):
        params = goodput(1, candidate_steps=[0, 1, 3], acceptance_model="geometric")
        rng, tiers = random.Random(5), []
        for round_index in range(300):
            steps = params.current_tier
            tiers.append(steps)
            seconds = cost[steps] * (1.4 if steps == 0 and round_index < 6 else 1.0)
            if plain and steps:
                params.observe(RoundObservation(plain_requests=4, round_seconds=cost[0]))
            params.update([geometric(0.03, steps, rng) for _ in range(4)], seconds)
        return params, tiers

    params, tiers = settle(plain=False)
    assert tiers[-100:] == [1] * 100
    assert params.cost_estimates(4)[0] == pytest.approx(1.4)
    params, tiers = settle(plain=True)
    assert tiers[-100:].count(0) >= 90, tiers


def test_plain_rounds_are_ignored_at_tier_zero_without_tier_zero_and_by_sglang():
    at_zero = goodput(0, **quiet(candidate_steps=[0, 1]))
    at_zero.update([0] * 4, 1.0)
    at_zero.observe(RoundObservation(plain_requests=4, round_seconds=5.0))  # tier 0 times itself: a plain round there is its own verify
    assert at_zero.cost_estimates(4)[0] == pytest.approx(1.0)
    no_zero = goodput(1, **quiet(candidate_steps=[1, 3]))
    no_zero.update([1] * 4, 1.0)
    before = no_zero.cost_estimates(4)
    no_zero.observe(RoundObservation(plain_requests=4, round_seconds=0.1))
    assert no_zero.cost_estimates(4) == before
    sglang = AdaptiveSpeculativeParams(1, AdaptiveConfig(policy="sglang", candidate_steps=[0, 1]))
    sglang.observe(RoundObservation(plain_requests=4, round_seconds=1.0))
    assert sglang.current_tier == 1 and sglang.num_batches == 0


def test_blind_zero_margin_holds_a_blind_drafter_off_tier_zero_unless_it_clearly_wins():
    # tier 1 costs 1.15x tier 0; at alpha 0.05 tier 0 predicts 1 / 0.913 = 9.5% more goodput, at alpha 0 15%
    cost = linear_cost(1.0, 0.15)

    def settle(alpha, margin, shadows=False):
        params = goodput(1, candidate_steps=[0, 1], probe_interval=40, blind_zero_margin=margin)
        if shadows:
            params.expect_shadows()
        return run(params, alpha, cost, 120, random.Random(5))[-60:]

    assert settle(0.05, 0.0).count(0) >= 50  # no margin: off to tier 0, but for probes
    assert settle(0.05, 0.25) == [1] * 60     # blind (EAGLE): a 9.5% gain is not worth going blind for
    assert settle(0.0, 0.25) == [1] * 60      # nor 15%
    assert settle(0.0, 0.10).count(0) >= 50   # a smaller margin than the gain: it goes
    # a drafter that sees at tier 0 (NGRAM's shadows) is not held back
    assert settle(0.05, 0.25, shadows=True).count(0) >= 50


def test_shadow_observations_are_ignored_off_tier_zero_and_by_sglang():
    params = goodput(3, **quiet(ema_alpha=1.0))
    params.update([3, 3])
    params.observe(RoundObservation(shadow_accept_lengths=[0, 0, 0, 0], shadow_steps=7))  # at tier 3 the verifies are the observations
    assert params.alpha == pytest.approx(1.0)
    sglang = AdaptiveSpeculativeParams(3, AdaptiveConfig(policy="sglang"))
    sglang.observe(RoundObservation(shadow_accept_lengths=[7, 7], shadow_steps=7))
    assert sglang.num_batches == 0 and sglang.current_tier == 3
    at_zero = goodput(0, **quiet(ema_alpha=1.0))
    at_zero.observe(RoundObservation(shadow_accept_lengths=[7, 0], shadow_steps=7))  # 7 successes, 1 failure: a batch seen at depth 7, none counted
    assert at_zero.alpha == pytest.approx(7 / 8) and at_zero.num_batches == 0
    assert at_zero.position_acceptance(1) < at_zero.position_acceptance(2)  # position 1 saw the one failure
    with pytest.raises(TypeError):
        at_zero.observe(RoundObservation(shadow_accept_lengths=[1], shadow_steps="seven"))


def test_position_dependent_acceptance_does_not_flap():
    # later drafts accepted less often than the model assumes: tier 1 promises too much for 7
    probabilities = [0.95, 0.9, 0.8, 0.5, 0.3, 0.2, 0.1]
    rng = random.Random(1)

    def draw(steps):
        accepted = 0
        while accepted < steps and rng.random() < probabilities[accepted]:
            accepted += 1
        return accepted

    params = goodput(3, candidate_steps=[0, 1, 3, 7])
    switches = 0
    for _ in range(400):
        before = params.current_tier
        params.update([draw(before) for _ in range(4)], 1.0 + 0.15 * before)
        switches += params.current_tier != before
    assert switches <= 20, switches  # 400 batches = 80 decisions; unguarded it flaps on most of them


def test_a_new_phase_lifts_the_bounce_guard():
    params = goodput(1, candidate_steps=[1, 3, 7], probe_rounds=0, warmup_batches=0)

    def feed(accepted_fraction, batches):
        for _ in range(batches):
            steps = params.current_tier
            params.update([round(accepted_fraction * steps)] * 4, 1.0 + 0.05 * steps)

    # four bounces: up to 7 on full acceptance (at once: a phase change), back down at the next decisions
    # when nothing is accepted there
    bounces = 0
    for _ in range(200):
        if bounces == 4:
            break
        feed(1.0, 1)
        if params.current_tier == 7:
            feed(0.0, 10)
            bounces += params.current_tier < 7
    assert bounces == 4 and params.current_tier < 7
    # the guard now blocks up moves for 2^4 decisions; a phase where every draft is accepted is a 2-4x
    # predicted gain, not the small over-promise the guard is for: up at the next decision
    tiers = []
    for _ in range(10):
        feed(1.0, 1)
        tiers.append(params.current_tier)
    assert 7 in tiers, tiers  # (the guard against small over-promises: test_position_dependent_acceptance_...)


def test_sglang_ignores_round_seconds():
    rng = random.Random(5)
    batches = [[rng.randint(0, 7) for _ in range(3)] for _ in range(100)]
    timed = AdaptiveSpeculativeParams(3, AdaptiveConfig(policy="sglang"))
    untimed = AdaptiveSpeculativeParams(3, AdaptiveConfig(policy="sglang"))
    for batch in batches:
        assert timed.update(batch, 0.5 + rng.random()) == untimed.update(batch)
        assert timed.current_tier == untimed.current_tier and timed.ema == untimed.ema


# ---- positional acceptance model ------------------------------------------------------------------------------


def test_position_acceptance_hand_computed():
    params = goodput(3, **quiet(ema_alpha=1.0, acceptance_model="positional"))
    params.update([3, 1, 0, 2])  # pooled alpha 6 / 9
    alpha = 6 / 9
    # position i: reached by requests with a >= i - 1, accepted by a >= i; one pseudo-trial at alpha
    assert params.position_acceptance(1) == pytest.approx((3 + alpha) / (4 + 1))
    assert params.position_acceptance(2) == pytest.approx((2 + alpha) / (3 + 1))
    assert params.position_acceptance(3) == pytest.approx((1 + alpha) / (2 + 1))
    assert params.position_acceptance(4) == pytest.approx(alpha)  # never drafted
    h = [params.position_acceptance(i) for i in (1, 2, 3)]
    # beyond the current tier the deepest observed position stands in
    survive, tokens = 1.0, 1.0
    for i in range(1, 8):
        survive *= h[min(i, 3) - 1]
        tokens += survive
    assert params.model_tokens(7) == pytest.approx(tokens)
    assert params.model_tokens(1) == pytest.approx(1 + h[0])


def test_geometric_model_tokens_are_expected_tokens_at_alpha():
    params = goodput(3, **quiet(ema_alpha=1.0))
    params.update([3, 1, 0, 2])
    assert params.model_tokens(7) == pytest.approx(expected_tokens(6 / 9, 7))


def test_positional_model_sees_through_bursty_acceptance():
    # NGRAM-like: in every batch one request's match runs past 7 drafts, the other's fails at once. At tier 3 the
    # geometric alpha is 3/4, which prices tier 7 at 3.6 tokens (+1.9%: under min_gain, it stays); the rates per
    # position (about 1/2, then 1, 1) price it near the truth (4.5 tokens, +36%).
    cost = {1: 1.1, 3: 1.2, 7: 1.55}

    def tiers_of(model):
        params = goodput(3, **dict(quiet(candidate_steps=[1, 3, 7], acceptance_model=model),
                                   warmup_batches=0, update_interval=1))
        tiers = []
        for _ in range(30):
            steps = params.current_tier
            tiers.append(steps)
            params.update([steps, 0], cost[steps])
        return tiers

    assert tiers_of("positional")[10:] == [7] * 20
    assert tiers_of("geometric") == [3] * 30


def test_a_check_past_the_chain_moves_that_position_alone():
    params = goodput(2, **quiet(ema_alpha=1.0, acceptance_model="positional", candidate_steps=[1, 2, 3]))
    params.update([2, 1, 2])  # pooled alpha 5 / 6
    alpha = 5 / 6
    before = [params.position_acceptance(i) for i in (1, 2)]
    # the requests that accepted both drafts: one's next draft accepted, one's rejected; -1: not checked
    params.observe(RoundObservation(deep_checks=[1, -1, 0]))
    assert params.position_acceptance(3) == pytest.approx((1 + alpha) / (2 + 1))
    assert [params.position_acceptance(i) for i in (1, 2)] == before
    assert params.alpha == pytest.approx(alpha)
    params.observe(RoundObservation(deep_checks=[-1, -1, -1]))  # nothing checked: nothing moves
    assert params.position_acceptance(3) == pytest.approx((1 + alpha) / (2 + 1))


def test_checks_are_ignored_at_tier_zero_and_at_trees():
    for initial, candidates, trees in ((0, [0, 1, 2], []), (20204, [1, 2], [[2, 2, 4]])):
        params = goodput(initial, **quiet(ema_alpha=1.0, acceptance_model="positional", candidate_steps=candidates,
                                          candidate_trees=trees))
        params.observe(RoundObservation(deep_checks=[1, 1]))
        assert [params.position_acceptance(i) for i in (1, 2, 3)] == [0.5] * 3


def _rising_greedy_trace(checks, seed=5, sampled=False):
    """EAGLE's greedy high phase at batch 2 after a phase where tier 2 paid and position 3 rarely accepted: in
    the second, positions 1-3 accepted at 0.69 / 0.71 / 0.93 given the earlier ones (the tuning workload's
    static-3 verifies), rounds costing what tiers 1-3 cost there (ms; tier 3 a little cheaper: in the second
    phase it pays 4.6% over tier 2, but priced with position 2's rate standing in for position 3's, 0.6%, under
    min_gain). Returns the tier of each round of the second phase."""
    cost = {1: 16.8, 2: 20.8, 3: 24.0}
    params = goodput(2, candidate_steps=[1, 2, 3], warmup_batches=0, acceptance_model="positional")
    rng = random.Random(seed)
    tiers = []
    for round_index in range(400):
        rates = (0.65, 0.75, 0.2) if round_index < 100 else (0.69, 0.71, 0.93)
        steps = params.current_tier
        tiers.append(steps)
        accepted, outcomes = [], []
        for _ in range(2):
            a = 0
            while a < steps and rng.random() < rates[a]:
                a += 1
            accepted.append(a)
            outcomes.append(int(rng.random() < rates[steps]) if a == steps < 3 else -1)
        params.observe(RoundObservation(accept_lengths=accepted, round_seconds=cost[steps] * 1e-3, sampled=sampled,
                                        deep_checks=outcomes if checks else []))
    return tiers[50:100], tiers[100:]


def test_checks_past_the_chain_let_a_deeper_chain_be_priced_by_its_own_rate():
    # without checks, tier 2 prices tier 3 with position 2's rate, and reaches it only when noise lifts that
    # rate; with them it sees position 3's own rate: in the first phase (0.2) it stays at tier 2 more, in the
    # second (0.93) it spends more of it at tier 3 and never long at tier 2
    def summary(checks):
        first, second = zip(*(_rising_greedy_trace(checks, seed) for seed in range(20)))
        return [part.count(2) for part in first], [part[:130].count(3) for part in second]

    first_without, second_without = summary(checks=False)
    first_with, second_with = summary(checks=True)
    assert sum(first_with) >= sum(first_without) + 100, (first_with, first_without)
    assert sum(second_with) >= sum(second_without) + 100, (second_with, second_without)
    assert min(second_with) >= 20, second_with


def test_checks_past_the_chain_price_the_deeper_tiers_until_a_sampled_round():
    # drafters check greedy rounds only: after a sampled round position 2's rate stands in for position 3 again,
    # until the next checks
    params = goodput(2, **quiet(ema_alpha=1.0, acceptance_model="positional", candidate_steps=[1, 2, 3]))
    params.update([2, 1])  # position 2 reached by one request, accepted
    stand_in = params.model_tokens(3)
    h1, h2 = params.position_acceptance(1), params.position_acceptance(2)
    assert stand_in == pytest.approx(1 + h1 + h1 * h2 + h1 * h2 * h2)
    params.observe(RoundObservation(deep_checks=[0, -1]))  # the request that accepted both: its third draft rejected
    h3 = params.position_acceptance(3)
    assert h3 < h2 and params.model_tokens(3) == pytest.approx(1 + h1 + h1 * h2 + h1 * h2 * h3)
    for sampled in (False, True):  # a greedy round: still read; a sampled one: the stand-in again
        params.update([2, 1], None, sampled)
        h1, h2, h3 = (params.position_acceptance(i) for i in (1, 2, 3))
        assert h3 < h2 and params.model_tokens(3) == pytest.approx(1 + h1 + h1 * h2 + h1 * h2 * (h2 if sampled else h3))


def test_each_kind_of_round_keeps_its_own_acceptance():
    # greedy and sampled rounds learn apart: a sampled round reads what sampled rounds accepted, a greedy one what
    # greedy ones did; a kind's first round starts from the other kind's counts
    params = goodput(3, **quiet(ema_alpha=0.5, candidate_steps=[1, 3, 7]))
    keep = 0.5 ** (2 / 4)  # what a batch of 2 leaves of the old counts; it adds its own with weight 0.5

    def batch(counts, successes, trials):
        return keep * counts[0] + 0.5 * successes, keep * counts[1] + 0.5 * trials

    greedy = (0.5 * 6, 0.5 * 6)
    params.update([3, 3], None, False)
    assert params.alpha == pytest.approx(1.0)
    sampled = batch(greedy, 0, 2)  # the first sampled round: the greedy counts, then its own
    params.update([0, 0], None, True)
    assert params.alpha == pytest.approx(sampled[0] / sampled[1])
    greedy = batch(greedy, 5, 6)  # greedy again: the greedy counts, untouched by the sampled round
    params.update([3, 2], None, False)
    assert params.alpha == pytest.approx(greedy[0] / greedy[1])
    sampled = batch(sampled, 1, 3)
    params.update([1, 0], None, True)
    assert params.alpha == pytest.approx(sampled[0] / sampled[1])


def _alternating_kinds_trace(seed):
    """Greedy phases (every draft accepted at 0.9) alternating with sampled ones (0.15), 80 batches of 2 each,
    decisions every 5 batches. Returns per phase the tiers of its rounds."""
    cost = {1: 1.1, 3: 1.3, 7: 1.8}
    params = goodput(1, candidate_steps=[1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=5,
                     acceptance_model="positional")
    rng = random.Random(seed)
    phases = []
    for phase in range(4):
        sampled = phase % 2 == 1
        alpha = 0.15 if sampled else 0.9
        tiers = []
        for _ in range(80):
            steps = params.current_tier
            tiers.append(steps)
            params.update([geometric(alpha, steps, rng) for _ in range(2)], cost[steps], sampled)
        phases.append(tiers)
    return phases


def test_a_kind_seen_before_starts_its_phase_at_its_own_tier():
    # the second greedy phase starts from what greedy rounds accepted in the first: it leaves tier 1 within a
    # decision, where one estimate for both kinds held the sampled phase's rates for tens of rounds
    for seed in range(10):
        greedy, sampled, greedy_again, _ = _alternating_kinds_trace(seed)
        assert greedy[-1] == 7 and sampled[-1] == 1, (greedy[-10:], sampled[-10:])
        assert greedy_again[6] == 7, greedy_again[:10]
        assert greedy_again.count(1) <= 5, greedy_again[:20]


def _kinds_trace(kinds, seed, batches=60):
    """Phases of `batches` batches of 2, greedy (False: every draft accepted at 0.8, tier 3 pays 1.31x tier 1) or
    sampled (True: 0.3, tier 1 pays 1.15x tier 3), decisions every 30 batches; neither gain reaches the 1.5x of a
    phase change. Returns per phase the tiers of its rounds."""
    cost = {1: 1.0, 3: 1.25}
    params = goodput(1, candidate_steps=[1, 3], probe_rounds=0, warmup_batches=0, update_interval=30,
                     acceptance_model="positional")
    rng = random.Random(seed)
    phases = []
    for sampled in kinds:
        tiers = []
        for _ in range(batches):
            steps = params.current_tier
            tiers.append(steps)
            params.update([geometric(0.3 if sampled else 0.8, steps, rng) for _ in range(2)], cost[steps], sampled)
        phases.append(tiers)
    return phases


def test_a_kind_back_after_a_run_of_the_other_is_decided_on_at_once():
    # greedy, sampled, greedy, sampled, 60 batches each, decisions every 30: the first sampled phase (its kind
    # first seen, its estimate a copy of greedy's) leaves tier 3 at a decision if at all; each later phase, its
    # kind back after 60 rounds of the other, is at its own kind's tier from its second round on, where it waited
    # for the next decision (the last phase: 29 rounds at tier 3, to batch 210)
    for seed in range(10):
        greedy, sampled, greedy_again, sampled_again = _kinds_trace([False, True, False, True], seed)
        assert greedy[-1] == 3 and sampled[0] == 3, (greedy, sampled)
        assert set(greedy_again[1:]) == {3}, greedy_again
        assert sampled_again[0] == 3 and set(sampled_again[1:]) == {1}, sampled_again


@pytest.mark.parametrize("acceptance_model", ["geometric", "positional"])
def test_a_phase_change_is_acted_on_between_decisions(acceptance_model):
    # decisions only every 25 batches, yet a jump from prose-like to full acceptance moves up within a few
    # batches, and the collapse back moves down as fast: a 1.5x predicted gain does not wait for the interval
    params = goodput(1, candidate_steps=[1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=25,
                     acceptance_model=acceptance_model)
    cost = lambda k: 1.0 + 0.2 * k
    rng = random.Random(3)
    run(params, 0.15, cost, 100, rng)
    assert params.current_tier == 1
    high = run(params, 1.0, cost, 14, rng)
    assert high[-1] == 7 and high.index(7) <= 6, high  # the next decision is 25 batches away
    low = run(params, 0.0, cost, 14, rng)
    assert low[-1] == 1, low
    if acceptance_model == "geometric":  # positional keeps the deeper positions' rates, which the empty rounds
        assert low.index(1) <= 6, low    # never reach: its down move waits for the decision (batch 125)


def test_noisy_acceptance_is_left_to_the_interval():
    # batch-to-batch noise at a steady acceptance rate never reaches a 1.5x predicted gain: with decisions only
    # every 1000 batches, 400 noisy batches switch nothing
    for acceptance_model in ("geometric", "positional"):
        params = goodput(3, candidate_steps=[1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=1000,
                         acceptance_model=acceptance_model)
        tiers = run(params, 0.55, lambda k: 1.0 + 0.1 * k, 400, random.Random(11), batch=2)
        assert set(tiers) == {3}, acceptance_model


@pytest.mark.parametrize("acceptance_model", ["geometric", "positional"])
def test_one_lucky_request_is_not_a_phase(acceptance_model):
    # batch 1, EAGLE-like prose: each draft accepted with probability 0.37, tier 7 dear. Two accepted rounds in
    # a row push a short-memory estimate past 1.5x; only 6 requests in a row pointing the same way move the
    # tier between decisions (none here: decisions every 1000 batches)
    up_moves = 0
    for seed in range(5):
        params = goodput(1, candidate_steps=[1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=1000,
                         acceptance_model=acceptance_model)
        tiers = run(params, 0.37, lambda k: 1.0 + 0.1 * k, 800, random.Random(seed), batch=1)
        up_moves += sum(b > a for a, b in zip(tiers, tiers[1:]))
    assert up_moves <= 1  # acting on 4 requests in a row pointing up: 8 up moves in these 4000 batches


def test_one_lucky_lookup_at_tier_zero_is_not_a_phase():
    # batch 2 at tier 0, NGRAM-like: one request's lookup checked every 4th round (the shadows), drafts failing
    # but for one lucky lookup that would have accepted all 7. That is one request's evidence, not a phase: the
    # policy stays at tier 0 between decisions. Both requests' lookups accepting in one round are a phase.
    def feed(params, rounds, lucky_at, shadow):
        tiers = []
        for round_index in range(rounds):
            tiers.append(params.current_tier)
            checks = (shadow if round_index == lucky_at else [0]) if params.current_tier == 0 and round_index % 4 == 0 \
                else []
            params.observe(RoundObservation(shadow_accept_lengths=checks, shadow_steps=7, accept_lengths=[0, 0],
                                            round_seconds=1.0 + 0.03 * params.current_tier))
        return tiers

    for seed_round in (40, 80, 120):
        params = goodput(0, candidate_steps=[0, 1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=1000,
                         probe_interval=10_000)
        params.expect_shadows()
        assert set(feed(params, 200, seed_round, [7])) == {0}
    params = goodput(0, candidate_steps=[0, 1, 3, 7], probe_rounds=0, warmup_batches=0, update_interval=1000,
                     probe_interval=10_000)
    params.expect_shadows()
    tiers = feed(params, 100, 40, [7, 7])
    assert tiers[40] == 0 and tiers[41] > 0, tiers[36:46]


def test_the_noise_margin_holds_tier_zero_against_its_shadows_noise_and_not_against_a_real_gain():
    # NGRAM-like, batch 2 at tier 0 in sampled prose: each round's shadows are what drafts would accept, the
    # first at rate 0.15, where tier 1 (1.2x tier 0's cost) would lose 4%. The decisions' estimate rests on about
    # 36 requests, so its rate swings by about 0.06 and crosses tier 1's break-even (0.24) now and then: without
    # the margin the policy runs tier 1 on those swings (786 of these 4800 rounds off tier 0), with it a third as
    # often (269); a rate of 0.5 (tier 1 pays 25%) still moves it within a few decisions.
    cost = {0: 1.0, 1: 1.2, 3: 1.6, 7: 2.4}.__getitem__

    def prose(noise_margin, seed, rate=0.15, rounds=600):
        params = goodput(0, candidate_steps=[0, 1, 3, 7], acceptance_model="positional", probe_rounds=0,
                         noise_margin=noise_margin)
        params.expect_shadows()
        return params, run_shadowed(params, rate, cost, rounds, random.Random(seed), batch=2)

    off = [sum(t != 0 for t in prose(0.0, seed)[1]) for seed in range(8)]
    on = [sum(t != 0 for t in prose(1.0, seed)[1]) for seed in range(8)]
    assert sum(off) >= 400 and sum(on) <= sum(off) / 2, (off, on)
    for seed in range(4):
        params, tiers = prose(1.0, seed, rate=0.5, rounds=60)
        assert 0 not in tiers[-20:], tiers


def test_the_noise_margin_leaves_down_moves_alone():
    # EAGLE-like at tier 3, then acceptance falls from 0.9 to 0.5: tier 2 then pays 5% more, not a phase change,
    # so a decision makes the move, on an estimate that lags the falling rate. A margin there would hold tier 3
    # longer (the symmetric margin did here), and the excursions it cannot prevent too. The way down is the same
    # with the margin as without it.
    cost = {1: 1.0, 2: 1.15, 3: 1.3}.__getitem__

    def falling(noise_margin, seed):
        params = goodput(3, candidate_steps=[1, 2, 3], acceptance_model="positional", probe_rounds=0,
                         warmup_batches=0, noise_margin=noise_margin)
        rng = random.Random(seed)
        run(params, 0.9, cost, 200, rng, batch=2)
        assert params.current_tier == 3
        return run(params, 0.5, cost, 200, rng, batch=2)

    for seed in range(6):
        off, on = falling(0.0, seed), falling(1.0, seed)
        first_down = next(i for i, tier in enumerate(off) if tier < 3)
        assert first_down <= 160 and on[:first_down + 1] == off[:first_down + 1], (off, on)


def test_tier_zero_moves_up_only_on_fresh_shadows():
    # NGRAM-like: a high phase at 7, then prose. The collapse is a phase change to tier 0; no lookup matches for a
    # while, so no shadow comes. The estimate still holds the old phase's rates (a phase change keeps 5% of the
    # counts, not less of the rates): a decision on them took tier 0 straight back up, to a tier that verifies
    # drafts that all fail. With no fresh shadows tier 0 stays; fresh ones still move it at once.
    cost = {0: 1.0, 1: 1.2, 3: 1.6, 7: 2.4}.__getitem__
    for seed in range(4):
        params = goodput(7, candidate_steps=[0, 1, 3, 7], acceptance_model="positional", probe_rounds=0,
                         warmup_batches=0)
        params.expect_shadows()
        run_shadowed(params, 0.97, cost, 300, random.Random(seed), batch=2)
        collapse = []
        while params.current_tier and len(collapse) < 20:
            collapse.append(params.current_tier)
            params.update([0, 0], cost(params.current_tier))
        assert params.current_tier == 0, collapse
        quiet_rounds = run(params, 0.0, cost, 30, random.Random(seed), batch=2)  # every draft rejected, no shadow
        assert quiet_rounds == [0] * 30, quiet_rounds
        back = run_shadowed(params, 0.97, cost, 12, random.Random(seed), batch=2)
        assert back[-1] == 7, back


def test_the_collapse_test_leaves_tier_seven_within_three_failed_first_drafts():
    # NGRAM-like: a high phase at 7 (first drafts accepted at 0.97, batch 2), then prose, where most rounds have
    # nothing to look up (plain decodes: no evidence) and a verify has one request speculating, failing at its
    # first draft, for the price of about 2.8 plain rounds. The short-memory estimate took 12-13 such verifies to
    # act; the collapse test (log 100 nats) takes 2, or 3 where the rate was read near 0.95.
    cost = {0: 1.0, 1: 1.17, 3: 1.6, 7: 2.75}.__getitem__

    def verifies_at_seven(collapse_evidence, seed):
        params = goodput(7, candidate_steps=[0, 1, 3, 7], acceptance_model="positional", probe_rounds=0,
                         warmup_batches=0, collapse_evidence=collapse_evidence)
        params.expect_shadows()
        run_shadowed(params, 0.97, cost, 300, random.Random(seed), batch=2)
        assert params.current_tier == 7
        verifies = 0
        while params.current_tier == 7 and verifies < 30:
            params.update([0], cost(7), True)
            verifies += 1
        return verifies

    for seed in range(6):
        assert verifies_at_seven(4.6, seed) <= 3
        assert verifies_at_seven(0.0, seed) >= 10


def test_the_collapse_test_holds_still_at_a_steady_rate():
    # A run of failures at a steady rate now and then reaches the threshold; the short-memory estimate rebuilt
    # from them seldom finds a lower tier that pays, and a move made comes back up at the next phase change or
    # decision. NGRAM-like at 0.97 (batch 2, tier 7) and EAGLE-like at 0.7 (batch 1, tier 3 of 1-3): under 1% of
    # the rounds are spent off the best tier (none without the test). At a threshold of 3 nats the EAGLE-like
    # policy spent 3.5%, at 1 nat 93%.
    for rate, batch, candidates, top, cost in (
        (0.97, 2, [0, 1, 3, 7], 7, {0: 1.0, 1: 1.17, 3: 1.6, 7: 2.75}.__getitem__),
        (0.7, 1, [1, 2, 3], 3, {1: 1.0, 2: 1.1, 3: 1.2}.__getitem__),
    ):
        off = 0
        for seed in range(4):
            params = goodput(top, candidate_steps=candidates, acceptance_model="positional", probe_rounds=0,
                             warmup_batches=0, collapse_evidence=4.6)
            tiers = run(params, rate, cost, 3000, random.Random(seed), batch=batch)
            off += sum(t != top for t in tiers[100:])
        assert off <= 0.01 * 4 * 2900, (rate, off)


def test_drafting_can_pay_only_while_a_full_draft_would_beat_a_plain_decode():
    """Tier-0 checks pause (``drafting_can_pay`` False) only where tier 0 was timed and every drafting tier costs
    more than (depth + 1) plain decodes at that batch: no acceptance a check could show would move the policy."""
    def timed(costs, batch):
        # start-up probing times every candidate (3, then 0 and 1), all drafts rejected
        params = goodput(3, candidate_steps=[0, 1, 3], probe_rounds=2, warmup_batches=1000)
        assert params.drafting_can_pay()  # nothing timed yet
        for _ in range(6):
            params.update([0] * batch, costs[params.current_tier])
        assert params.current_tier == 0
        return params

    every_row_counts = timed({0: 1.0, 1: 2.1, 3: 4.2}, 8)  # batch 8 on the Xeon: 16 rows 2.1x 8
    assert not every_row_counts.drafting_can_pay(), every_row_counts.cost_estimates(8)
    every_row_counts.update([0, 0], 1.0)  # batch 2: another table, where the batch-8 table's ratios stand in
    assert not every_row_counts.drafting_can_pay()
    assert timed({0: 1.0, 1: 1.9, 3: 4.2}, 8).drafting_can_pay()  # tier 1 under 2 plain decodes: it could pay
    assert goodput(0).drafting_can_pay()
