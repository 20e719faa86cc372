"""Draft trees from every drafter: EAGLE-2 dynamic trees (EAGLE head, standalone draft model) and NGRAM tries.

Greedy output equals target-only decoding token for token in fp32 for every tree shape, in eager mode, stage
graphs and whole-round graphs, with batches of different prompt lengths and with a switch among chain and tree
tiers every round. Sampled rounds follow the target's law exactly (the enumerated law of three tokens, a chi-square
test); a sibling rule that skips the residual fails the same test. Multi-draft recursive rejection is checked on
its own with children drawn from a law.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from spec_helpers import run_to_completion
from test_worker import (PROMPTS, VOCAB, chi_square_pvalue, exact_law, pair, random_eagle_head, random_target,
                         sample_continuations, target_only)
from specswap.prompt_lookup import propose_ngram_tree
from specswap.sampling import LOSSLESS, SamplingParams, Verifier, accept_tree_law, sample_from_cdf
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key, tree_shape

MAX_NEW = 16
SHAPES = [(1, 2, 3), (2, 2, 4), (2, 3, 7), (3, 2, 6), (3, 3, 8)]
DRAFTERS = ["eagle_partial", "eagle_token_map", "standalone_copy", "ngram"]


def tree_worker(name, shape, **options):
    target, draft, algorithm = pair(name)
    steps, topk, nodes = shape
    return SpeculativeWorker(target, draft, algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                             speculative_num_draft_tokens=nodes, max_seq_len=64, **options)


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_tree_tier_is_lossless_greedy(name, shape):
    target = pair(name)[0]
    expected = target_only(target, PROMPTS, MAX_NEW)
    worker = tree_worker(name, shape)
    tokens, accepts, _ = run_to_completion(worker, PROMPTS, MAX_NEW)
    assert tokens == expected
    if name != "eagle_token_map":  # (a random head over a reduced vocabulary: the token map's path, no match)
        assert sum(map(sum, accepts)) > 0  # drafts landed: the tree's verify and path layout ran


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("mode", ["stage_graphs", "round_graphs"])
def test_tree_tiers_replay_from_graphs_losslessly(name, mode):
    target = pair(name)[0]
    expected = target_only(target, PROMPTS, MAX_NEW)
    for shape in ((2, 2, 4), (3, 2, 6)):
        worker = tree_worker(name, shape, graphs=True, round_graphs=mode == "round_graphs")
        assert run_to_completion(worker, PROMPTS, MAX_NEW)[0] == expected, shape


@pytest.mark.parametrize("name", ["eagle_partial", "standalone_copy"])
def test_a_tree_accepts_at_least_its_depth_s_chain(name):
    """The top-1 path of each depth is in the tree (its path probability is the highest there), so on the same
    text a tree never accepts less than the chain of its depth and accepts more on these prompts."""
    chain = run_to_completion(tree_worker(name, (3, 1, 4)), PROMPTS, 24)[1]
    tree = run_to_completion(tree_worker(name, (3, 3, 8)), PROMPTS, 24)[1]
    per_round = [sum(map(sum, a)) / sum(map(len, a)) for a in (chain, tree)]
    assert per_round[1] > per_round[0], per_round


def _rounds_by_position(worker, prompts, max_new_tokens, temperature=0.0):
    """Rounds to completion: {(request, position m at the round's start): the round's RoundResult row
    (accepted, (chain accepted, chain depth) or None)} for the rounds that verified drafts."""
    params = [SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)] * len(prompts)
    generators = [torch.Generator().manual_seed(7 + i) for i in range(len(prompts))]  # keyed: the same text
    lengths = [len(prompt) + 1 for prompt in prompts]
    worker.prefill(range(len(prompts)), prompts, params, generators)
    rows = {}
    running = list(range(len(prompts)))
    while running:
        result = worker.decode_round(running)
        for i, slot in enumerate(running):
            if result.measured_tier and result.ran.steps:
                chain = None if result.chain_accept_lengths is None else \
                    (result.chain_accept_lengths[i], result.chain_depths[i])
                rows[slot, lengths[slot]] = (result.accept_lengths[i], chain)
            lengths[slot] += len(result.new_tokens[i])
        running = [s for s in running if lengths[s] - len(prompts[s]) < max_new_tokens]
    return rows


@pytest.mark.parametrize("name", ["eagle_partial", "standalone_copy", "ngram"])
@pytest.mark.parametrize("shape", [(2, 2, 4), (3, 2, 6), (3, 3, 8)])
@pytest.mark.parametrize("round_graphs", [False, True])
def test_a_tree_round_reports_what_its_depth_s_chain_accepts(name, shape, round_graphs):
    """Where a tree round and a round of the chain of its depth start at the same position of the same text, the
    tree's chain count (its first-child path's accepted nodes) is the chain's accepted drafts, cut at the depth
    the tree drafted that path to, in eager rounds and replayed round graphs. This is what the adaptive policy
    learns the chains from while a tree runs."""
    depth = shape[0]
    modes = dict(graphs=round_graphs, round_graphs=round_graphs)
    chain = _rounds_by_position(tree_worker(name, (depth, 1, depth + 1), **modes), PROMPTS, 24)
    tree = _rounds_by_position(tree_worker(name, shape, **modes), PROMPTS, 24)
    assert all(reported is None for _, reported in chain.values())  # a chain has no chain of its own to report
    common = sorted(set(chain) & set(tree))
    assert len(common) >= len(PROMPTS), common
    for key in common:
        chain_accepted, chain_depth = tree[key][1]
        assert 1 <= chain_depth <= depth
        assert chain_accepted == min(chain[key][0], chain_depth), (key, chain[key], tree[key])
    assert any(chain_accepted for _, (chain_accepted, _) in tree.values()), tree
    if name != "ngram":  # (these texts never branch after a lookup: the trie accepts what its chain does)
        # the count is not the tree's own: somewhere the tree took another branch than its chain's
        assert any(tree[key][0] != tree[key][1][0] for key in tree), tree


def test_a_sampled_tree_reports_its_chain_only_where_the_chain_meets_the_same_draws():
    """Keyed draws (NGRAM's deterministic drafts) are the same for the chain's tokens, so a sampled trie round
    reports its chain as a greedy one does; drafts drawn from a law (EAGLE at T > 0) report none."""
    chain = _rounds_by_position(tree_worker("ngram", (3, 1, 4)), PROMPTS, 24, temperature=0.8)
    tree = _rounds_by_position(tree_worker("ngram", (3, 2, 6)), PROMPTS, 24, temperature=0.8)
    common = sorted(set(chain) & set(tree))
    assert len(common) >= len(PROMPTS) and any(tree[key][0] for key in common)
    for key in common:
        assert tree[key][1][0] == min(chain[key][0], tree[key][1][1]), (key, chain[key], tree[key])
    eagle = _rounds_by_position(tree_worker("eagle_partial", (3, 2, 6)), PROMPTS, 12, temperature=0.8)
    assert eagle and all(reported is None for _, reported in eagle.values())


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("graphs", [False, True])
def test_switching_among_chain_and_tree_tiers_every_round_is_lossless(name, graphs):
    target, draft, algorithm = pair(name)
    tree, wide = tier_key(3, 2, 6), tier_key(2, 3, 7)  # tiers are known by key: a chain's steps, a tree's shape
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=3, speculative_eagle_topk=2,
                               speculative_num_draft_tokens=6, tiers=(0, 1, 3, 5, wide), max_seq_len=64,
                               graphs=graphs)
    pattern = [tree, 1, 5, 0, tree, 3, wide, tree, 3]
    tokens, _, used = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert {2, 3} <= set(used)  # depths: the trees (3, 2) and chain 3
    if algorithm != "NGRAM":  # (NGRAM's early rounds find nothing to look up: plain decodes)
        assert {1, 5} <= set(used)
    assert worker.rounds[tree].stages.shape == (3, 2, 6) and worker.rounds[3].stages.shape == (3, 1, 4)
    assert worker.rounds[wide].stages.shape == (2, 3, 7) and worker.rounds[5].stages.shape == (5, 1, 6)


# ---- sampling: multi-draft recursive rejection --------------------------------------------------------


def _no_residual_tree_law(target_law, node_tokens, children, child_law, uniforms, residual_uniform):
    """A biased sibling rule: each child is tried against the parent's full law (no residual after a
    rejection), and the final draw is from that full law too."""
    path, tries = [0], 0
    while True:
        law = target_law(path[-1]).double()
        for child in children[path[-1]]:
            accepted = uniforms[tries] < law[node_tokens[child]]
            tries += 1
            if accepted:
                path.append(child)
                break
        else:
            uniform = torch.tensor([residual_uniform], dtype=torch.float32)
            return path, int(sample_from_cdf(law.unsqueeze(0).cpu(), uniform)[0])


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("children", [2, 3])
def test_recursive_rejection_over_children_drawn_from_a_law(children, biased):
    """One node whose children are drawn independently from a draft law q (SpecInfer's setting): the emitted
    token follows p; skipping the residual does not."""
    generator = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(VOCAB, generator=generator) * 2.5, -1).double()
    q = torch.softmax(torch.randn(VOCAB, generator=generator) * 2.5, -1).double()
    rule = _biased_law_rule if biased else accept_tree_law
    counts = torch.zeros(VOCAB, dtype=torch.long)
    samples = 3000 if biased else 12000
    for _ in range(samples):
        drafts = torch.multinomial(q, children, replacement=True, generator=generator).tolist()
        uniforms = torch.rand(children + 1, generator=generator, dtype=torch.float64).tolist()
        path, token = rule(lambda node: p, [0] + drafts, [list(range(1, children + 1))] + [[]] * children,
                           lambda child: q, uniforms[:-1], uniforms[-1])
        emitted = drafts[path[-1] - 1] if len(path) > 1 else token
        counts[emitted] += 1
    pvalue = chi_square_pvalue(counts, p)
    assert (pvalue < 1e-4) if biased else (pvalue > 1e-3), pvalue


def _biased_law_rule(target_law, node_tokens, children, child_law, uniforms, residual_uniform):
    """The no-residual sibling rule with draft laws: min(1, p/q) against the full p for every child."""
    law = target_law(0).double()
    for tries, child in enumerate(children[0]):
        token = node_tokens[child]
        if uniforms[tries] < law[token] / child_law(child)[token]:
            return [0, child], token
    return [0], int(sample_from_cdf(law.unsqueeze(0).float(), torch.tensor([residual_uniform]))[0])


TREE_LAW_CASES = [("EAGLE", (1, 2, 3)), ("EAGLE", (1, 3, 4)), ("EAGLE", (2, 2, 5)), ("EAGLE", (2, 3, 7)),
                  ("STANDALONE", (1, 2, 3)), ("STANDALONE", (2, 3, 7)), ("NGRAM", (2, 2, 5))]


# NGRAM's trie is accepted by keyed draws, which have no sibling rule to bias: its case runs unbiased only
@pytest.mark.parametrize("algorithm,shape,biased", [(*case, False) for case in TREE_LAW_CASES]
                         + [(*case, True) for case in TREE_LAW_CASES if case[0] != "NGRAM"])
def test_sampled_tree_continuations_follow_the_target_law(device, algorithm, shape, biased):
    """Depth 1 and 2 trees of 2 and 3 children: three sampled tokens follow the target's enumerated law (top-k
    children, each a point mass for the rejection rule; NGRAM's trie: keyed draws). The biased sibling rule (no
    residual) fails the same test."""
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    target = random_target(VOCAB, 16, num_layers=1, seed=3, logit_scale=4.0)
    law = exact_law(target, params)
    target.to(device)
    draft = None
    if algorithm == "STANDALONE":
        draft = random_target(VOCAB, 16, num_layers=1, seed=4, logit_scale=4.0).to(device)
    elif algorithm == "EAGLE":
        draft = random_eagle_head(target, seed=4, token_map=[0, 2, 3, 5]).to(device)
    verifier = Verifier(tree_law=_no_residual_tree_law) if biased else LOSSLESS
    steps, topk, nodes = shape
    worker = SpeculativeWorker(target, draft, algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                               speculative_num_draft_tokens=nodes, max_batch_size=8, max_seq_len=24,
                               verifier=verifier)
    counts = sample_continuations(worker, params, num_samples=1200 if biased else 4000, seed=11)
    pvalue = chi_square_pvalue(counts, law)
    label = f"{algorithm} {shape} biased={biased}: chi-square p-value {pvalue:.3g}"
    assert (pvalue < 1e-4) if biased else (pvalue > 1e-3), label


# ---- NGRAM's trie and the shapes ----------------------------------------------------------------------


def test_the_trie_keeps_the_lookup_first_then_other_continuations():
    text = [1, 2, 7, 8, 5, 1, 2, 9, 4, 6, 1, 2]        # "1 2" was followed by 7 8 and by 9 4
    tokens, parents = propose_ngram_tree(text, depth=2, topk=2, max_nodes=4)
    assert tokens == [9, 4, 7, 8] and parents == [0, 1, 0, 3]
    # one child per node: the lookup's chain alone
    assert propose_ngram_tree(text, 2, 1, 4) == ([9, 4], [0, 1])
    # the node budget is kept, breadth first by source
    assert propose_ngram_tree(text, 2, 2, 3) == ([9, 4, 7], [0, 1, 0])
    assert propose_ngram_tree([1, 2, 3], 2, 2, 4) == ([], [])


def test_tree_shapes_are_checked_and_named():
    assert tree_shape(3) == (3, 1, 4)
    assert tree_shape(3, 2) == (3, 2, 7)
    assert tree_shape(2, 3, 5) == (2, 3, 5)
    for args, match in [((3, 1, 6), "a chain of 3 steps verifies 4"), ((3, 0), "topk must be >= 1"),
                        ((3, 2, 3), "needs 4..11"), ((2, 2, 9), "needs 3..7"), ((0, 2), "needs speculative_num_steps"),
                        ((2.0, 2), "speculative_num_steps must be an int")]:
        with pytest.raises(ValueError, match=match):
            tree_shape(*args)
    target = random_target()
    with pytest.raises(ValueError, match="drafts chains only"):
        SpeculativeWorker(target, None, lambda slots: __import__("specswap.worker.drafter", fromlist=["Drafter"])
                          .Drafter(), speculative_num_steps=2, speculative_eagle_topk=2, max_seq_len=32)
    with pytest.raises(ValueError, match=r"speculative_num_draft_tokens 3 does not fit"):
        SpeculativeWorker(target, None, "NGRAM", speculative_num_steps=2, tiers=(tier_key(3, 2, 7) - 4,),
                          max_seq_len=32)  # the key of [3, 2, 3]: no tree of depth 3 has 3 tokens


def test_tree_tiers_report_their_shape_memory_and_drafts_verified():
    worker = tree_worker("eagle_partial", (3, 2, 6), graphs=True, round_graphs=False, tiers=(1, 3))
    memory = worker.tier_memory_bytes()
    assert memory[tier_key(3, 2, 6)] > memory[3] > memory[1] > 0 and memory["draft_steps_shared"] > 0
    worker.prefill([0], [PROMPTS[1]], [SamplingParams(max_new_tokens=8)])
    result = worker.decode_round([0])
    assert result.drafts_verified == [5] and result.ran.draft_tokens == 6
    assert all(itertools.starmap(lambda a, n: 0 <= a <= 3 and len(n) == a + 1,
                                 zip(result.accept_lengths, result.new_tokens)))
