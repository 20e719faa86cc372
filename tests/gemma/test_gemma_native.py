"""Gemma 3 270M with native weights (the GGUF's own blocks on ggml's kernels): speculative greedy output equals
target-only greedy output with the same weights at every tier and with forced switching every round; native and
dequantized-fp32 greedy agree above a floor on the parity prompts; the native target takes at most half the
memory of bf16; the EAGLE head runs on the target's blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from components import require_native_kernels
from specswap.zoo.eagle_training import DEFAULT_OUT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from spec_helpers import run_to_completion  # noqa: E402

PROMPTS = ["def add(a, b):", "1, 2, 3, 4, 5,", "The capital of France is", "for i in range(10):"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def gemma_native(gguf_path):
    from specswap.models import load_model, load_tokenizer
    from specswap.zoo.gemma import resolve

    require_native_kernels()
    directory = resolve("gemma-3-270m", "native", progress=False)
    return load_model(directory, torch.float32), load_tokenizer(directory)


@pytest.fixture(scope="module")
def native_reference(gemma_native):
    from specswap.engine import Engine

    model, tokenizer = gemma_native
    plain = Engine(model, None, None, tokenizer=tokenizer, max_seq_len=96, max_batch_size=len(PROMPTS))
    return [r.token_ids for r in plain.generate(PROMPTS, NEW_TOKENS)]


def native_draft(algorithm: str, model):
    """The shipped EAGLE head on the native target's blocks (Q8_0 linears) for EAGLE, None for NGRAM."""
    from specswap.models import load_eagle_head

    if algorithm != "EAGLE":
        return None
    if not (DEFAULT_OUT / "model.safetensors").is_file():
        pytest.skip(f"no Gemma EAGLE head shipped at {DEFAULT_OUT}")
    return load_eagle_head(DEFAULT_OUT, model, quantization="q8_0")


def test_native_model_holds_the_file_blocks(gemma_native):
    from specswap.models.quantized import GGML_TYPE_NAMES, REPACKED, QuantizedEmbedding, QuantizedLinear, repack_default

    model, _ = gemma_native
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert model.lm_head is model.model.embed_tokens.table  # tied: one copy of the blocks
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert {m.block_type for m in layers} == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}  # the file's own types, none dequantized
    # held as they are, or (Q8_0, Q5_0, where the CPU has AVX2) interleaved by eight rows
    held = {GGML_TYPE_NAMES[m.weight_type] for m in layers}
    layouts = {REPACKED.get(kind, kind) for kind in ("Q8_0", "Q5_0", "Q4_K", "Q6_K")}
    assert held == (layouts if repack_default() else {"Q8_0", "Q5_0", "Q4_K", "Q6_K"})
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model.dtype == torch.float32


def test_native_resident_bytes_at_most_half_of_bf16(gemma_native):
    model, _ = gemma_native
    native = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                                                        (*model.parameters(), *model.buffers())}.values())
    bf16 = sum(m.numel() for m in (*model.parameters(),)) * 2
    from specswap.models.quantized import QuantizedLinear
    bf16 += sum(m.in_features * m.out_features * 2 for m in model.modules()
                if isinstance(m, QuantizedLinear) and m is not model.lm_head) + model.lm_head.in_features * model.lm_head.out_features * 2
    assert native <= 0.5 * bf16, (native, bf16)


@pytest.mark.parametrize("algorithm", ["NGRAM", "EAGLE"])
@pytest.mark.parametrize("steps", [1, 3, 7])
def test_native_speculative_greedy_equals_native_target_only(algorithm, steps, gemma_native, native_reference):
    from specswap.engine import Engine

    model, tokenizer = gemma_native
    draft = native_draft(algorithm, model)
    engine = Engine(model, draft, algorithm, speculative_num_steps=steps, tokenizer=tokenizer, max_seq_len=96,
                    max_batch_size=len(PROMPTS))
    results = engine.generate(PROMPTS, NEW_TOKENS)
    assert [r.token_ids for r in results] == native_reference
    assert sum(sum(r.accept_lengths) for r in results) > 0  # drafts landed: the verify path ran with k+1 rows


@pytest.mark.parametrize("algorithm", ["NGRAM", "EAGLE"])
def test_native_draft_trees_equal_native_target_only(algorithm, gemma_native, native_reference):
    """A tree tier on the batch-invariant native kernels: identical output, with a switch among chain and tree
    tiers every round (the tree [3, 2, 6]; chains 1 and 5)."""
    from specswap.engine import encode_text
    from specswap.sampling import SamplingParams
    from specswap.worker import SpeculativeWorker

    model, tokenizer = gemma_native
    draft = native_draft(algorithm, model)
    worker = SpeculativeWorker(model, draft, algorithm, 3, max_batch_size=len(PROMPTS), max_seq_len=96,
                               tiers=(1, 5), speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    prompts = [encode_text(tokenizer, p) for p in PROMPTS]
    from specswap.worker.layout import tier_key

    tree = tier_key(3, 2, 6)  # tiers are known by key: a chain's steps, a tree's encoded shape
    pattern = (tree, 1, tree, 5)
    outputs, accepts, used = run_to_completion(worker, prompts, NEW_TOKENS, SamplingParams(max_new_tokens=NEW_TOKENS),
                                               switch=lambda i: pattern[i % len(pattern)])
    assert outputs == native_reference
    assert 3 in used and sum(map(sum, accepts)) > 0


def test_native_forced_switching_every_round_is_lossless(gemma_native, native_reference):
    """A different tier every round (1, 3, 7, 1, ...), driven on the worker between rounds."""
    from specswap.engine import encode_text
    from specswap.sampling import SamplingParams
    from specswap.worker import SpeculativeWorker

    model, tokenizer = gemma_native
    tiers = (1, 3, 7)
    worker = SpeculativeWorker(model, None, "NGRAM", 3, max_batch_size=len(PROMPTS), max_seq_len=96, tiers=tiers)
    prompts = [encode_text(tokenizer, p) for p in PROMPTS]
    outputs, _, used = run_to_completion(worker, prompts, NEW_TOKENS, SamplingParams(max_new_tokens=NEW_TOKENS),
                                         switch=lambda i: tiers[i % len(tiers)])
    assert outputs == native_reference
    assert set(used) == set(tiers)


def test_native_and_dequantized_fp32_greedy_agree(gemma_native, native_reference, gemma_fp32, gemma_tokenizer):
    """Native activations are quantized per block (as llama.cpp's), fp32 ones are not: near-ties may flip, so
    this asserts a floor on the share of identical tokens, and reports it."""
    from specswap.engine import Engine

    plain = Engine(gemma_fp32, None, None, tokenizer=gemma_tokenizer, max_seq_len=96, max_batch_size=len(PROMPTS))
    dense = [r.token_ids for r in plain.generate(PROMPTS, NEW_TOKENS)]
    same = sum(next((i for i, (a, b) in enumerate(zip(n, d)) if a != b), len(n)) for n, d in zip(native_reference, dense))
    share = same / sum(len(n) for n in native_reference)
    print(f"native vs dequantized fp32: identical greedy prefix over {share:.0%} of tokens")
    # measured 61 of 96 tokens (0.635; the native kernels' forms give the same bits on every CPU); the floor
    # leaves five tokens of margin
    assert share >= 0.58, share
