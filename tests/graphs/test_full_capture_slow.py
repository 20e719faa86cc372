"""The whole tier x bucket capture on the shipped tiny pair (slow: run with `pytest -m slow tests/graphs`)."""

import pytest

from specswap.engine import Engine
from specswap.graphs import capture_count

pytestmark = pytest.mark.slow


def expected_captures(worker, tiers) -> int:
    """What start-up must capture, from the structure alone: per tier its verify, its EAGLE draft-extend (tier
    > 0) and, where round graphs are on, its whole greedy round (all three read k + 1 tokens), plus one set of
    draft steps (one token) shared by every tier; each stage once per batch bucket and per key bucket that holds
    its tokens."""
    batches, keys = worker.graph_context.batch_buckets, worker.graph_context.key_buckets

    def per_stage(num_tokens):
        return len(batches) * sum(1 for key_length in keys if key_length >= num_tokens)

    eagle = worker.speculative_algorithm == "EAGLE"
    total = 0
    for steps in tiers:
        total += per_stage(steps + 1)                                           # verify
        total += per_stage(steps + 1) if eagle and steps else 0                 # draft-extend
        total += per_stage(steps + 1) if worker.round_graphs_enabled else 0     # the round
    if any(tiers):
        total += per_stage(1)                                                   # draft steps, shared
    return total


def test_every_stage_of_every_tier_for_buckets_1_2_4_8():
    before = capture_count()
    sglang = {"policy": "sglang"}  # tiers 1, 3, 7 and switches on acceptance alone
    graphed = Engine("tiny", speculative_adaptive=True, speculative_adaptive_config=sglang, max_batch_size=8,
                     max_seq_len=512, dtype="float32")
    captured = capture_count() - before
    worker = graphed.worker
    assert worker.speculative_algorithm == "EAGLE" and worker.graph_context.batch_buckets == (1, 2, 4, 8)
    tiers = graphed.controller.candidate_tiers
    assert len(tiers) >= 2 and worker.round_graphs_enabled  # the tiny pair runs every kind of graph
    assert captured == expected_captures(worker, tiers)
    eager = Engine("tiny", speculative_adaptive=True, speculative_adaptive_config=sglang, max_batch_size=8,
                   max_seq_len=512, dtype="float32", disable_graphs=True)
    prompts = ["def main():\n", "The licence grants", "import os\nimport sys\n", "x = 1\n" * 20] * 2
    graphed_out = [r.token_ids for r in graphed.generate(prompts, max_new_tokens=48)]
    eager_out = [r.token_ids for r in eager.generate(prompts, max_new_tokens=48)]
    assert graphed_out == eager_out
    assert capture_count() - before == captured  # decoding, switching included, captured nothing
    assert graphed.stats()["num_switches"] >= 1, graphed.stats()  # the decoding did switch tiers
    memory = worker.tier_memory_bytes()
    assert all(memory[steps] > 0 for steps in tiers), memory
