"""Lossless on the real model: in fp32, speculative greedy output equals target-only greedy output on Gemma 3
270M for the shipped EAGLE head and for NGRAM, at tiers 1, 3 and 7 and as draft trees (the tiny pair covers the
sampling law)."""

from __future__ import annotations

import pytest

from specswap.zoo.eagle_training import DEFAULT_OUT

PROMPTS = ["def add(a, b):", "1, 2, 3, 4, 5,"]
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def reference(gemma_fp32, gemma_tokenizer):
    from specswap.engine import Engine

    plain = Engine(gemma_fp32, None, None, tokenizer=gemma_tokenizer, max_seq_len=96, max_batch_size=len(PROMPTS))
    return [r.token_ids for r in plain.generate(PROMPTS, NEW_TOKENS)]


@pytest.fixture(scope="module")
def eagle_head(gemma_fp32):
    from specswap.models import load_eagle_head

    if not (DEFAULT_OUT / "model.safetensors").is_file():
        pytest.skip(f"no Gemma EAGLE head shipped at {DEFAULT_OUT}")
    return load_eagle_head(DEFAULT_OUT, gemma_fp32)


@pytest.mark.parametrize("algorithm", ["EAGLE", "NGRAM"])
@pytest.mark.parametrize("steps", [1, 3, 7])
def test_fp32_speculative_greedy_equals_target_only(algorithm, steps, gemma_fp32, gemma_tokenizer, reference,
                                                   request):
    from specswap.engine import Engine

    draft = request.getfixturevalue("eagle_head") if algorithm == "EAGLE" else None
    engine = Engine(gemma_fp32, draft, algorithm, speculative_num_steps=steps, tokenizer=gemma_tokenizer,
                    max_seq_len=96, max_batch_size=len(PROMPTS))
    results = engine.generate(PROMPTS, NEW_TOKENS)
    assert [r.token_ids for r in results] == reference
    assert sum(r.num_verify_rounds for r in results) > 0
    if algorithm == "NGRAM" and steps > 1:  # "1, 2, 3, 4, 5," continues by pattern: some drafts must land
        assert sum(sum(r.accept_lengths) for r in results) > 0


@pytest.mark.parametrize("algorithm", ["EAGLE", "NGRAM"])
@pytest.mark.parametrize("shape", [(3, 2, 6), (2, 3, 7)])
def test_fp32_draft_trees_equal_target_only(algorithm, shape, gemma_fp32, gemma_tokenizer, reference, request):
    from specswap.engine import Engine

    draft = request.getfixturevalue("eagle_head") if algorithm == "EAGLE" else None
    steps, topk, nodes = shape
    engine = Engine(gemma_fp32, draft, algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=nodes, tokenizer=gemma_tokenizer, max_seq_len=96,
                    max_batch_size=len(PROMPTS))
    results = engine.generate(PROMPTS, NEW_TOKENS)
    assert [r.token_ids for r in results] == reference
    assert sum(sum(r.accept_lengths) for r in results) > 0
