"""The shipped EAGLE head for Gemma 3 270M loads onto the target and drafts from its 16k-token slice."""

from __future__ import annotations

import json

import pytest
import torch

from specswap.zoo.eagle_training import DEFAULT_OUT

MAX_SHIPPED_BYTES = 25 * 2**20


@pytest.fixture(scope="module")
def shipped():
    if not (DEFAULT_OUT / "model.safetensors").is_file():
        pytest.skip(f"no Gemma EAGLE head shipped at {DEFAULT_OUT}")
    return DEFAULT_OUT


def test_shipped_head_is_small_and_recorded(shipped):
    assert sum(f.stat().st_size for f in shipped.iterdir()) <= MAX_SHIPPED_BYTES
    record = json.loads((shipped / "training_record.json").read_text())
    assert record["best"]["step1"] > 0 and record["evals"]
    assert "Gemma Terms of Use" in record["licence"]


@torch.inference_mode()
def test_shipped_head_drafts_on_the_target(shipped, gemma_fp32, gemma_tokenizer):
    from specswap.models import load_eagle_head

    head = load_eagle_head(shipped, gemma_fp32)
    assert head.draft_vocab_size == 16384
    assert torch.equal(head.token_map, torch.unique(head.token_map))  # sorted, distinct target ids
    ids = torch.tensor([gemma_tokenizer.encode("import os\nimport sys\n", add_bos=True)])
    positions = torch.arange(ids.shape[1])[None]
    features = gemma_fp32(ids, positions, gemma_fp32.make_cache(1, 32), torch.tensor([0])).hidden
    # entry j consumes (x_{j+1}, f_j): one cached pass over the prompt, then read the draft of the next token
    out = head(ids[:, 1:], features[:, :-1], positions[:, 1:], head.make_cache(1, 32), torch.tensor([0]))
    assert out.logits.shape == (1, ids.shape[1] - 1, 16384)
    draft = head.token_map[out.logits[0, -1].argmax()]
    assert 0 <= int(draft) < gemma_fp32.config.vocab_size


def test_engine_by_name_uses_the_shipped_head_and_stays_lossless(gemma_fp32_dir):
    # Engine("gemma-3-270m") resolves the converted cache and picks the shipped EAGLE head by default
    from specswap import zoo
    from specswap.engine import Engine

    assert zoo.path("gemma-3-270m-eagle") == DEFAULT_OUT or (zoo.path("gemma-3-270m-eagle") / "config.json").is_file()
    speculative = Engine("gemma-3-270m", speculative_num_steps=3, dtype="float32", max_seq_len=128, max_batch_size=1)
    assert speculative.draft.token_map is not None
    plain = Engine(speculative.target, None, None, tokenizer=speculative.tokenizer, max_seq_len=128, max_batch_size=1)
    prompt = "def add(a, b):"
    assert speculative.generate([prompt], 24)[0].token_ids == plain.generate([prompt], 24)[0].token_ids
