"""bench/suffix_replay.py: its counting on synthetic streams (drafters whose drafts are known), and its SUFFIX and
NGRAM replays against what the worker itself accepts on the same requests (a tiny target that falls into loops,
requests one at a time in one slot, the global tree kept across them)."""

import json
import sys
from pathlib import Path

import pytest

from scripts import load_script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

replay_script = load_script("suffix_replay")


class Scripted:
    """Drafts ``drafts[i]`` (a chain; [] for none) at its i-th call, over every request."""

    def __init__(self, drafts):
        self.drafts, self.calls, self.fed, self.started = list(drafts), 0, [], []

    def start(self, prompt):
        self.started.append(prompt)

    def draft(self, tokens):
        drafts = self.drafts[self.calls]
        self.calls += 1
        return replay_script.chain(drafts) if drafts else ([], [])

    def feed(self, new):
        self.fed.append(new)

    def stop(self):
        pass


def test_counting_on_a_synthetic_stream():
    # output [10, 11, 12, 13, 14, 15]: the prefill emits 10; round 1 drafts [11, 12, 99] (2 accepted, bonus 13);
    # round 2 drafts nothing (plain decode: 14); round 3 drafts [15, 16, 17] where one token is left (1 accepted)
    drafter = Scripted([[11, 12, 99], [], [15, 16, 17]])
    tally = replay_script.replay([([1, 2], [10, 11, 12, 13, 14, 15])], drafter)
    assert (tally.requests, tally.tokens, tally.verifies, tally.plain_rounds, tally.accepted) == (1, 5, 2, 1, 3)
    assert drafter.fed == [[10], [11, 12, 13], [14], [15]]
    assert drafter.started == [[1, 2]]
    figures = tally.figures()
    assert figures["accepted_per_verify"] == 1.5 and figures["tokens_per_verify"] == 2.5
    assert figures["verify_share"] == round(2 / 3, 3) and figures["tokens_per_round"] == round(5 / 3, 3)


def test_tree_acceptance_takes_the_deepest_matching_path():
    # root -> 5 (1) -> 6 (2) -> 9 (3); root -> 5 (4, a copy) -> 7 (5) -> 8 (6): the second branch matches deeper
    nodes, parents = [5, 6, 9, 5, 7, 8], [0, 1, 2, 0, 4, 5]
    assert replay_script.accepted_length(nodes, parents, [5, 7, 8, 1]) == 3
    assert replay_script.accepted_length(nodes, parents, [5, 6, 1]) == 2
    assert replay_script.accepted_length(nodes, parents, [4]) == 0
    assert replay_script.accepted_length(nodes, parents, [5, 7]) == 2  # the stream ends: no deeper match


def test_suffix_replay_drafts_from_the_global_tree():
    """The second request's output repeats the first's: the global tree drafts it from the start."""
    output = [30, 31, 32, 33, 34, 35, 36, 37, 38]
    requests = [([1, 2, 3], output), ([4, 5, 6], output)]
    per_request = [replay_script.replay([r], replay_script.SuffixReplay(replay_script.Shape(3), 24, 2.0, 0.1))
                   for r in requests]
    both = replay_script.replay(requests, replay_script.SuffixReplay(replay_script.Shape(3), 24, 2.0, 0.1))
    assert per_request[0].accepted == per_request[1].accepted == 0  # alone, nothing repeats
    # request 2 after 30: [31, 32] (a match of 1 x spec factor 2, padded: 2 accepted), after 33: [34, 35, 36]
    # (3 accepted), after 37: 38 (1 accepted, the stream's last token)
    assert (both.verifies, both.plain_rounds, both.accepted) == (3, 8, 6)


def worker_trace(algorithm, shape, prompts, max_new_tokens, options=None):
    """Each prompt served alone in slot 0 of one worker, one after another: (prompt, output, accept lengths, whether
    each round verified)."""
    from spec_helpers import attention_pair
    from specswap.sampling import SamplingParams
    from specswap.worker import SpeculativeWorker
    target = attention_pair()[0]
    steps, topk, nodes = shape
    worker = SpeculativeWorker(target, None, algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                               speculative_num_draft_tokens=nodes, max_seq_len=128, **(options or {}))
    served = []
    for prompt in prompts:
        params = SamplingParams(max_new_tokens=max_new_tokens)
        tokens = list(worker.prefill([0], [prompt], [params]))
        rounds = []
        while len(tokens) < max_new_tokens:
            result = worker.decode_round([0])
            tokens += result.new_tokens[0]
            rounds.append((result.accept_lengths[0], result.measured_tier))
        worker.release(0)
        served.append((prompt, tokens, rounds))
    return served


@pytest.mark.parametrize("algorithm,shape,factor", [("SUFFIX", (3, 1, 4), 1.0), ("SUFFIX", (3, 1, 4), 2.0),
                                                    ("SUFFIX", (3, 2, 6), 1.0), ("SUFFIX", (3, 2, 6), 2.0),
                                                    ("NGRAM", (3, 1, 4), None), ("NGRAM", (3, 2, 6), None)])
def test_replay_accepts_what_the_worker_accepts(algorithm, shape, factor):
    if algorithm == "SUFFIX":
        from components import require_module
        from specswap.worker.suffix import INSTALL
        require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [1, 2, 3], [9, 9, 9, 9, 2]]
    options = {"drafter_options": {"suffix_decoding_max_spec_factor": factor}} if factor else None
    served = worker_trace(algorithm, shape, prompts, 24, options)
    steps, topk, nodes = shape
    replay_shape = replay_script.Shape(steps, topk, nodes if topk > 1 else 0)
    drafter = replay_script.SuffixReplay(replay_shape, 24, factor, 0.1,  # as built: prompt lookup first
                                         lookup=replay_script.NgramReplay(replay_shape, None)) \
        if algorithm == "SUFFIX" else replay_script.NgramReplay(replay_shape, None)
    trace = []
    tally = replay_script.replay([(prompt, output) for prompt, output, _ in served], drafter, trace)
    rounds = [accepted if verified else None for _, _, request_rounds in served for accepted, verified in request_rounds]
    assert trace == rounds  # round by round: None a plain decode, else the drafts accepted
    assert tally.accepted == sum(a for a in rounds if a) > 0 and None in rounds


def test_suffix_pads_as_the_worker_does():
    """Prompt [3, 4], then 3: the match "3" (length 1 x spec factor 1) drafts [4]. A chain pads it with its last
    token ([4, 4, 4]: 3 accepted where 4 repeats); a tree pads with the request's last token under the root (3:
    accepted where 3 comes next)."""
    suffix = replay_script.SuffixReplay
    trace = []
    replay_script.replay([([3, 4], [3, 4, 4, 4, 4])], suffix(replay_script.Shape(3), 24, 1.0, 0.1), trace)
    assert trace == [3]
    trace = []
    replay_script.replay([([3, 4], [3, 3, 9])], suffix(replay_script.Shape(2, 2, 6), 24, 1.0, 0.1), trace)
    assert trace == [1]


def _at(lookup=None, trees=None, path=None):
    """A Position where every tier k has the given accepted counts (a dict k -> accepted, or None: no draft)."""
    tiers = replay_script.BOUND_TIERS
    return replay_script.Position({k: (lookup or {}).get(k) for k in tiers}, {k: (trees or {}).get(k) for k in tiers},
                                  {k: (path or {}).get(k) for k in tiers})


def test_row_costs_interpolate_between_measured_counts():
    costs = replay_script.RowCosts({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.1})
    assert costs(2) == 1.1 and costs(3) == pytest.approx(1.2) and costs(6) == pytest.approx(1.7)


def test_row_costs_read_only_the_streams_weights(tmp_path):
    # bench_gemma_forward.py --weights native,fp32 writes both tables into one JSON: the fp32 rows must not
    # overwrite the native ones (they did: the bound was modelled at dense weights' costs)
    rows = [{"weights": w, "tokens": n, "forward_ratio_to_one": r}
            for w, table in (("native", {1: 1.0, 2: 1.09, 4: 1.27}), ("fp32", {1: 1.0, 2: 1.99, 4: 1.52}))
            for n, r in table.items()]
    path = tmp_path / "forward.json"
    path.write_text(json.dumps({"results": rows}))
    assert replay_script.RowCosts.from_json(str(path)).ratios == {1: 1.0, 2: 1.09, 4: 1.27}
    assert replay_script.RowCosts.from_json(str(path), "fp32").ratios == {1: 1.0, 2: 1.99, 4: 1.52}
    with pytest.raises(SystemExit, match="no forward costs for weights 'bf16'"):
        replay_script.RowCosts.from_json(str(path), "bf16")


def test_clairvoyant_time_is_the_shortest_path():
    costs = replay_script.RowCosts({1: 1.0, 2: 1.5, 4: 2.0, 8: 4.0})
    # 4 positions: at the first, lookup's tier-3 draft accepts 3 (4 rows, cost 2.0, moves 4: the stream is done);
    # the trees' tier-1 draft accepts 1 (2 rows, 1.5, moves 2)
    stream = [_at(lookup={3: 3}, trees={1: 1}), _at(), _at(), _at()]
    assert replay_script.clairvoyant_time([stream], costs, ["lookup"]) == pytest.approx(2.0)
    assert replay_script.clairvoyant_time([stream], costs, ["trees"]) == pytest.approx(1.5 + 2.0)  # then 2 plain
    # a draft that accepts nothing is never worth its rows: four plain decodes
    assert replay_script.clairvoyant_time([[_at(lookup={7: 0})] * 4], costs, ["lookup"]) == pytest.approx(4.0)


def test_fixed_time_follows_each_rule():
    costs = replay_script.RowCosts({1: 1.0, 2: 1.5, 4: 2.0, 8: 4.0})
    k = 3
    # position 0: lookup accepts 0, the trees' padded chain 2, their own path (2 tokens, score 1.5) 2
    stream = [_at(lookup={k: 0}, trees={k: 2}, path={k: (2, 2, 1.5)}), _at(trees={k: 0}, path={k: (0, 1, 0.2)}),
              _at(), _at()]
    # NGRAM's lookup: verify (2.0, moves 1), plain (no lookup draft), plain, plain
    assert replay_script.fixed_time([stream], costs, k, "lookup") == pytest.approx(2.0 + 3)
    # SUFFIX as built: lookup first (2.0, moves 1); then the trees padded to k (2.0, accepts 0, moves 1); 2 plain
    assert replay_script.fixed_time([stream], costs, k, "lookup, then trees") == pytest.approx(2.0 + 2.0 + 2)
    # score >= 1: the trees' path first (3 rows at 1.75, moves 3), then one plain
    assert replay_script.fixed_time([stream], costs, k, "score>=1") == pytest.approx(1.75 + 1)
    # padded, as a tier verifies today: the trees' chain padded to k (4 rows, 2.0; accepts 2, moves 3), one plain
    assert replay_script.fixed_time([stream], costs, k, "score>=1 padded") == pytest.approx(2.0 + 1)
    # below the gate the trees go after lookup, at their own length (position 1: 2 rows, 1.5, accepts 0)
    assert replay_script.fixed_time([stream], costs, k, "score>=2") == pytest.approx(2.0 + 1.5 + 2)
