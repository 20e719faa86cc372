"""A random EAGLE-3 head in SpecForge's layout over Gemma 3 270M (fp32): the target's auxiliary hidden states come
out of its Gemma decoder (scaled embedding, four norms per layer, sliding and global layers), and decoding stays
equal to target-only greedy decoding under forced tier switching, eager and in stage graphs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from eagle3_helpers import write_random_eagle3  # noqa: E402
from spec_helpers import run_to_completion  # noqa: E402


@pytest.mark.parametrize("graphs", [False, True])
def test_random_eagle3_head_on_gemma_is_lossless_under_switching(tmp_path, gemma_fp32, gemma_tokenizer, graphs):
    from specswap.models.eagle3 import load_eagle3_head
    from specswap.worker import SpeculativeWorker

    target = gemma_fp32
    write_random_eagle3(target, tmp_path, seed=7, token_map=list(range(0, 4096)), scale=0.5)
    head = load_eagle3_head(tmp_path, target)
    assert head.capture_points == (2, 9, 15)  # SGLang's default for 18 layers: inputs of 2, 9, 15
    prompts = [gemma_tokenizer.encode("def fibonacci(n):\n", add_bos=True),
               gemma_tokenizer.encode("The capital of France is", add_bos=True)]
    expected = run_to_completion(SpeculativeWorker(target, None, None, max_seq_len=48), prompts, 10)[0]
    worker = SpeculativeWorker(target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=48, max_batch_size=2,
                               tiers=(0, 1, 3), graphs=graphs)
    assert worker.target.feature_size == 3 * 640 and worker.target.target is target
    pattern = [3, 0, 1, 3, 0]
    tokens, _, used = run_to_completion(worker, prompts, 10, switch=lambda i: pattern[i % len(pattern)])
    assert tokens == expected
    assert used == [pattern[i % len(pattern)] for i in range(len(used))]
