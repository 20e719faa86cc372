"""Draft trees among the adaptive policy's tiers: their keys, the config's candidate_trees, and the goodput policy
choosing a tree exactly when its measured tokens per round over its cost beat every chain's."""

import random

import pytest

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams, RoundObservation
from specswap._core import SpecRuntimeState, StatePool, tier_key, tier_shape
from specswap.adaptive_config import load_adaptive_config

TREE = (3, 2, 6)
TREE_KEY = 30206


def test_a_chain_s_key_is_its_steps_and_a_tree_s_encodes_its_shape():
    assert tier_key(3) == tier_key(3, 1, 4) == 3 and tier_key(0) == 0
    assert tier_key(*TREE) == TREE_KEY and tuple(tier_shape(TREE_KEY)) == TREE
    assert tuple(tier_shape(7)) == (7, 1, 8)
    for shape in [(1, 2, 3), (4, 3, 10), (64, 99, 99)]:
        assert tuple(tier_shape(tier_key(*shape))) == shape


def test_the_pool_holds_a_chain_and_a_tree_of_the_same_depth():
    pool = StatePool()
    pool.register(SpecRuntimeState(3, 4))
    pool.register(SpecRuntimeState(3, 6, speculative_eagle_topk=2))
    assert pool.tiers() == [3, TREE_KEY]
    assert pool.activate(TREE_KEY) and pool.acquire().speculative_eagle_topk == 2
    assert pool.active_tier == TREE_KEY and pool.acquire().speculative_num_steps == 3
    with pytest.raises(ValueError, match="already registered"):
        pool.register(SpecRuntimeState(3, 6, speculative_eagle_topk=2))
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be in"):
        SpecRuntimeState(3, 3, speculative_eagle_topk=2)


def test_candidate_trees_are_checked_and_named():
    config = load_adaptive_config({"policy": "goodput", "candidate_steps": [0, 1, 3], "candidate_trees": [[3, 2, 6]]})
    assert [list(t) for t in config.candidate_trees] == [[3, 2, 6]]
    for trees, match in [([[3, 2, 3]], r"candidate_trees: tree \[3, 2, 3\]: speculative_num_draft_tokens"),
                         ([[3, 1, 4]], r"speculative_eagle_topk must be in \[2, 99\]"),
                         ([[0, 2, 3]], "speculative_num_steps must be in"),
                         ([[3, 2]], "candidate_trees must be a list of"),
                         ([3, 2, 6], "candidate_trees must be a list of")]:
        with pytest.raises(ValueError, match=match):
            load_adaptive_config({"policy": "goodput", "candidate_trees": trees})
    with pytest.raises(ValueError, match="candidate_trees needs policy 'goodput'"):
        load_adaptive_config({"candidate_trees": [[3, 2, 6]]})  # sglang's thresholds are per step count


def test_trees_sit_among_the_chains_by_verified_drafts():
    params = AdaptiveSpeculativeParams(1, AdaptiveConfig(policy="goodput", candidate_steps=[0, 1, 3, 7],
                                                         candidate_trees=[[3, 2, 6], [2, 2, 4]]))
    assert list(params.candidate_tiers) == [0, 1, 3, tier_key(2, 2, 4), TREE_KEY, 7]
    tree_start = AdaptiveSpeculativeParams(TREE_KEY, AdaptiveConfig(policy="goodput", candidate_steps=[1, 3]))
    assert list(tree_start.candidate_tiers) == [1, 3, TREE_KEY] and tree_start.current_tier == TREE_KEY


def _run(params, tokens_per_round, seconds, rounds, rng, chain_tokens=None, sampled=False):
    """Feed rounds at the policy's own tier: `tokens_per_round(key)` accepted per request on average (drawn
    around it), `seconds(key)` per round; with `chain_tokens`, each tree round also tells what its chain of first
    children accepted (about that many drafts a request, its full depth drafted). Returns the tiers run."""
    used = []
    for _ in range(rounds):
        key = params.current_tier
        used.append(key)
        depth = tier_shape(key)[0]

        def draw(mean):
            return [min(depth, max(0, round(mean + rng.uniform(-0.5, 0.5)))) for _ in range(4)]

        chain = draw(chain_tokens) if key == TREE_KEY and chain_tokens is not None else []
        params.observe(RoundObservation(accept_lengths=draw(tokens_per_round(key)), round_seconds=seconds(key),
                                        sampled=sampled, chain_accept_lengths=chain, chain_depths=[depth] * len(chain)))
    return used


def _positional_policy():
    """Goodput over chains 0, 1, 3 and the tree TREE, deciding every 2 batches from the first."""
    return AdaptiveSpeculativeParams(1, AdaptiveConfig(policy="goodput", candidate_steps=[0, 1, 3],
                                                       candidate_trees=[list(TREE)], warmup_batches=0,
                                                       update_interval=2, acceptance_model="positional"))


@pytest.mark.parametrize("tree_pays", [True, False])
def test_goodput_runs_a_tree_exactly_when_it_pays(tree_pays):
    """Chains 1 and 3 accept about 0.5 and 1 drafts a round; the tree of depth 3 accepts 2.5 (it pays: chosen) or
    1 (as its chain, at a higher cost: left after its probes)."""
    rng = random.Random(0)
    params = AdaptiveSpeculativeParams(1, AdaptiveConfig(policy="goodput", candidate_steps=[0, 1, 3],
                                                         candidate_trees=[list(TREE)], warmup_batches=0,
                                                         update_interval=2))
    accepted = {0: 0.0, 1: 0.5, 3: 1.0, TREE_KEY: 2.5 if tree_pays else 1.0}
    cost = {0: 1.0e-3, 1: 1.1e-3, 3: 1.3e-3, TREE_KEY: 1.45e-3}
    used = _run(params, accepted.get, cost.get, 200, rng)
    last = used[-100:]
    if tree_pays:
        assert last.count(TREE_KEY) > 90, last
    else:
        assert TREE_KEY in used[:20]  # probed at start-up
        assert last.count(TREE_KEY) < 10, last


def test_a_tree_s_gain_at_low_acceptance_is_not_carried_to_where_its_chain_accepts_all():
    """Low phase: chains 1 and 3 accept about 0.05 and 0.08 drafts a round and the depth-3 tree 1 (its start-up
    probes see it deliver 1.85x its chain's tokens), too little for its cost: tiers 0 and 1 run. High phase: every
    chain accepts all its drafts, and the tree cannot beat its chain of 3 (4 tokens at most) at its cost, so
    chain 3 runs and the tree is not tried. Priced by its ratio to its chain, the tree was predicted 6 tokens
    there (7.4 tokens) and tried again and again, each try an up move undone that blocked the move to chain 3."""
    rng = random.Random(0)
    params = _positional_policy()
    cost = {0: 1.0e-3, 1: 1.2e-3, 3: 1.6e-3, TREE_KEY: 2.7e-3}
    low = {0: 0.0, 1: 0.05, 3: 0.08, TREE_KEY: 1.0}
    used = _run(params, low.get, cost.get, 150, rng)
    assert used[-100:].count(TREE_KEY) < 5, used[-100:]
    high = {0: 0.0, 1: 1.0, 3: 3.0, TREE_KEY: 3.0}
    used = _run(params, high.get, cost.get, 150, rng)
    assert used[-120:].count(3) > 110 and used.count(TREE_KEY) < 3, used


@pytest.mark.parametrize("report", [True, False])
def test_a_tree_s_chain_rounds_keep_the_chains_estimates_current(report):
    """Low phase: the depth-3 tree accepts 2 drafts a round where chain 3 accepts 0.5, and runs. High phase: every
    chain accepts all its drafts, and so does the tree, at a higher cost. A tree round's chain of first children
    tells the chains' estimates that chain 3 now accepts all: the policy leaves the tree for chain 3 within a
    few decisions. Without it the chains keep the low phase's rates while the tree runs, and the tree (predicted
    from them plus the shortfall it recovers) keeps running until a refresh probe times chain 3 again."""
    rng = random.Random(0)
    params = _positional_policy()
    cost = {0: 1.0e-3, 1: 1.2e-3, 3: 1.6e-3, TREE_KEY: 2.2e-3}
    low = {0: 0.0, 1: 0.3, 3: 0.5, TREE_KEY: 2.0}
    used = _run(params, low.get, cost.get, 150, rng, chain_tokens=0.5 if report else None)
    assert used[-50:].count(TREE_KEY) > 45, used[-50:]
    high = {0: 0.0, 1: 1.0, 3: 3.0, TREE_KEY: 3.0}
    used = _run(params, high.get, cost.get, 100, rng, chain_tokens=3.0 if report else None)
    on_tree = used.index(3) if 3 in used else len(used)
    if report:
        assert on_tree <= 10 and used[-50:].count(3) > 45, used
    else:
        assert on_tree > 30, used


def test_what_a_tree_recovers_in_sampled_rounds_is_not_carried_into_greedy_ones():
    """Sampled phase: chains 1 and 3 accept 1 draft a round, the depth-3 tree all 3 (sibling drafts drawn from
    the law recover what its chain missed), and the tree runs. Greedy phase: chain 3 accepts 2, and the tree only
    what its chain does, at a higher cost. The tree leaves within 3 decisions, while the chains' estimates catch
    up from the sampled phase, and never comes back. With one recovered fraction for both kinds of round, the
    sampled phase's (all of the shortfall) priced the tree at 4 tokens against chain 3's 3 and held it 5
    decisions."""
    rng = random.Random(0)
    params = _positional_policy()
    cost = {0: 1.0e-3, 1: 1.2e-3, 3: 1.6e-3, TREE_KEY: 2.0e-3}
    sampled = {0: 0.0, 1: 1.0, 3: 1.0, TREE_KEY: 3.0}
    used = _run(params, sampled.get, cost.get, 150, rng, sampled=True)
    assert used[-60:].count(TREE_KEY) == 60, used[-60:]
    greedy = {0: 0.0, 1: 1.0, 3: 2.0, TREE_KEY: 2.0}
    used = _run(params, greedy.get, cost.get, 100, rng, chain_tokens=2.0)
    assert used[:6] == [TREE_KEY] * 6 and used[6:] == [3] * 94, used


def test_tree_chain_needs_a_depth_per_request_and_is_ignored_off_a_tree():
    params = AdaptiveSpeculativeParams(3, AdaptiveConfig(policy="goodput", candidate_steps=[1, 3],
                                                         candidate_trees=[list(TREE)]))
    with pytest.raises(ValueError, match="2 accept lengths but 1 depths"):
        params.observe(RoundObservation(chain_accept_lengths=[1, 2], chain_depths=[3]))
    alpha = params.alpha
    params.observe(RoundObservation(chain_accept_lengths=[3] * 4, chain_depths=[3] * 4))  # at chain 3: its own verifies are what it learns from
    assert params.alpha == alpha
