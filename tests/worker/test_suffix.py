"""SUFFIX drafting (worker.suffix over arctic-inference's suffix trees): greedy output equal to target-only for
chains and trees, eager and from graphs, under switching; sampled output exact in law (keyed draws, a biased rule
caught); the drafts' bounds (match length x spec factor, the tier, min_token_prob); the global tree across
requests, its privacy field, flush, eviction and size; the error naming the fix without the library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from components import require_module
from spec_helpers import random_target, run_to_completion
from test_worker import (BIASED_KEYED_VERIFIERS, PROMPTS, VOCAB, chi_square_pvalue, exact_law, pair,
                         sample_continuations, target_only)
from specswap.sampling import LOSSLESS, SamplingParams
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key
from specswap.worker.slots import SlotTable
from specswap.worker.suffix import INSTALL, SuffixConfig, merge_tree

REPOSITORY = Path(__file__).resolve().parents[2]
MAX_NEW = 16
HIDE = "import sys\nsys.modules['arctic_inference'] = None  # import arctic_inference fails\n"


@pytest.fixture
def library():
    """The suffix trees: a missing arctic-inference skips, or fails under SPECSWAP_TEST_REQUIRE_ALL=1."""
    require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)


def suffix_worker(target, shape=(3, 1, 4), **options):
    steps, topk, nodes = shape
    return SpeculativeWorker(target, None, "SUFFIX", speculative_num_steps=steps, speculative_eagle_topk=topk,
                             speculative_num_draft_tokens=nodes, max_seq_len=64, **options)


def serve_one(worker, prompt, max_new_tokens, params=None, slot=0):
    """One request alone in ``slot``, to completion, then released: (tokens, accept lengths)."""
    params = params or SamplingParams(max_new_tokens=max_new_tokens)
    tokens = worker.prefill([slot], [prompt], [params])
    accepts = []
    while len(tokens) < max_new_tokens:
        result = worker.decode_round([slot])
        tokens += result.new_tokens[0]
        accepts.append(result.accept_lengths[0])
    worker.release(slot)
    return tokens[:max_new_tokens], accepts


# ---- losslessness -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", range(0, 8))
def test_greedy_equals_target_only_for_every_chain_tier(library, steps):
    target = pair("ngram")[0]  # a target that falls into loops: its own tree drafts, some right, some wrong
    tokens, accepts, _ = run_to_completion(suffix_worker(target, (steps, 1, steps + 1)), PROMPTS, MAX_NEW)
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    flat = [a for row in accepts for a in row]
    assert all(0 <= a <= steps for a in flat)
    if steps >= 3:
        assert 0 < sum(flat) < steps * len(flat)  # drafts taken and rejected: the caches roll back


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 2, 4), (2, 3, 7), (3, 2, 6), (3, 3, 8)])
def test_greedy_equals_target_only_for_every_tree_tier(library, shape):
    target = pair("ngram")[0]
    tokens, accepts, _ = run_to_completion(suffix_worker(target, shape), PROMPTS, MAX_NEW)
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert sum(map(sum, accepts)) > 0


@pytest.mark.parametrize("mode", ["stage_graphs", "round_graphs"])
def test_chain_and_tree_tiers_replay_from_graphs_losslessly(library, mode):
    target = pair("ngram")[0]
    for shape in ((3, 1, 4), (3, 2, 6)):
        worker = suffix_worker(target, shape, graphs=True, round_graphs=mode == "round_graphs")
        assert run_to_completion(worker, PROMPTS, MAX_NEW)[0] == target_only(target, PROMPTS, MAX_NEW), shape


def test_switching_among_chain_and_tree_tiers_every_round_is_lossless(library):
    target = pair("ngram")[0]
    tree, wide = tier_key(3, 2, 6), tier_key(2, 3, 7)
    worker = SpeculativeWorker(target, None, "SUFFIX", speculative_num_steps=3, speculative_eagle_topk=2,
                               speculative_num_draft_tokens=6, tiers=(0, 1, 3, 5, wide), max_seq_len=64)
    pattern = [tree, 1, 5, 0, tree, 3, wide, tree, 3]
    tokens, _, used = run_to_completion(worker, PROMPTS, MAX_NEW, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == target_only(target, PROMPTS, MAX_NEW)
    assert {2, 3} <= set(used)


# k = 1 puts the bonus token into the 3-token window, k = 2 a mid-chain rejection; the tree two children deep.
# Every sample's output joins the global tree, so later samples draft from earlier ones.
@pytest.mark.parametrize("shape,params,biased", [
    ((1, 1, 2), SamplingParams(max_new_tokens=3, temperature=1.0), False),
    ((2, 1, 3), SamplingParams(max_new_tokens=3, temperature=0.8, top_k=4, top_p=0.9), False),
    ((2, 2, 5), SamplingParams(max_new_tokens=3, temperature=1.0), False),
    ((2, 1, 3), SamplingParams(max_new_tokens=3, temperature=1.0), True),
])
def test_sampled_continuations_follow_the_target_law(library, device, shape, params, biased):
    target = random_target(VOCAB, 16, num_layers=1, seed=3, logit_scale=4.0)
    law = exact_law(target, params)
    target.to(device)
    steps, topk, nodes = shape
    worker = SpeculativeWorker(target, None, "SUFFIX", speculative_num_steps=steps, speculative_eagle_topk=topk,
                               speculative_num_draft_tokens=nodes, max_batch_size=8, max_seq_len=16,
                               verifier=BIASED_KEYED_VERIFIERS["accept_always"] if biased else LOSSLESS)
    assert worker.keyed_sampling
    counts = sample_continuations(worker, params, num_samples=1200 if biased else 4000, seed=11)
    pvalue = chi_square_pvalue(counts, law)
    label = f"SUFFIX {shape} biased={biased}: chi-square p-value {pvalue:.3g}"
    assert (pvalue < 1e-4) if biased else (pvalue > 1e-3), label
    assert worker.drafter.stats()["suffix_global_tree"]["cached_requests"] > 0


# ---- the drafts -------------------------------------------------------------------------------------------


def drafter_over(tokens_by_slot, config=SuffixConfig(), params=None):
    """A SuffixDrafter over a slot table holding these texts (prompt = the text), each request started."""
    from specswap.worker.suffix import SuffixDrafter
    table = SlotTable(len(tokens_by_slot), len(tokens_by_slot), torch.device("cpu"))
    for slot, tokens in enumerate(tokens_by_slot):
        table.params[slot] = params or SamplingParams()
        table.host_tokens[slot] = list(tokens)
    drafter = SuffixDrafter(table, config)
    drafter.prefill(SimpleNamespace(slots=list(range(len(tokens_by_slot))), prompts=tokens_by_slot))
    return drafter, table


def test_a_chain_is_bounded_by_the_match_times_the_spec_factor_and_padded_to_the_tier(library):
    text = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3]  # [1, 2, 3] matches: 4, 5, 6, 8, 9 follow it
    drafter, _ = drafter_over([text], SuffixConfig(max_spec_factor=1.0))
    assert drafter.suffix_chain(0, 5) == [4, 5, 6, 6, 6]   # 3 matched tokens x 1.0, padded with the last
    assert drafter.suffix_chain(0, 2) == [4, 5]             # the tier's bound
    wide, _ = drafter_over([text], SuffixConfig(max_spec_factor=2.0))
    assert wide.suffix_chain(0, 5) == [4, 5, 6, 8, 9]
    # each token's estimated probability is 1/2 (the match also ends the text): below min_token_prob, nothing
    strict, _ = drafter_over([text], SuffixConfig(min_token_prob=0.6))
    assert strict.suffix_chain(0, 5) == []
    assert strict.suffix_tree(0, 3, 2, 5) == ([], [])


def test_prompt_lookup_drafts_first_and_the_trees_where_it_finds_nothing(library):
    """SUFFIX verifies NGRAM's prompt lookup where it finds a match (the whole tier: [4, 5, 6, 8, 9], where the
    trees' spec factor of 1 stops at three), and the trees' draft where it finds none (an earlier request's
    output, in the global tree only)."""
    from specswap.prompt_lookup import propose_ngram
    text = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3]
    drafter, table = drafter_over([text], SuffixConfig(max_spec_factor=1.0))
    assert drafter.propose(0, 5) == propose_ngram(text, 5) == [4, 5, 6, 8, 9] != drafter.suffix_chain(0, 5)
    tokens, parents = drafter.propose_tree(0, 3, 2, 5)
    assert tokens[:3] == [4, 5, 6] and parents[:3] == [0, 1, 2]
    # a request whose text prompt lookup cannot continue: [20, 21] never repeats in it, but an earlier output did
    table.host_tokens[0] = text + [20, 21, 22, 23, 24]  # its output, fed at the end of a round
    drafter.end_round(None, [0])
    drafter.release(0)
    table.host_tokens[0] = [30, 20, 21]
    drafter.prefill(SimpleNamespace(slots=[0], prompts=[[30, 20, 21]]))
    assert propose_ngram([30, 20, 21], 3) == [] and drafter.propose(0, 3) == drafter.suffix_chain(0, 3) != []
    assert drafter.propose(0, 3)[0] == 22


def test_a_request_with_speculation_off_drafts_nothing(library):
    drafter, _ = drafter_over([[7, 1, 2, 3, 1, 2]], params=SamplingParams(disable_speculative_decoding=True))
    assert drafter.propose(0, 3) == [] and drafter.propose_tree(0, 2, 2, 4) == ([], [])


def test_the_trie_holds_the_chain_first_then_the_best_first_tree_within_the_tier():
    # the library's tree: 10 (-1), 11 (-1), 12 under 10, 13 under 12, 14 under 11, 15 under 13
    tokens, parents = [10, 11, 12, 13, 14, 15], [-1, -1, 0, 2, 1, 3]
    assert merge_tree([10, 12], tokens, parents, depth=3, topk=2, max_nodes=8) == (
        [10, 12, 11, 13, 14], [0, 1, 0, 2, 3])          # 15 is at depth 4: cut
    # the chain's path first: another first child of the root; topk 1 keeps only it, and its subtree
    assert merge_tree([11, 14], tokens, parents, depth=3, topk=1, max_nodes=8) == ([11, 14], [0, 1])
    assert merge_tree([10], tokens, parents, depth=3, topk=2, max_nodes=3) == ([10, 11, 12], [0, 0, 1])


# ---- across requests: the global tree ---------------------------------------------------------------------

PROMPT = [3, 17, 42, 8]


def test_a_request_drafts_from_an_earlier_request_s_output_unless_it_kept_it_out(library):
    target = random_target(seed=2)
    fresh = serve_one(suffix_worker(target), PROMPT, 24)
    worker = suffix_worker(target)
    first = serve_one(worker, PROMPT, 24)
    second = serve_one(worker, PROMPT, 24)
    assert first == fresh and second[0] == fresh[0]       # the same text (greedy)
    assert sum(second[1]) > sum(fresh[1]) and len(second[1]) < len(fresh[1]), (fresh, second)
    private = suffix_worker(target)
    serve_one(private, PROMPT, 24, SamplingParams(max_new_tokens=24, suffix_cache_output=False))
    assert private.drafter.stats()["suffix_global_tree"]["cached_requests"] == 0
    assert serve_one(private, PROMPT, 24) == fresh       # nothing of the first request in its drafts
    worker.drafter.flush_cache()
    assert worker.drafter.stats()["suffix_global_tree"]["cached_tokens"] == 0
    assert serve_one(worker, PROMPT, 24) == fresh


def test_the_global_tree_evicts_the_oldest_and_reports_its_size(library):
    drafter, table = drafter_over([[1, 2, 3]], SuffixConfig(max_cached_requests=2))
    for request in range(3):
        if request:  # the next request in the same slot
            table.host_tokens[0] = [1, 2, 3]
            drafter.prefill(SimpleNamespace(slots=[0], prompts=[[1, 2, 3]]))
        table.host_tokens[0] += [50 + request, 60 + request, 70 + request, 80 + request]
        drafter.end_round(None, [0])
        drafter.release(0)
    stats = drafter.stats()["suffix_global_tree"]
    assert stats["cached_requests"] == 2 and stats["cached_tokens"] == 8 and stats["max_cached_requests"] == 2
    assert stats["bytes"] > 0 and stats["bytes_per_cached_token"] == pytest.approx(stats["bytes"] / 8, rel=0.01)
    # the first request's output is gone: its text drafts nothing; the third's does
    table.host_tokens[0] = [9, 50]
    drafter.prefill(SimpleNamespace(slots=[0], prompts=[[9, 50]]))
    assert drafter.propose(0, 1) == []
    table.host_tokens[0] = [9, 52]
    assert drafter.propose(0, 1) == [60 + 2]


def test_a_follower_keeps_no_trees(library):
    drafter, _ = drafter_over([[1, 2, 3]])
    drafter.lookup_on_leader(lambda packet: None, leader=False)
    drafter.release(0)
    drafter.prefill(SimpleNamespace(slots=[0], prompts=[[1, 2, 3]]))
    assert drafter._request == [None] and drafter.stats()["suffix_global_tree"]["cached_requests"] == 1


# ---- settings and the missing library ---------------------------------------------------------------------


def test_settings_are_checked_and_named():
    assert SuffixConfig() == SuffixConfig(24, 10000, 2.0, 0.1)  # vLLM's, but the spec factor (suffix-replay-tune)
    for bad in (dict(max_tree_depth=0), dict(max_cached_requests=-1), dict(max_spec_factor=0.0),
                dict(min_token_prob=1.5), dict(max_tree_depth=True)):
        with pytest.raises(ValueError, match="suffix_decoding_"):
            SuffixConfig(**bad)
    assert SuffixConfig.from_options({"suffix_decoding_max_tree_depth": 8}).max_tree_depth == 8


def test_without_the_library_suffix_fails_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference", None)
    monkeypatch.delitem(sys.modules, "arctic_inference.suffix_decoding", raising=False)
    with pytest.raises(ImportError, match=r"SUFFIX needs arctic-inference.*tools/setup.sh"):
        SpeculativeWorker(random_target(), None, "SUFFIX", max_seq_len=32)


def test_without_the_library_the_test_command_fails_and_a_plain_run_skips(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if k != "SPECSWAP_TEST_REQUIRE_ALL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"{__file__}::test_a_request_with_speculation_off_drafts_nothing"]
    plain = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "1 skipped" in plain.stdout, plain.stdout + plain.stderr
    strict = subprocess.run(command, cwd=REPOSITORY, env={**env, "SPECSWAP_TEST_REQUIRE_ALL": "1"},
                            capture_output=True, text=True, timeout=300)
    output = strict.stdout + strict.stderr
    assert strict.returncode != 0 and "arctic-inference's suffix trees (SUFFIX) is missing" in output, output
