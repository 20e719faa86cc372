"""The adaptive controller over a state pool: fed one round result a call, it switches the pool, nothing else."""

import pytest

from specswap import AdaptiveController, SpecRuntimeState, StatePool
from specswap.tier import Tier
from specswap.worker import RoundResult
from specswap.worker.drafter import Shadow

FAST = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}


def pool_of(tiers=(1, 3, 7), start=3):
    """A pool with a placeholder state per tier (stages are opaque to the controller), ``start`` active."""
    pool = StatePool()
    for steps in tiers:
        pool.register(SpecRuntimeState(steps, steps + 1, draft=f"draft{steps}", verify=f"verify{steps}",
                                       draft_extend=f"extend{steps}", round=f"round{steps}"))
    pool.activate(start)
    return pool


def verified(accept_lengths, tier, seconds=0.0, sampled=False, speculating=None, ran=None, shadow=None):
    """The result of a round of ``tier`` (``ran``: the tier it really ran, 0 for a plain decode in its place)."""
    ran = tier if ran is None else ran
    speculating = [True] * len(accept_lengths) if speculating is None else speculating
    return RoundResult([[0]] * len(accept_lengths), list(accept_lengths), Tier.from_key(tier), Tier.from_key(ran),
                       seconds, sampled, speculating, shadow)


def test_the_start_up_tier_is_the_policy_s_and_every_candidate_must_be_in_the_pool():
    pool = pool_of(start=3)
    controller = AdaptiveController(pool, None)
    assert controller.candidate_tiers == [1, 3, 7] and pool.active_tier == 3
    with pytest.raises(ValueError, match=r"candidate tiers \[2\] have no state in the pool"):
        AdaptiveController(pool_of(), {"candidate_steps": [1, 2, 3]})
    with pytest.raises(ValueError, match="no active tier"):
        AdaptiveController(StatePool(), None)


def test_a_switch_activates_the_prebuilt_state_and_nothing_else():
    pool = pool_of()
    controller = AdaptiveController(pool, FAST)
    before = pool.acquire()
    assert controller.observe(verified([3, 3], 3)) == 7
    state = pool.acquire()
    assert state.speculative_num_steps == 7 and state.speculative_num_draft_tokens == 8 and state.round == "round7"
    assert before.round == "round3"  # a holder of the old state still sees it whole
    assert controller.observe(verified([0], 7)) == 1 and pool.active_tier == 1
    assert controller.observe(verified([], 1)) is None
    stats = controller.stats()
    assert stats["num_switches"] == 2 and stats["current_steps"] == 1
    assert [row["speculative_num_steps"] for row in stats["tiers"]] == [1, 3, 7]


def test_thousands_of_switches_only_move_the_pool():
    pool = pool_of()
    controller = AdaptiveController(pool, FAST)
    for i in range(3000):
        controller.observe(verified([6] if i % 2 else [0], pool.active_tier))
    assert controller.stats()["num_switches"] == 3000 and len(pool) == 3


def test_requests_with_speculation_off_are_no_acceptance_observation():
    pool = pool_of()
    controller = AdaptiveController(pool, FAST)
    # the request that speculated accepted nothing; the one with speculation off (accept 0 too) is left out
    assert controller.observe(verified([0, 0], 3, speculating=[False, False])) is None
    assert controller.params.num_batches == 0
    assert controller.observe(verified([3, 0], 3, speculating=[True, False])) == 7  # ema 3: up, as for [3] alone


def test_a_plain_decode_in_the_tier_s_place_is_timed_as_tier_zero_never_a_switch():
    pool = pool_of(tiers=(0, 1, 3), start=3)
    controller = AdaptiveController(pool, {"policy": "goodput", "candidate_steps": [0, 1, 3], "probe_rounds": 0,
                                           **FAST})
    assert controller.observe(verified([0, 0], 3, seconds=0.5, ran=0)) is None
    assert controller.params.num_batches == 0
    assert controller.stats()["measured_costs"]["greedy"][2][0] == 0.5


def test_a_plain_decode_s_lookup_is_charged_to_the_drafting_tier_not_to_tier_zero():
    # NGRAM at tier 3: each plain round cost 0.5 s, 0.1 of it the lookup that found nothing. Tier 0 is priced
    # without the lookup (0.4); the lookups are added to tier 3's next verify (1.0 + 0.2), at most a quarter of
    # its own time (the third verify: 0.8 of lookups, charged 0.25)
    pool = pool_of(tiers=(0, 1, 3), start=3)
    controller = AdaptiveController(pool, {"policy": "goodput", "candidate_steps": [0, 1, 3], "probe_rounds": 0,
                                           "ema_alpha": 1.0, "warmup_batches": 100})

    def plain():
        result = verified([0, 0], 3, seconds=0.5, ran=0)
        result.lookup_seconds = 0.1
        assert controller.observe(result) is None

    plain(), plain()
    assert controller.stats()["measured_costs"]["greedy"][2][0] == pytest.approx(0.4)
    controller.observe(verified([1, 1], 3, seconds=1.0))
    assert controller.stats()["measured_costs"]["greedy"][2][3] == pytest.approx(1.2)
    controller.observe(verified([1, 1], 3, seconds=1.0))  # nothing carried: its own time
    assert controller.stats()["measured_costs"]["greedy"][2][3] == pytest.approx(1.0)
    for _ in range(8):
        plain()
    controller.observe(verified([1, 1], 3, seconds=1.0))
    assert controller.stats()["measured_costs"]["greedy"][2][3] == pytest.approx(1.25)


def test_shadows_reach_the_policy():
    pool = pool_of(tiers=(0, 3), start=0)
    config = {"policy": "goodput", "candidate_steps": [0, 3], "probe_rounds": 0, "probe_interval": 10_000, **FAST}
    controller = AdaptiveController(pool, config, shadows=True)
    for _ in range(4):
        controller.observe(verified([0], 0, seconds=1.0, shadow=Shadow([3, 3], 3)))
    assert pool.active_tier == 3  # every shadow says tier 3 accepts all its drafts


def test_a_tree_round_s_chain_reaches_the_policy_for_the_requests_that_speculated():
    tree = 30206  # (3, 2, 6)
    config = {"policy": "goodput", "candidate_steps": [1, 3], "candidate_trees": [[3, 2, 6]], "warmup_batches": 100}

    def fed(chain=None, depths=None, speculating=(True,)):
        pool = pool_of(tiers=(1, 3), start=3)
        pool.register(SpecRuntimeState(3, 6, speculative_eagle_topk=2))
        pool.activate(tree)
        controller = AdaptiveController(pool, config)
        result = verified([3] * len(speculating), tree, seconds=1.0, speculating=list(speculating))
        result.chain_accept_lengths, result.chain_depths = chain, depths
        controller.observe(result)
        return controller.params.alpha

    assert fed([0], [3]) < fed() < fed([3], [3])  # the chain's accepted drafts move the chains' estimates
    assert fed([3, 0], [3, 3], speculating=(True, False)) == fed([3], [3])  # speculation off: not observed


def test_a_chain_round_s_checks_past_it_reach_the_policy_for_the_requests_that_speculated():
    config = {"policy": "goodput", "acceptance_model": "positional", "candidate_steps": [1, 2, 3],
              "warmup_batches": 100, "ema_alpha": 1.0}

    def position_three(checks=None, speculating=(True, True)):
        controller = AdaptiveController(pool_of(tiers=(1, 2, 3), start=2), config)
        result = verified([2] * len(speculating), 2, seconds=1.0, speculating=list(speculating))
        result.deep_checks = checks
        controller.observe(result)
        return controller.params.position_acceptance(3)

    alpha = 1.0  # every verified draft accepted
    assert position_three() == pytest.approx(alpha)  # never checked: the pooled alpha
    assert position_three([0, 0]) == pytest.approx(alpha / 3)  # two rejections, one pseudo-trial at alpha
    assert position_three([0, 1], speculating=(False, True)) == pytest.approx((1 + alpha) / 2)  # off: not fed


def test_config_from_path(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text('{"candidate_steps": [2, 4]}')
    controller = AdaptiveController(pool_of(tiers=(2, 4), start=4), path)
    assert controller.candidate_tiers == [2, 4]


def test_bad_config_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="ema_alpha"):
        AdaptiveController(pool_of(), {"ema_alpha": 3})


def test_round_seconds_reach_the_goodput_policy_and_stats():
    controller = AdaptiveController(pool_of(), {"policy": "goodput", "probe_rounds": 0, "warmup_batches": 100})
    controller.observe(verified([3, 1], 3, seconds=0.25))
    controller.observe(verified([3, 1], 3, seconds=0.5, sampled=True))
    controller.observe(verified([3, 1], 3, seconds=0.25))  # the estimates follow the last round's kind: greedy
    stats = controller.stats()
    assert stats["policy"] == "goodput"
    assert stats["alpha"] == controller.alpha == pytest.approx(4 / 5)  # 4 of 5 drafts accepted in every round
    assert stats["measured_costs"] == {"greedy": {2: {3: 0.25}}, "sampled": {2: {3: 0.5}}}
    assert stats["cost_estimates"][3] == 0.25


def test_a_surcharge_leaves_the_timing_and_prices_every_tier_at_its_current_rate():
    """RoundResult.tier_surcharge (the hybrid's model drafter at its share of rounds now): the controller takes the
    round's own surcharge out of its timing and has the policy add each tier's current one where it decides."""
    config = {"policy": "goodput", "probe_rounds": 0, "warmup_batches": 100}
    controller, twin = AdaptiveController(pool_of(), config), AdaptiveController(pool_of(), config)
    rates = [lambda tier: 0.01 * tier.steps, lambda tier: 0.01 if tier.steps == 7 else 0.0]
    for rate, own, model_free in zip(rates, (0.03, 0.0), (0.22, 0.25)):
        result = verified([3, 1], 3, seconds=model_free + own)
        result.tier_surcharge, result.surcharge_seconds = rate, own
        controller.observe(result)
        twin.observe(verified([3, 1], 3, seconds=model_free))  # the same rounds timed without the model
        assert controller.stats()["measured_costs"] == twin.stats()["measured_costs"]
        assert controller.stats()["cost_estimates"] == {
            k: pytest.approx(cost + rate(Tier(k))) for k, cost in twin.stats()["cost_estimates"].items()}
    # tier 7, never timed, is priced at the surcharge now (0.01), not the one before (0.07)
    assert controller.stats()["cost_estimates"][7] == pytest.approx(twin.stats()["cost_estimates"][7] + 0.01)
    # a round without one (data parallelism's merged rounds) is timed as reported, its surcharges kept as set
    controller.observe(verified([3, 1], 3, seconds=0.25))
    twin.observe(verified([3, 1], 3, seconds=0.25))
    assert controller.stats()["measured_costs"] == twin.stats()["measured_costs"]


def test_a_drafter_with_shadows_is_not_held_back_from_tier_zero():
    # tier 1 at alpha 0 and 1.15x tier 0's cost: tier 0 predicts 15% more goodput, under the blind margin (25%)
    config = {"policy": "goodput", "candidate_steps": [0, 1], "probe_rounds": 0, "blind_zero_margin": 0.25,
              **FAST}

    def tiers(with_shadows):
        pool = pool_of(tiers=(0, 1), start=1)
        controller = AdaptiveController(pool, config, shadows=with_shadows)
        visited = []
        for _ in range(6):
            steps = controller.current_tier
            visited.append(steps)
            controller.observe(verified([0, 0], steps, seconds=1.0 if steps == 0 else 1.15))
        return visited

    assert tiers(with_shadows=False) == [1] * 6  # blind at tier 0 (EAGLE): held back
    assert tiers(with_shadows=True)[1] == 0      # the first decision goes
