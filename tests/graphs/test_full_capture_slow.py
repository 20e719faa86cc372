"""The whole tier x bucket capture on the shipped tiny pair (slow: run with `pytest -m slow tests/graphs`)."""

import pytest
import torch

from specswap.engine import Engine
from specswap.graphs import capture_count

pytestmark = pytest.mark.slow


def test_every_stage_of_every_tier_for_buckets_1_2_4_8():
    before = capture_count()
    graphed = Engine("tiny", speculative_adaptive=True, max_batch_size=8, max_seq_len=512, dtype="float32")
    captured = capture_count() - before
    worker = graphed.worker
    keys, batches = worker.graph_context.key_buckets, worker.graph_context.batch_buckets
    assert batches == (1, 2, 4, 8)
    per_stage = len(keys) * len(batches)
    # verify + draft-extend per tier, and one set of draft steps shared by all tiers
    assert captured == per_stage * (2 * len(graphed.controller.candidate_steps) + 1)
    eager = Engine("tiny", speculative_adaptive=True, max_batch_size=8, max_seq_len=512, dtype="float32",
                   disable_graphs=True)
    prompts = ["def main():\n", "The licence grants", "import os\nimport sys\n", "x = 1\n" * 20] * 2
    graphed_out = [r.token_ids for r in graphed.generate(prompts, max_new_tokens=48)]
    eager_out = [r.token_ids for r in eager.generate(prompts, max_new_tokens=48)]
    assert graphed_out == eager_out
    assert capture_count() - before == captured  # decoding, switching included, captured nothing
    print(f"{captured} graphs, memory per tier {worker.tier_memory_bytes()}")
