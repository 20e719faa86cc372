"""The worker in graph mode: lossless against target-only in the same mode, and no capture after start-up.

On the test device (``SPECSWAP_TEST_DEVICE``, tests/conftest.py): CUDA graphs under tools/gpu_check.sh."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from spec_helpers import attention_pair, random_eagle_head, random_target, run_to_completion  # noqa: E402

from specswap.capability import cpu_capability  # noqa: E402
from specswap.controller import AdaptiveController  # noqa: E402
from specswap.graphs import capture_count  # noqa: E402
from specswap.sampling import SamplingParams  # noqa: E402
from specswap.worker import SpeculativeWorker  # noqa: E402
from specswap.worker.tiers import Forwards  # noqa: E402

PROMPTS = [[1, 5, 9, 2], [3, 3, 3, 3, 3, 3, 7], [11, 4]]


def _worker(device, algorithm, steps, graphs, tiers=(), round_graphs=None, pair="random"):
    """pair "random": a 2-layer random target and a random head (which accepts next to nothing); "attention":
    spec_helpers.attention_pair, whose head takes about half its drafts, so replayed rounds roll rejected drafts
    back and a tier policy has reasons to move."""
    if pair == "random":
        target = random_target(seed=0).to(device)
        head = random_eagle_head(target).to(device)  # after the target moved: it shares its embedding
    else:
        target, head = attention_pair(head_noise=0.1)
        target, head = target.to(device), head.to(device)
    if algorithm == "EAGLE":
        draft_model = head
    elif algorithm == "STANDALONE":
        draft_model = target  # a draft equal to the target accepts everything
    else:
        draft_model = None
    return SpeculativeWorker(target, draft_model, algorithm, steps, max_batch_size=4, max_seq_len=96, tiers=tiers,
                       graphs=graphs, round_graphs=round_graphs)


def _switching_every_round(worker):
    """A controller that may switch tier every round (alpha 1, no warm-up), every tier built, its tier applied."""
    return AdaptiveController(worker.pool, {"candidate_steps": [1, 3, 7], "ema_alpha": 1.0,
                                            "warmup_batches": 0, "update_interval": 1})


def _assert_switched(tiers):
    """The rounds ran at more than one tier and changed tier more than once (tiers: one entry per round)."""
    switches = sum(a != b for a, b in zip(tiers, tiers[1:]))
    assert len(set(tiers)) >= 2 and switches >= 2, tiers


@pytest.mark.parametrize("algorithm, steps, pair", [("EAGLE", 1, "random"), ("EAGLE", 3, "random"),
                                                    ("EAGLE", 3, "attention"), ("STANDALONE", 3, "random"),
                                                    ("NGRAM", 2, "random"), ("NGRAM", 3, "attention")])
def test_graph_mode_greedy_equals_target_only_graph_mode(device, algorithm, steps, pair):
    reference, _, _ = run_to_completion(_worker(device, None, 0, graphs=True, pair=pair), PROMPTS, 20)
    tokens, accepts, _ = run_to_completion(_worker(device, algorithm, steps, graphs=True, pair=pair), PROMPTS, 20)
    assert tokens == reference
    flat = [a for per in accepts for a in per]
    if algorithm == "STANDALONE":
        assert all(a == steps for per in accepts for a in per[:-1])  # the all-accepted path ran
    if pair == "attention":
        assert 0 < sum(flat) < steps * len(flat)  # drafts taken and rejected: the replayed rounds roll back


def test_graph_mode_matches_eager_mode_tokens(device):
    eager, _, _ = run_to_completion(_worker(device, "EAGLE", 3, graphs=False), PROMPTS, 16)
    graphed, _, _ = run_to_completion(_worker(device, "EAGLE", 3, graphs=True), PROMPTS, 16)
    assert graphed == eager


def test_adaptive_switching_in_graph_mode_captures_nothing_new(device):
    worker = _worker(device, "EAGLE", 3, graphs=True, tiers=(1, 3, 7), pair="attention")
    controller = _switching_every_round(worker)
    captured = capture_count()
    reference, _, _ = run_to_completion(_worker(device, None, 0, graphs=True, pair="attention"), PROMPTS, 40)
    captured_reference = capture_count() - captured
    # 40 tokens: the tier moves 3 -> 7 -> 3 -> 7
    tokens, _, tiers = run_to_completion(worker, PROMPTS, 40, controller=controller)
    assert tokens == reference
    assert capture_count() == captured + captured_reference  # only the reference worker captured
    _assert_switched(tiers)
    memory = worker.tier_memory_bytes()
    assert set(k for k in memory if isinstance(k, int)) == {1, 3, 7}
    assert all(v > 0 for v in memory.values())


def test_graph_mode_sampling_runs_and_is_seeded(device):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    def run():
        worker = _worker(device, "EAGLE", 3, graphs=True)
        gens = [torch.Generator(device=device).manual_seed(i) for i in range(len(PROMPTS))]
        first = worker.prefill(range(len(PROMPTS)), PROMPTS, [params] * len(PROMPTS), gens)
        out = [[t] for t in first]
        for _ in range(4):
            result = worker.decode_round(list(range(len(PROMPTS))))
            for row, new in enumerate(result.new_tokens):
                out[row].extend(new)
        return out
    assert run() == run()


@pytest.mark.parametrize("algorithm, steps, pair", [("EAGLE", 1, "random"), ("EAGLE", 3, "random"),
                                                    ("EAGLE", 3, "attention"), ("STANDALONE", 2, "random"),
                                                    ("NGRAM", 3, "random"), (None, 0, "random")])
def test_round_graphs_replay_every_greedy_round_and_match_stage_graphs(device, algorithm, steps, pair):
    # 3 requests in a bucket of 4: the padded row runs on the scratch slot and must disturb nothing
    stage_only, _, _ = run_to_completion(_worker(device, algorithm, steps, graphs=True, round_graphs=False,
                                                 pair=pair), PROMPTS, 20)
    worker = _worker(device, algorithm, steps, graphs=True, round_graphs=True, pair=pair)
    tier_states = worker.rounds.values()
    assert all(len(tier.graphs) == 1 for tier in tier_states) and steps in worker.rounds  # one drafter: one graph
    replays = []
    for tier in tier_states:
        def counted(slots, key_length, graphs=tier.graphs[0]):
            replays.append(len(slots))
            return graphs(slots, key_length)

        tier.graphs = (counted,)

    def no_stage_replay(*args, **kwargs):
        raise AssertionError("a greedy round replayed a stage graph instead of its round graph")

    for tier in tier_states:  # greedy rounds must not touch the stage graphs at all
        stages = tier.run.forwards
        tier.run.forwards = Forwards(
            verify=no_stage_replay, draft_steps={width: no_stage_replay for width in stages.draft_steps},
            draft_extend=no_stage_replay if stages.draft_extend is not None else None)
    tokens, _, _ = run_to_completion(worker, PROMPTS, 20)
    reference, _, _ = run_to_completion(_worker(device, None, 0, graphs=False, pair=pair), PROMPTS, 20)
    assert tokens == stage_only == reference
    assert replays and max(replays) == 3


def test_round_graphs_follow_tier_switches_and_report_memory(device):
    worker = _worker(device, "EAGLE", 3, graphs=True, tiers=(1, 3, 7), round_graphs=True, pair="attention")
    controller = _switching_every_round(worker)
    assert {t for t, tier in worker.rounds.items() if tier.graphs} == {1, 3, 7}
    captured = capture_count()
    tokens, _, tiers = run_to_completion(worker, PROMPTS, 40, controller=controller)
    assert capture_count() == captured
    _assert_switched(tiers)
    reference, _, _ = run_to_completion(_worker(device, None, 0, graphs=False, pair="attention"), PROMPTS, 40)
    assert tokens == reference
    # each tier's memory counts its round runners on top of its stage runners (compared within this worker: on
    # CUDA a runner's share of the graph pool depends on what was captured before it, so two workers differ)
    memory = worker.tier_memory_bytes()
    for t in (1, 3, 7):
        tier = worker.rounds[t]
        rounds, stages = tier.graphs[0].memory_bytes(), tier.run.forwards
        assert rounds > 0
        assert memory[t] >= rounds + stages.verify.memory_bytes() + stages.draft_extend.memory_bytes()


def test_round_graphs_need_graph_mode_and_default_to_small_targets():
    target = random_target(seed=0)
    with pytest.raises(ValueError, match="needs graphs=True"):
        SpeculativeWorker(target, None, None, graphs=False, round_graphs=True)
    assert SpeculativeWorker(target, None, None, max_seq_len=32, graphs=True).round_graphs_enabled
    assert not SpeculativeWorker(target, None, None, max_seq_len=32, graphs=False).round_graphs_enabled


@pytest.mark.capability
def test_bf16_weight_repacking_follows_the_cpu_capability(cpu_override):
    # mkldnn::_reorder_linear_weight raises without oneDNN's bf16 path: the worker repacks only where it exists
    target = random_target(seed=0).to(torch.bfloat16)
    worker = SpeculativeWorker(target, None, None, max_batch_size=4, max_seq_len=96, graphs=True)
    assert worker.graph_context.pool.pack_linear_weights == cpu_capability().onednn_bf16
    assert not cpu_override("-avx512").onednn_bf16
    worker = SpeculativeWorker(target, None, None, max_batch_size=4, max_seq_len=96, graphs=True)
    assert not worker.graph_context.pool.pack_linear_weights
    tokens, _, _ = run_to_completion(worker, PROMPTS, 8)  # captured and replayed in bf16, nothing repacked
    assert worker.graph_context.pool.derived_bytes == 0 and all(len(t) == 8 for t in tokens)
