"""specswap's Llama must compute what transformers' LlamaForCausalLM computes."""

from __future__ import annotations

import pytest
import torch

from model_reference import hf_greedy, make_hf_llama, specswap_greedy, transformers
from specswap.models import load_model

NEW_TOKENS = 32
CONFIGS = {
    "gqa-8q-2kv": {},
    "mha-tied-bias-headdim": dict(num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                                  tie_word_embeddings=True, attention_bias=True, num_hidden_layers=3),
    "gqa-3q-1kv-llama3-rope": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                                   rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=64)),
}


@pytest.fixture(params=sorted(CONFIGS))
def hf_and_ours(request, tmp_path):
    hf_model, directory = make_hf_llama(tmp_path, **CONFIGS[request.param])
    return hf_model, load_model(directory)


def test_greedy_tokens_and_logits_match_transformers(hf_and_ours):
    hf_model, model = hf_and_ours
    prompt = [1, 17, 99, 5, 42, 7, 150, 3]
    hf_tokens, hf_logits = hf_greedy(hf_model, prompt, NEW_TOKENS)
    tokens, logits = specswap_greedy(model, prompt, NEW_TOKENS)
    assert tokens == hf_tokens
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)


def test_batch_of_different_lengths_matches_each_request_alone(hf_and_ours):
    hf_model, model = hf_and_ours
    prompts = [[1, 5, 9], [1, 200, 4, 4, 8, 30, 2], [1, 77, 12, 60, 61]]
    draft_steps = 3  # verify-style multi-token forward after prefill
    cache = model.make_cache(max_batch_size=5, capacity=32)
    slots = torch.tensor([4, 0, 2])  # cache rows need not be 0..B-1
    with torch.no_grad():
        for prompt, slot in zip(prompts, slots):
            model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, slot[None])
        # one batched call: 3 new tokens per request, each at its own positions
        new_ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
        positions = torch.stack([torch.arange(len(p), len(p) + draft_steps) for p in prompts])
        batched = model(new_ids, positions, cache, slots).logits
        for row, prompt in enumerate(prompts):
            full = torch.tensor([prompt + new_ids[row].tolist()])
            alone_cache = model.make_cache(max_batch_size=1, capacity=32)
            alone = model(full, torch.arange(full.shape[1])[None], alone_cache, torch.tensor([0])).logits
            torch.testing.assert_close(batched[row], alone[0, -draft_steps:], atol=1e-5, rtol=0)
            torch.testing.assert_close(batched[row], hf_model(full).logits[0, -draft_steps:], atol=1e-4, rtol=0)


@pytest.mark.capability  # bf16 matmuls, whichever kernel this CPU runs them with
def test_loads_transformers_checkpoint_in_bf16_and_agrees_roughly(tmp_path):
    hf_model, directory = make_hf_llama(tmp_path)
    fp32 = load_model(directory)
    bf16 = load_model(directory, dtype=torch.bfloat16)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    prompt = list(range(1, 20))
    with torch.no_grad():
        ids, positions, slots = torch.tensor([prompt]), torch.arange(len(prompt))[None], torch.tensor([0])
        ref = fp32(ids, positions, fp32.make_cache(1, 32), slots)
        out = bf16(ids, positions, bf16.make_cache(1, 32), slots)
    assert out.logits.dtype == torch.bfloat16 and out.hidden.dtype == torch.bfloat16
    torch.testing.assert_close(out.logits.float(), ref.logits, atol=0.1, rtol=0.05)
    agreement = (out.logits.argmax(-1) == ref.logits.argmax(-1)).float().mean()
    assert agreement >= 0.9


def test_shipped_tiny_matches_transformers():
    from specswap import zoo
    directory = zoo.path("tiny")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    model = load_model(directory)
    prompt = [model.config.bos_token_id, 100, 300, 7, 1500, 42]
    hf_tokens, hf_logits = hf_greedy(hf_model, prompt, NEW_TOKENS)
    tokens, logits = specswap_greedy(model, prompt, NEW_TOKENS)
    assert tokens == hf_tokens
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)
