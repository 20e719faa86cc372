"""Hybrid drafting (worker.hybrid: a model drafter and SUFFIX, the better draft per request each round): greedy
output equal to target-only's for EAGLE, EAGLE with a reduced draft vocabulary and STANDALONE, eager and from stage
graphs, under tier switches (tier 0 included); sampled output exact in law with suffix and model rows in the same
batches (a biased rule caught); the choice (a repeated prompt takes the suffix draft, a model that is always right
keeps its own), the choice counted, and tier 0's checks taking the suffix draft where the hybrid would. Tree tiers
too: a suffix row's tree (SUFFIX's, scored by its nodes' path probabilities) in place of the model's, greedy
identity with switches among chains, trees and tier 0, and the law with suffix and model trees in one batch."""

from __future__ import annotations

import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from components import require_module
from spec_helpers import random_eagle_head, random_target, run_to_completion
from test_draft_trees import _no_residual_tree_law
from test_worker import (BIASED_VERIFIERS, PROMPTS, VOCAB, chi_square_pvalue, exact_law, pair, sample_continuations,
                         target_only)
from specswap.algorithms import algorithm
from specswap.sampling import LOSSLESS, SamplingParams, Verifier
from specswap.tier import Tier
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key
from specswap.worker.hybrid import MODEL_COST_ALPHA, MODEL_PRIOR, REFRESH, SUFFIX_EMA_ALPHA, TIER_ONE, ModelCost
from specswap.worker.suffix import INSTALL

require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)

MAX_NEW = 20
REPEATED = PROMPTS + PROMPTS  # the second copies draft from the first copies' outputs (the global tree)


def hybrid_worker(name, steps=3, tiers=(), topk=1, nodes=None, **options):
    target, draft, model = pair(name)
    return SpeculativeWorker(target, draft, f"{model}+SUFFIX", speculative_num_steps=steps, tiers=tiers,
                             speculative_eagle_topk=topk, speculative_num_draft_tokens=nodes, max_seq_len=64,
                             **options), target


def choices(worker):
    stats = worker.drafter.stats()["hybrid"]
    return stats["suffix_rounds"], stats["model_rounds"]


@pytest.mark.parametrize("name", ["eagle_partial", "eagle_token_map", "standalone_copy"])
@pytest.mark.parametrize("steps", [1, 3])
def test_greedy_equals_target_only(name, steps):
    worker, target = hybrid_worker(name, steps)
    assert run_to_completion(worker, REPEATED, MAX_NEW)[0] == target_only(target, REPEATED, MAX_NEW)
    suffix_rounds, model_rounds = choices(worker)
    assert suffix_rounds > 0 and model_rounds > 0  # both drafters' drafts verified (and rejected: rollbacks)


@pytest.mark.parametrize("name", ["eagle_partial", "eagle_token_map", "standalone_copy"])
@pytest.mark.parametrize("shape", [(2, 2, 4), (3, 3, 8)])
def test_tree_tiers_are_lossless_greedy(name, shape):
    worker, target = hybrid_worker(name, shape[0], topk=shape[1], nodes=shape[2])
    drafter, verified = worker.drafter, []
    draft = drafter.draft

    def checked(tier, *args):  # a suffix row verifies the suffix tree: its tokens and its parents
        draft(tier, *args)
        for index, row in enumerate(drafter._suffix_rows):
            verified.append(tier.draft.draft_tokens[row].tolist() == drafter._suffix_tokens[index].tolist()
                            and tier.verify.layout.parents[row].tolist() == drafter._suffix_parents[index].tolist())
    drafter.draft = checked
    assert run_to_completion(worker, REPEATED, MAX_NEW)[0] == target_only(target, REPEATED, MAX_NEW)
    assert verified and all(verified)
    suffix_rounds, model_rounds = choices(worker)
    assert suffix_rounds > 0 and model_rounds > 0
    assert list(worker.drafter.stats()["hybrid"]["model_expected"]) == [Tier(*shape).label]


@pytest.mark.parametrize("name", ["eagle_partial", "standalone_copy"])
@pytest.mark.parametrize("graphs", [False, True])
def test_switching_among_chains_trees_and_tier_zero_is_lossless(name, graphs):
    tree, wide = tier_key(3, 2, 6), tier_key(2, 3, 7)
    worker, target = hybrid_worker(name, 3, topk=2, nodes=6, tiers=(0, 1, 3, wide), graphs=graphs,
                                   round_graphs=False)
    pattern = [tree, 1, 0, tree, 3, wide, 0, 0, tree, 3]
    tokens, _, used = run_to_completion(worker, REPEATED, MAX_NEW, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == target_only(target, REPEATED, MAX_NEW)
    assert {0, 1, 2, 3} <= set(used) and min(choices(worker)) > 0
    assert (Tier(3, 2, 6), 0) in worker.drafter.expected  # each tier's own mean (greedy: band 0)
    assert {tier for tier, _ in worker.drafter.expected} <= {Tier(1), Tier(3), Tier(3, 2, 6), Tier(2, 3, 7)}


@pytest.mark.parametrize("name", ["eagle_partial", "standalone_copy"])
def test_switching_tiers_every_round_is_lossless(name):
    worker, target = hybrid_worker(name, 3, tiers=(0, 1, 2, 3))
    pattern = [3, 0, 1, 0, 0, 2, 3, 1, 0, 3]  # tier 0 leaves the model behind: it catches up
    tokens, _, used = run_to_completion(worker, REPEATED, MAX_NEW, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == target_only(target, REPEATED, MAX_NEW)
    assert {0, 1, 2, 3} <= set(used) and min(choices(worker)) > 0


@pytest.mark.parametrize("name", ["eagle_partial", "standalone_copy"])
def test_stage_graphs_are_lossless(name):
    worker, target = hybrid_worker(name, 3, tiers=(0, 3), graphs=True, round_graphs=False)
    tokens, _, _ = run_to_completion(worker, REPEATED, MAX_NEW, switch=lambda i: (3, 3, 0)[i % 3])
    assert tokens == target_only(target, REPEATED, MAX_NEW) and min(choices(worker)) > 0


@pytest.mark.parametrize("name", ["eagle_partial", "eagle_token_map", "standalone_copy"])
@pytest.mark.parametrize("shape", [(3, 1, None), (2, 2, 4)], ids=["chain", "tree"])
def test_whole_round_graphs_replay_all_model_and_all_suffix_rounds_losslessly(name, shape):
    """In graph mode a greedy round where every request verifies the model's draft replays the model's round graph,
    one where every request verifies the suffix draft the all-suffix graph (drafts written by the host, no model
    forward, features kept); mixed rounds run their stages. Output stays target-only's, across tier switches and
    the three kinds of round in turn (the choice forced: the suffix draft, where taken, is the real one or the last
    token repeated)."""
    steps, topk, nodes = shape
    runs, replays, features = {}, Counter(), {}
    for graphs in (False, True):
        worker, target = hybrid_worker(name, steps, tiers=(0, 1), topk=topk, nodes=nodes, graphs=True,
                                       round_graphs=graphs)
        drafter, kind = worker.drafter, ["model"]
        real = drafter.suffix_draft

        def forced(slot, tier, worker=worker, kind=kind, real=real):
            if kind[0] == "model" or (kind[0] == "mixed" and slot % 2):
                return None
            last = worker.slots.host_tokens[slot][-1]
            return real(slot, tier) or ([last] * tier.drafts, [0] * (tier.drafts + 1) if tier.is_tree else None, 1.0, 0)
        drafter.suffix_draft = forced
        drafter.model_cost.pays = lambda tier, gain: True  # the kinds as forced, whatever the model costs
        for round_ in worker.rounds.values():
            assert len(round_.graphs) == (0 if not graphs else 2 if round_.stages.speculative_num_steps else 1)
            round_.graphs = tuple(_Counted(graph, graph_kind, replays)
                                  for graph, graph_kind in zip(round_.graphs, ("model", "suffix")))
        main = worker.pool.active_tier

        def switch(index, kind=kind, main=main):
            kind[0] = ("model", "suffix", "mixed")[index // 4 % 3]
            return (main, main, 1, 0)[index % 4]
        runs[graphs] = run_to_completion(worker, REPEATED, MAX_NEW, switch=switch)
        features[graphs] = getattr(drafter.model_drafter, "tier0_features", None)
        assert min(choices(worker)) > 0
    assert runs[True][0] == runs[False][0] == target_only(target, REPEATED, MAX_NEW)
    assert runs[True][1] == runs[False][1]  # each round accepted alike: the same drafts, the model kept alike
    if features[True] is not None:  # an EAGLE head: the target features a catch-up reads, kept in every round
        slots = len(REPEATED)  # past them: graph mode's scratch row, which padded batch rows write
        torch.testing.assert_close(features[True][:slots], features[False][:slots])
    assert replays["model"] > 0 and replays["suffix"] > 0, replays


class _Counted:
    def __init__(self, graph, kind, replays):
        self.graph, self.kind, self.replays = graph, kind, replays

    def __call__(self, *args):
        self.replays[self.kind] += 1
        return self.graph(*args)


# k = 1 puts the bonus token into the 3-token window, k = 2 a mid-chain rejection. Every sample's output joins the
# global tree, so later samples' suffix drafts are verified beside other rows' model drafts in the same batch.
# A tree tier (2, 2, 4) puts suffix trees and the model's trees in one batch: every child a point mass.
# fillers: the model never pays (but for its turns), so a row without a suffix draft verifies its last token
# repeated, a point mass too.
@pytest.mark.parametrize("model,steps,params,biased,fillers", [
    ("EAGLE", 1, SamplingParams(max_new_tokens=3, temperature=1.0), False, False),
    ("EAGLE", 2, SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), False, False),
    ("STANDALONE", 2, SamplingParams(max_new_tokens=3, temperature=1.0), False, False),
    ("EAGLE", 2, SamplingParams(max_new_tokens=3, temperature=1.0), True, False),
    ("EAGLE", (2, 2, 4), SamplingParams(max_new_tokens=3, temperature=1.0), False, False),
    ("STANDALONE", (2, 2, 4), SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4), False, False),
    ("EAGLE", (2, 2, 4), SamplingParams(max_new_tokens=3, temperature=1.0), True, False),
    ("EAGLE", 2, SamplingParams(max_new_tokens=3, temperature=1.0), False, True),
    ("EAGLE", (2, 2, 4), SamplingParams(max_new_tokens=3, temperature=1.0), False, True),
])
def test_sampled_continuations_follow_the_target_law(device, model, steps, params, biased, fillers):
    target = random_target(VOCAB, 16, num_layers=1, seed=3, logit_scale=4.0)
    law = exact_law(target, params)
    target.to(device)
    if model == "STANDALONE":
        draft = random_target(VOCAB, 16, num_layers=1, seed=4, logit_scale=4.0).to(device)
    else:  # a reduced draft vocabulary: a suffix draft outside it is a point mass where the head has no column
        draft = random_eagle_head(target, seed=4, token_map=[0, 2, 3, 5]).to(device)
    steps, topk, nodes = steps if isinstance(steps, tuple) else (steps, 1, None)
    verifier = BIASED_VERIFIERS["accept_always"] if biased else LOSSLESS
    if biased and topk > 1:
        verifier = Verifier(tree_law=_no_residual_tree_law)  # the sibling rule without the residual
    worker = SpeculativeWorker(target, draft, f"{model}+SUFFIX", speculative_num_steps=steps,
                               speculative_eagle_topk=topk, speculative_num_draft_tokens=nodes, max_batch_size=8,
                               max_seq_len=24, verifier=verifier)
    assert not worker.keyed_sampling  # the model's drafts have a law: generator draws, suffix rows as point masses
    # any choice that reads only the history keeps the law; this one mixes suffix and model rows in every batch
    speculate = worker.drafter.suffix._speculate
    table = worker.slots

    def alternate(slot, tokens, tree):
        found = speculate(slot, tokens, tree)
        return found if (slot + len(table.host_tokens[slot])) % 2 else SimpleNamespace(token_ids=[], score=0.0)
    worker.drafter.suffix._speculate = alternate
    worker.drafter.model_expected = lambda tier, heat=0: 0.0
    # a row without a suffix draft takes the model's, or (fillers) its last token repeated
    worker.drafter.model_cost.pays = lambda tier, gain: not fillers
    counts = sample_continuations(worker, params, num_samples=1200 if biased else 4000, seed=11)
    pvalue = chi_square_pvalue(counts, law)
    suffix_rounds, model_rounds = choices(worker)
    label = (f"{model}+SUFFIX k={steps} topk={topk} biased={biased} fillers={fillers}: chi-square p-value "
             f"{pvalue:.3g}, choices {suffix_rounds, model_rounds}")
    assert (pvalue < 1e-4) if biased else (pvalue > 1e-3), label
    # fillers: the model runs on its turns only (then for every row without a suffix draft of that round)
    assert suffix_rounds > 100 and (model_rounds < suffix_rounds / 4 if fillers else model_rounds > 100), label


def test_a_model_row_s_law_has_no_mass_left_by_an_earlier_suffix_row_outside_the_draft_vocabulary():
    """A suffix row's point mass may sit on a token outside the head's reduced vocabulary, a column the model's
    draws never write: cleared before the next draft, or a later model row's rejection would avoid that token."""
    target = random_target(VOCAB, 16, num_layers=1, seed=3, logit_scale=4.0)
    token_map = [0, 2, 3, 5]
    worker = SpeculativeWorker(target, random_eagle_head(target, seed=4, token_map=token_map), "EAGLE+SUFFIX",
                               speculative_num_steps=2, max_batch_size=4, max_seq_len=16)
    drafter, outside = worker.drafter, [t for t in range(VOCAB) if t not in token_map]
    draft, seen = drafter.draft, []

    def checked(tier, forwards, slot_index, seq_lens, key_length, sampling):
        draft(tier, forwards, slot_index, seq_lens, key_length, sampling)
        if sampling is not None:
            model_rows = [row for row in range(slot_index.shape[0]) if row not in drafter._suffix_rows]
            seen.append(float(tier.draft.draft_probs[model_rows][..., outside].sum()))
            placed = tier.draft.draft_probs[drafter._suffix_rows][..., outside].sum()
            seen[-1] = (seen[-1], float(placed))
    drafter.draft = checked
    speculate = drafter.suffix._speculate
    drafter.suffix._speculate = lambda slot, tokens, tree: speculate(slot, tokens, tree) if len(seen) % 2 else \
        SimpleNamespace(token_ids=[], score=0.0)  # suffix rows and model rows by turns
    drafter.model_expected = lambda tier, heat=0: 0.0
    sample_continuations(worker, SamplingParams(max_new_tokens=3, temperature=1.0), num_samples=400, seed=5)
    assert any(placed > 0 for _, placed in seen)  # suffix rows did put mass outside the draft vocabulary
    assert all(left == 0 for left, _ in seen)


def test_a_repeated_prompt_takes_the_suffix_draft_and_a_right_model_keeps_its_own():
    # a head that drafts at random: the first copy of a prompt verifies its drafts (no suffix match yet); the
    # second copy's suffix draft, from the first's output, scores above what the head gets accepted
    target = pair("eagle_partial")[0]
    worker = SpeculativeWorker(target, random_eagle_head(target, seed=9), "EAGLE+SUFFIX", speculative_num_steps=3,
                               max_seq_len=64)
    prompt = [[7, 3, 11, 5]]
    first = run_to_completion(worker, prompt, 24)
    after_first = choices(worker)
    second = run_to_completion(worker, prompt, 24)
    assert first[0] == second[0] == target_only(target, prompt, 24)
    suffix_rounds, model_rounds = (now - then for now, then in zip(choices(worker), after_first))
    assert suffix_rounds > model_rounds and sum(second[1][0]) > sum(first[1][0]), (first[1], second[1])
    # a head that is always right: its tier's mean reaches k, which no suffix score (at most k) beats
    exact, _ = hybrid_worker("eagle_exact", 3)
    exact.drafter.model_cost.pays = lambda tier, gain: True  # the choice alone, whatever the model costs
    # the trees' drafts alone (on this text prompt lookup's are as right as the model's, and taken: no draft steps)
    exact.drafter.suffix.lookup = lambda slot, steps: ([], 0)
    run_to_completion(exact, REPEATED, MAX_NEW)
    suffix_rounds, model_rounds = choices(exact)
    assert exact.drafter.model_expected(Tier(3)) > 2.5 and model_rounds > 5 * suffix_rounds


@pytest.mark.parametrize("name", ["eagle_partial", "eagle_token_map", "standalone_copy"])
def test_suffix_rounds_leave_the_model_behind_and_its_catch_up_restores_it(name):
    """Rounds whose every request takes the suffix draft run neither the model's draft nor its draft-extend: the
    model falls behind. When a request next verifies the model's draft it is caught up first, to the state the
    model drafter alone would have at that position (an EAGLE head from the verified target features it kept)."""
    worker, target = hybrid_worker(name, 3)
    drafter, model = worker.drafter, worker.drafter.model_drafter
    calls = {"extend": 0, "draft": 0}
    extend, draft, snapshots = model.extend, model.draft, []

    def counted_extend(*args, **kwargs):
        calls["extend"] += 1
        return extend(*args, **kwargs)

    def counted_draft(tier, forwards, slot_index, *args, **kwargs):
        calls["draft"] += 1
        if hasattr(model, "next_draft_logits"):  # what the head drafts d_1 from, once caught up
            snapshots.append((worker.slots.host_seq_lens[0], model.next_draft_logits[slot_index].clone()))
        return draft(tier, forwards, slot_index, *args, **kwargs)
    model.extend, model.draft = counted_extend, counted_draft
    prompt = [7, 3, 11, 5, 9, 2]
    worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=40)])
    suffix = lambda slot, tier: ([worker.slots.host_tokens[slot][-1]] * 3, None, 1.0, 0)  # noqa: E731 (a wrong draft)
    drafter.suffix_draft = suffix
    drafter.model_cost.pays = lambda tier, gain: True  # the kinds as forced, whatever the model costs
    for _ in range(4):
        worker.decode_round([0])
    assert calls == {"extend": 0, "draft": 0}
    assert model.draft_len[0] < worker.slots.host_seq_lens[0] - model.lag  # behind
    drafter.suffix_draft = lambda slot, tier: None  # the model's draft from here on
    for _ in range(2):
        worker.decode_round([0])
    assert calls["draft"] == 2 and model.draft_len[0] == worker.slots.host_seq_lens[0] - model.lag  # in step
    tokens = worker.slots.host_tokens[0]
    assert tokens[len(prompt):] == target_only(target, [prompt], len(tokens) - len(prompt))[0]
    if snapshots:  # the caught-up head's law of d_1 against a fresh one prefilled with the same tokens
        length, logits = snapshots[0]
        fresh = SpeculativeWorker(target, model.model, name_algorithm(name), speculative_num_steps=3,
                                  max_seq_len=64)
        fresh.prefill([0], [tokens[:length - 1]], [SamplingParams(max_new_tokens=2)])
        torch.testing.assert_close(logits[0], fresh.drafter.next_draft_logits[0], rtol=1e-4, atol=1e-4)


def test_a_round_prices_the_model_drafter_at_its_share_of_rounds():
    """Per-drafter cost accounting: a round's wall time less its model part, plus the model's cost at the tier times
    its share of drafting rounds lately (ModelCost)."""
    cost, six, three = ModelCost(), Tier(6), Tier(3)
    assert cost.price(six, 0.084, 0.050, drafted=True) == pytest.approx(0.084)  # the model alone's price at first
    assert cost.model_seconds(three) == pytest.approx(0.025)  # never drafted there: the cost per step times 3
    priced = [cost.price(six, 0.034, 0.0, drafted=False) for _ in range(20)]  # every request takes the suffix draft
    share = (1 - MODEL_COST_ALPHA) ** 20
    assert cost.share == pytest.approx(share)
    assert priced[-1] == pytest.approx(0.034 + share * 0.050)  # the tier's price follows the mix
    assert priced == sorted(priced, reverse=True)
    # a model round now pays the model's mean cost at the share, not its own wall time
    share = share + MODEL_COST_ALPHA * (1 - share)
    assert cost.price(six, 0.094, 0.060, drafted=True) == pytest.approx(0.034 + share * 0.051)


def test_the_worker_reports_a_slow_model_s_rounds_at_the_model_s_share():
    """The worker's RoundResult.round_seconds (what the policy reads) from a hybrid: the model's calls are timed,
    rounds where it drafted and rounds where it did not price the tier alike once the mix is known."""
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter, model = worker.drafter, worker.drafter.model_drafter
    draft = model.draft

    def slow_draft(*args, **kwargs):
        time.sleep(0.05)
        return draft(*args, **kwargs)
    model.draft = slow_draft
    worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=40)])
    drafter.suffix_draft = lambda slot, tier: None  # the model's draft
    drafter.model_cost.pays = lambda tier, gain: True  # the kinds as forced, whatever the model costs
    model_rounds = [worker.decode_round([0]).round_seconds for _ in range(2)]
    assert min(model_rounds) >= 0.05 and drafter.model_cost.cost[Tier(3)] >= 0.05
    drafter.suffix_draft = lambda slot, tier: ([worker.slots.host_tokens[slot][-1]] * 3, None, 1.0, 0)
    suffix_rounds = [worker.decode_round([0]).round_seconds for _ in range(10)]
    share = drafter.stats()["hybrid"]["model_share"]
    assert share == pytest.approx((1 - MODEL_COST_ALPHA) ** 10, abs=1e-3)
    assert suffix_rounds[0] >= 0.9 * 0.05  # priced with the model's share, though no model ran
    assert suffix_rounds[-1] < min(model_rounds) - 0.025  # the share fell
    # the share's part travels apart (RoundResult.surcharge_seconds), for the policy to price every tier at it
    result = worker.decode_round([0])
    model_cost = drafter.model_cost
    assert result.tier_surcharge == drafter.tier_surcharge
    assert result.surcharge_seconds > 0.0
    assert result.surcharge_seconds == pytest.approx(model_cost.share * model_cost.cost[Tier(3)])
    assert result.round_seconds - result.surcharge_seconds < 0.05  # the round's own time: no model ran
    assert drafter.tier_surcharge(Tier(7)) == pytest.approx(model_cost.share * model_cost.model_seconds(Tier(7)))
    assert drafter.tier_surcharge(Tier(0)) == 0.0


def name_algorithm(name):
    return pair(name)[2]


def test_the_rule_compares_the_suffix_score_with_the_model_s_mean_at_the_tier():
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter = worker.drafter
    assert drafter.model_expected(Tier(3)) == MODEL_PRIOR * 3  # before any model round at tier 3
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=8)])
    worker.slots.host_tokens[0] = list(prompt)  # the context ends in a match: 4, 5 follow
    drafter.suffix.lookup = lambda slot, steps: ([], 0)  # prompt lookup finds nothing: the trees' draft
    found = drafter.suffix._speculate(0, 3, tree=False)
    assert found.score > 0 and list(found.token_ids)
    drafter.expected[Tier(3), 0] = found.score  # a tie goes to the model (greedy: band 0)
    assert drafter.suffix_draft(0, Tier(3)) is None
    drafter.expected[Tier(3), 0] = found.score - 0.01
    draft, parents, _, match = drafter.suffix_draft(0, Tier(3))
    assert draft[:len(found.token_ids)] == list(found.token_ids) and len(draft) == 3 and parents is None
    assert match == 0


def test_a_chain_tier_offers_prompt_lookup_s_draft_first_at_its_mean_per_match_length():
    """At a chain tier SUFFIX's own draft is the candidate: prompt lookup's where it finds one, its expectation
    the mean of what lookups continuing a match of that length got accepted at the tier (untried: the whole
    chain, so the first is verified), the trees' draft and calibrated score elsewhere."""
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter, tier = worker.drafter, Tier(3)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=8)])
    worker.slots.host_tokens[0] = list(prompt)
    tokens, match = drafter.suffix.lookup(0, 3)
    assert tokens == [4, 5, 1] and match == 4  # the latest earlier 2 3 4 5 1 2 3... its last four tokens
    drafter.expected[tier, 0] = 2.9  # the model expects nearly the whole chain: an untried lookup still wins
    assert drafter.lookup_expected(tier, 4) == 3.0
    assert drafter.suffix_draft(0, tier) == ([4, 5, 1], None, 0.0, 4)
    # what such lookups got: a mean from the whole chain counted once, over 1 / LOOKUP_EMA_ALPHA rounds, then an EMA
    for accepted in (1, 0, 0):
        drafter._chosen[0], drafter._match[0], drafter._start[0] = "suffix", 4, 0
        worker.slots.host_seq_lens[0] = accepted + 1
        drafter._update_means(tier, [0])
    assert drafter.lookup_expected(tier, 4) == pytest.approx(1.0)
    assert drafter.lookup_expected(tier, 3) == 3.0 and drafter.lookup_expected(Tier(1), 4) == 1.0  # untried
    assert drafter.suffix_draft(0, tier) is None  # 1.0 against the model's 2.9
    drafter.expected[tier, 0] = 0.9
    assert drafter.suffix_draft(0, tier)[3] == 4
    assert drafter.stats()["hybrid"]["lookup_expected"] == {"3 greedy match 4": 1.0}


def test_the_suffix_score_is_calibrated_by_what_its_drafts_got_accepted():
    """Suffix drafts that score 3 and are never accepted (the last token repeated) pull the tier's calibration
    down until the model's draft (its mean at 0.3) wins; then only every REFRESH + 1-th choice takes the suffix
    draft, and a right suffix draft taken that way raises the calibration again."""
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter, tier = worker.drafter, Tier(3)
    taken = []

    def rounds(count):  # one request at a time, a new one before the cache fills
        for _ in range(count):
            if worker.slots.host_seq_lens[0] > 48 or not taken:
                if taken:
                    worker.release(0)
                worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=60)])
            worker.decode_round([0])
            taken.append(drafter._chosen[0])
    wrong = lambda slot, t: ([-1 % VOCAB] * 3, None, 3.0, 0)  # noqa: E731 (a token the target never emits first)
    drafter.suffix_candidate = wrong
    drafter.expected[tier, 0] = 0.3
    drafter.model_expected = lambda t, heat=0: 0.3  # the model's mean held where it is
    drafter.model_cost.pays = lambda t, gain: True  # the choice alone (its cost: the next tests)
    assert drafter.suffix_expected(tier, 3.0) == pytest.approx(3.0)  # uncalibrated: the score as it is
    rounds(40)
    accepted, scored = drafter.calibration[tier, 0]
    first = taken.index("model")  # the calibration moved far enough: 3 x accepted / scored < 0.3
    assert 0 < first and set(taken[:first]) == {"suffix"}
    decay = (1 - SUFFIX_EMA_ALPHA) ** first  # EMAs from 1.0: accepted toward 0, scored toward 3
    assert accepted == pytest.approx(decay) and scored == pytest.approx(3 - 2 * decay)
    assert 3 * (1 - SUFFIX_EMA_ALPHA) ** (first - 1) / (3 - 2 * (1 - SUFFIX_EMA_ALPHA) ** (first - 1)) >= 0.3
    assert drafter.suffix_expected(tier, 3.0) < 0.3
    assert drafter.stats()["hybrid"]["suffix_calibration"] == {"3": {"greedy": round(accepted / scored, 3)}}
    # from here, the model's draft REFRESH times in a row, then the suffix draft once
    rounds(2 * (REFRESH + 1))
    run = taken[first:first + REFRESH + 1]
    assert run == ["model"] * REFRESH + ["suffix"], run
    # a tier never calibrated is not moved by another's rounds
    assert drafter.suffix_expected(Tier(1), 2.0) == pytest.approx(2.0)


def test_the_means_are_kept_per_temperature_band():
    """A deterministic draft's acceptance falls with the temperature: the suffix calibration and the model's mean are
    kept per band (greedy, T < 0.5, T < 1, T >= 1), a band not seen yet at a tier starting from the nearest seen."""
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter, tier = worker.drafter, Tier(3)
    bands = []
    for temperature in (0.0, 0.3, 0.5, 0.7, 1.0, 1.5):
        worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=4, temperature=temperature)])
        bands.append(drafter.heat(0))
        worker.release(0)
    assert bands == [0, 1, 2, 2, 3, 3]
    assert drafter.suffix_expected(tier, 2.0, 3) == pytest.approx(2.0)  # nothing seen: the score as it is
    drafter.calibration[tier, 2] = [0.5, 1.0]
    assert drafter.suffix_expected(tier, 2.0, 3) == pytest.approx(1.0)  # the nearest band's
    drafter.calibration[tier, 0] = [1.0, 1.0]
    assert drafter.suffix_expected(tier, 2.0, 1) == pytest.approx(2.0)  # two as near: the cooler
    assert drafter.suffix_expected(Tier(1), 2.0, 2) == pytest.approx(2.0)  # another tier's: not read
    # wrong suffix drafts verified by a request at T = 1: band 3's calibration falls from band 2's, the others stay
    drafter.suffix_candidate = lambda slot, t: ([-1 % VOCAB] * 3, None, 3.0, 0)
    drafter.model_expected = lambda t, heat=0: 0.0  # the suffix draft is always taken
    worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=20, temperature=1.0)])
    for _ in range(5):
        worker.decode_round([0])
    assert drafter.calibration[tier, 0] == [1.0, 1.0] and drafter.calibration[tier, 2] == [0.5, 1.0]
    accepted, scored = drafter.calibration[tier, 3]
    assert accepted < 0.5 < 1.0 < scored  # toward what the drafts got (about 0) and scored (3)
    stats = drafter.stats()["hybrid"]["suffix_calibration"]["3"]
    assert list(stats) == ["greedy", "T<1", "T>=1"] and stats["T>=1"] == round(accepted / scored, 3)


def test_the_model_drafts_only_where_its_gain_pays_for_its_draft_steps():
    cost, tier = ModelCost(), Tier(3)
    assert cost.pays(tier, 0.0)  # nothing measured: the model runs, and is timed
    # a model round: 60 ms, 30 of them the model's, 10 of those its catch-up; an all-suffix round of 30 ms
    cost.price(tier, 0.060, 0.030, drafted=True, catch_up_seconds=0.010)
    cost.price(tier, 0.030, 0.0, drafted=False)
    assert cost.drafting[tier] == pytest.approx(0.020) and cost.rest[tier] == pytest.approx(0.030)
    assert cost.pays(tier, 0.7) and not cost.pays(tier, 0.6)  # 20 ms of draft steps against 30 of the rest
    assert cost.pays(Tier(1), 0.0)  # another tier: not measured


def test_a_slow_model_that_gains_little_stops_drafting_but_for_its_turns():
    """A model whose draft steps take 50 ms and get 0.2 accepted a round, against suffix drafts expected to get
    0.1: once timed, the rounds verify the suffix drafts (no model forward) but for every REFRESH + 1-th, the
    model's turn; output stays target-only's."""
    worker, target = hybrid_worker("eagle_partial", 3)
    drafter, tier = worker.drafter, Tier(3)
    model = drafter.model_drafter
    draft = model.draft

    def slow_draft(*args, **kwargs):
        time.sleep(0.05)
        return draft(*args, **kwargs)
    model.draft = slow_draft
    drafter.model_expected = lambda t, heat=0: 0.2
    drafter.suffix_candidate = lambda slot, t: ([worker.slots.host_tokens[slot][-1]] * 3, None, 0.1, 0)
    prompt, ran, outputs = [7, 3, 11, 5, 9, 2], [], []
    for _ in range(3):  # three requests in turn: 2 * (REFRESH + 1) rounds and more
        first = worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=40)])
        output = list(first)
        while len(output) < 40 and worker.slots.host_seq_lens[0] < 60:
            output += worker.decode_round([0]).new_tokens[0]
            ran.append(drafter._run_model)
        worker.release(0)
        outputs.append(output)
    reference = target_only(target, [prompt], 40)[0]
    assert all(output == reference[:len(output)] for output in outputs)
    assert ran[0] and not any(ran[1:REFRESH])  # timed once, then not worth its steps
    turns = [i for i, model_ran in enumerate(ran) if model_ran]
    assert len(turns) >= 3 and all(b - a == REFRESH + 1 for a, b in zip(turns[1:], turns[2:])), turns


def test_a_long_run_of_suffix_drafts_gives_the_model_its_turn():
    worker, _ = hybrid_worker("eagle_partial", 3)
    drafter, tier = worker.drafter, Tier(3)
    drafter.suffix_candidate = lambda slot, t: ([-1 % VOCAB] * 3, None, 3.0, 0)  # never accepted: a token a round
    drafter.model_expected = lambda t, heat=0: 0.0
    taken = []
    for _ in range(2):  # one request a run of rounds, before the cache fills
        worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=3 * REFRESH)])
        for _ in range(REFRESH + 1):
            worker.decode_round([0])
            taken.append(drafter._chosen[0])
        worker.release(0)
    assert taken == (["suffix"] * REFRESH + ["model"]) * 2
    # a suffix draft expected to get all its drafts accepted takes no turn for the model: none could win it
    drafter.suffix_expected = lambda t, score, heat=0: float(t.steps)
    taken.clear()
    worker.prefill([0], [[7, 3, 11, 5, 9, 2]], [SamplingParams(max_new_tokens=3 * REFRESH)])
    for _ in range(REFRESH + 4):
        worker.decode_round([0])
        taken.append(drafter._chosen[0])
    assert taken == ["suffix"] * (REFRESH + 4)
    drafter.suffix_expected = lambda t, score, heat=0: t.steps - 0.1  # the turn it waited for, at once
    worker.decode_round([0])
    assert drafter._chosen[0] == "model"


def test_a_tree_tier_compares_the_suffix_tree_s_score_and_pads_the_tree():
    """At a tree tier the suffix draft is SUFFIX's tree for the shape, its score the sum of its nodes' path
    probabilities: its first children are the chain's draft, a branch adds its probability, a cut removes it."""
    worker, _ = hybrid_worker("eagle_partial", 3, topk=2, nodes=7)
    drafter = worker.drafter
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5, 1, 2, 3]  # after 1 2 3: 4, then 5 (x2) or 6 (x1)
    worker.prefill([0], [prompt], [SamplingParams(max_new_tokens=8)])
    worker.slots.host_tokens[0] = list(prompt)  # the context ends in the match
    chain = drafter.suffix._speculate(0, 3, tree=False)
    tokens, parents, score = drafter.suffix.scored_suffix_tree(0, 3, 2, 6)
    assert tokens[:3] == list(chain.token_ids) and parents[:3] == [0, 1, 2]  # the chain's path first
    assert 6 in tokens and score > chain.score  # the branch to 6 adds its probability
    narrow = drafter.suffix.scored_suffix_tree(0, 3, 1, 6)
    assert narrow[0] == list(chain.token_ids) and narrow[2] == pytest.approx(chain.score)
    tree = Tier(3, 2, 7)
    drafter.expected[tree, 0] = score - 0.01
    draft, padded, _, _ = drafter.suffix_draft(0, tree)
    assert len(draft) == 6 and len(padded) == 7 and padded[0] == 0
    assert draft[:len(tokens)] == tokens and draft[len(tokens):] == [prompt[-1]] * (6 - len(tokens))
    assert padded[1:1 + len(parents)] == parents and set(padded[1 + len(parents):]) <= {0}
    drafter.expected[tree, 0] = score
    assert drafter.suffix_draft(0, tree) is None


def test_tier_zero_checks_take_the_suffix_draft_where_the_hybrid_would():
    """At tier 0 the model checks tier 1 (one draft); where the suffix draft beats the model's mean at tier 1 the
    check is the suffix draft's first token. A random head's checks are mostly wrong; on a repeated prompt the
    suffix draft's are right, so the hybrid's checks accept more than the model's alone on the same text."""
    target = pair("eagle_partial")[0]
    head = random_eagle_head(target, seed=9)
    settled = {}
    for name in ("EAGLE", "EAGLE+SUFFIX"):
        worker = SpeculativeWorker(target, head, name, speculative_num_steps=1, tiers=(0, 1), max_seq_len=64)
        assert worker.drafter.shadow_steps == 1
        run_to_completion(worker, [[7, 3, 11, 5]], 24)  # its output in the global tree
        shadows = []
        worker.prefill([0], [[7, 3, 11, 5]], [SamplingParams(max_new_tokens=24)])
        worker.decode_round([0])  # a drafting round: the next CONFIRM_ROUNDS tier-0 rounds are all checked
        worker.pool.activate(0)
        for _ in range(12):
            result = worker.decode_round([0])
            if result.shadow is not None:
                assert result.shadow.steps == 1
                shadows += result.shadow.accept_lengths
        settled[name] = shadows
    assert len(settled["EAGLE"]) == len(settled["EAGLE+SUFFIX"]) >= 8
    assert sum(settled["EAGLE+SUFFIX"]) > sum(settled["EAGLE"]) + 3, settled


def test_a_turn_is_one_request_round_not_a_whole_batch():
    worker, _ = hybrid_worker("eagle_partial", 3, max_batch_size=4)
    drafter, slots = worker.drafter, [0, 1, 2, 3]
    drafter.suffix_candidate = lambda slot, t: ([-1 % VOCAB] * 3, None, 3.0, 0)  # preferred, never accepted
    drafter.model_expected = lambda t, heat=0: 0.0
    worker.prefill(slots, [[7, 3, 11, 5, 9, 2]] * 4, [SamplingParams(max_new_tokens=40)] * 4)
    per_round = []
    for _ in range(12):  # 48 request-rounds: one turn after the first 32 suffix drafts
        worker.decode_round(slots)
        per_round.append(sum(drafter._chosen[slot] == "model" for slot in slots))
    assert per_round == [0] * 8 + [1] + [0] * 3, per_round


def test_tier_zero_checks_take_no_turn():
    """A tier-0 check stands for the hybrid's preference at tier 1; a turn due there waits for a drafting round."""
    target = pair("eagle_partial")[0]
    worker = SpeculativeWorker(target, random_eagle_head(target, seed=9), "EAGLE+SUFFIX", speculative_num_steps=1,
                               tiers=(0, 1), max_seq_len=64)
    drafter = worker.drafter
    run_to_completion(worker, [[7, 3, 11, 5]], 24)  # its output in the global tree: the checks find suffix drafts
    worker.prefill([0], [[7, 3, 11, 5]], [SamplingParams(max_new_tokens=24)])
    worker.decode_round([0])
    worker.pool.activate(0)
    due = ("suffix", REFRESH)  # the model's turn is due at tier 1
    drafter._streak[TIER_ONE] = due
    checked = sum(worker.decode_round([0]).shadow is not None for _ in range(6))
    assert checked >= 4 and drafter._streak[TIER_ONE] == due
    assert not any(drafter._turn)


def test_hybrids_are_named_and_misfits_refused():
    assert algorithm("EAGLE").hybrid("suffix").name == "EAGLE+SUFFIX"
    assert algorithm("STANDALONE").hybrid(None).name == "STANDALONE"
    assert algorithm("EAGLE3+SUFFIX").parts == ("EAGLE3", "SUFFIX")
    with pytest.raises(ValueError, match="hybrid_drafter SUFFIX drafts beside a draft model or head"):
        algorithm("NGRAM").hybrid("SUFFIX")
    with pytest.raises(ValueError, match="hybrid_drafter 'NGRAM' is not supported; valid: SUFFIX"):
        algorithm("EAGLE").hybrid("NGRAM")
    target, draft, _ = pair("eagle_partial")
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        SpeculativeWorker(target, None, "EAGLE+SUFFIX", max_seq_len=64)
