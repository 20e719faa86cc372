"""Cache semantics of Gemma3ForCausalLM: batched rows of different lengths, KV rollback and the sliding window.

The sliding window is exercised with a small random Gemma 3 (window 4) checked against transformers' model built
from the same config.json and weights, so sequences much longer than the window stay cheap. The real 270M model
gets the batching and rollback checks once at short lengths.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from specswap.models import Gemma3Config, Gemma3ForCausalLM, load_model, save_model

WINDOW = 4
TINY = {
    "model_type": "gemma3_text", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "sliding_window": WINDOW, "sliding_window_pattern": 2, "query_pre_attn_scalar": 32,
    "final_logit_softcapping": 30.0,
}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3Config.from_dict(TINY))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):  # stored as (w - 1): move away from the identity
                parameter.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("tiny_gemma")
    save_model(model, directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_model(tiny_checkpoint, torch.float32)


def run(model, ids, start, cache, slot):
    # ids: [T] one request's new tokens at positions start..start+T-1 -> logits [T, V]
    positions = torch.arange(start, start + len(ids))[None]
    return model(torch.tensor([ids]), positions, cache, torch.tensor([slot])).logits[0]


@torch.no_grad()
def test_tiny_matches_transformers_past_the_window(tiny, tiny_checkpoint):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32).eval()
    assert reference.config.layer_types == list(tiny.config.layer_types)
    ids = torch.randint(0, TINY["vocab_size"], (1, 5 * WINDOW), generator=torch.Generator().manual_seed(1))
    expected = reference(ids).logits[0]
    # prefill a few tokens, then decode one at a time far past the window
    cache = tiny.make_cache(1, 64)
    logits = [run(tiny, ids[0, :3].tolist(), 0, cache, 0)]
    logits += [run(tiny, [int(token)], 3 + step, cache, 0) for step, token in enumerate(ids[0, 3:])]
    torch.testing.assert_close(torch.cat(logits), expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_tiny_window_masks_old_keys(tiny):
    # changing a token more than WINDOW back must change global layers' output but leave a model with only
    # sliding layers untouched; here: the sliding plan really hides keys at positions <= q - WINDOW
    from specswap.models.layers import plan_attention

    cache = tiny.make_cache(1, 16)
    positions = torch.arange(10)[None]
    mask = plan_attention(positions, cache, 10, sliding_window=WINDOW).mask[0, 0]
    for query in range(10):
        visible = mask[query].nonzero().flatten().tolist()
        assert visible == list(range(max(0, query - WINDOW + 1), query + 1))


def check_batched_and_rollback(model, prompts, continuation, atol):
    capacity = max(len(p) for p in prompts) + len(continuation) + 4
    # per request, alone
    alone = []
    for prompt in prompts:
        cache = model.make_cache(1, capacity)
        run(model, prompt, 0, cache, 0)
        alone.append(run(model, continuation, len(prompt), cache, 0))
    # prefill in other slots, each with a draft of wrong tokens after the prompt that is then rolled back:
    # the next forward restarts at len(prompt) and overwrites those cache entries
    cache = model.make_cache(len(prompts) + 1, capacity)
    slots = torch.tensor([2, 0, 1][:len(prompts)])
    for prompt, slot in zip(prompts, slots.tolist()):
        run(model, prompt + [7, 8, 9], 0, cache, slot)
    # then one batched step over rows of different lengths
    positions = torch.stack([torch.arange(len(p), len(p) + len(continuation)) for p in prompts])
    ids = torch.tensor([continuation] * len(prompts))
    batched = model(ids, positions, cache, slots).logits
    for row, expected in enumerate(alone):
        torch.testing.assert_close(batched[row], expected, atol=atol, rtol=0)
        assert torch.equal(batched[row].argmax(-1), expected.argmax(-1))


@torch.no_grad()
def test_tiny_batched_rows_and_rollback(tiny):
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34, 35]]
    check_batched_and_rollback(tiny, prompts, [40, 41, 42, 43, 44, 45], atol=1e-5)


@torch.inference_mode()
def test_gemma_270m_batched_rows_and_rollback(gemma_fp32, gemma_tokenizer):
    prompts = [gemma_tokenizer.encode(text, add_bos=True) for text in ("import os\nimport sys\n\ndef main():", "Hello")]
    # fp32 over 18 layers; batched and single matmuls may split sums differently
    check_batched_and_rollback(gemma_fp32, prompts, gemma_tokenizer.encode(" and then"), atol=1e-3)


def test_cacheless_forward_refuses_inputs_longer_than_the_window(tiny):
    ids = torch.zeros(1, WINDOW + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="sliding window"):
        tiny(ids, torch.arange(WINDOW + 1)[None], None, None)


def test_config_refusals():
    from specswap.models import CheckpointError

    with pytest.raises(CheckpointError, match="attn_logit_softcapping"):
        Gemma3Config.from_dict({**TINY, "attn_logit_softcapping": 50.0})
    with pytest.raises(CheckpointError, match="layer_types"):
        Gemma3Config.from_dict({**TINY, "layer_types": ["sliding_attention"]})
    with pytest.raises(CheckpointError, match="rope_type 'llama3'"):
        Gemma3Config.from_dict({**TINY, "rope_parameters": {
            "full_attention": {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0}}})
