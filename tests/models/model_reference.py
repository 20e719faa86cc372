"""Reference helpers for model tests: random Hugging Face Llama checkpoints and greedy loops."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


def make_hf_llama(tmp_path, seed: int = 0, **overrides):
    """Save a small random transformers LlamaForCausalLM into tmp_path; return (hf_model, directory)."""
    settings = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                    rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    settings.update(overrides)
    torch.manual_seed(seed)
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()
    # random init leaves norms at 1; perturb them so a missing norm weight would show up in parity
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    directory = tmp_path / f"hf-llama-{seed}"
    hf_model.save_pretrained(directory)
    return hf_model, directory


@torch.no_grad()
def hf_greedy(hf_model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits of every step, recomputing the full sequence (no HF cache involved)."""
    ids = list(prompt)
    for _ in range(new_tokens):
        logits = hf_model(torch.tensor([ids])).logits[0]
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt):], logits  # logits: [len(prompt) + new_tokens - 1, V]


@torch.no_grad()
def specswap_greedy(model, prompt: list[int], new_tokens: int, slot: int = 0, cache=None):
    """Greedy decoding with prefill then one token per step; returns (tokens, logits of all positions)."""
    cache = cache or model.make_cache(max_batch_size=slot + 1, capacity=len(prompt) + new_tokens)
    slots = torch.tensor([slot])
    out = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, slots)
    all_logits = [out.logits[0]]
    tokens = [int(out.logits[0, -1].argmax())]
    for step in range(new_tokens - 1):
        position = len(prompt) + step
        out = model(torch.tensor([[tokens[-1]]]), torch.tensor([[position]]), cache, slots)
        all_logits.append(out.logits[0])
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, torch.cat(all_logits)
