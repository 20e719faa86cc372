"""Gemma 3 270M from the GGUF cache against transformers' Gemma3ForCausalLM loaded from the same GGUF (fp32)."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Überraschung! 日本語のテキストと emoji 🎉 mixed:",
]
NEW_TOKENS = 32
# Same dequantized weights, same op order (fp32 RMSNorm, SDPA, tanh-GELU): measured max |diff| is 0.0 on
# this machine. The bound leaves room for other BLAS/thread splits: logits here reach |30|, fp32 rounding over 18
# layers stays near 1e-5 relative (~3e-4 absolute), and 2e-3 is still far below the top-1/top-2 gaps the
# greedy check depends on (which the argmax comparison asserts separately).
LOGITS_ATOL = 2e-3


def test_weights_equal_transformers_gguf_loader(gemma_fp32, reference_fp32):
    ours, theirs = gemma_fp32.state_dict(), reference_fp32.state_dict()
    assert sorted(ours) == sorted(theirs)
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert different == []


@pytest.mark.parametrize("prompt", PROMPTS)
@torch.inference_mode()
def test_greedy_decoding_matches(gemma_fp32, reference_fp32, gemma_tokenizer, prompt):
    """Our prefill + 32 cached greedy steps against one teacher-forced reference forward over the same tokens.

    Each of our tokens must be the reference's argmax given the tokens before it, which is exactly the condition
    for transformers' greedy ``generate`` to produce the same 32 tokens, at 1/32 of the reference's cost.
    """
    prompt_ids = gemma_tokenizer.encode(prompt, add_bos=True)
    cache, slots = gemma_fp32.make_cache(1, len(prompt_ids) + NEW_TOKENS), torch.tensor([0])
    out = gemma_fp32(torch.tensor([prompt_ids]), torch.arange(len(prompt_ids))[None], cache, slots)
    logits, hidden, generated = [out.logits[0]], [out.hidden[0]], []
    for step in range(NEW_TOKENS):
        generated.append(int(logits[-1][-1].argmax()))
        if step == NEW_TOKENS - 1:
            break
        out = gemma_fp32(torch.tensor([[generated[-1]]]), torch.tensor([[len(prompt_ids) + step]]), cache, slots)
        logits.append(out.logits[0])
        hidden.append(out.hidden[0])
    reference = reference_fp32(torch.tensor([prompt_ids + generated[:-1]]), output_hidden_states=True)
    reference_next = reference.logits[0, len(prompt_ids) - 1:].argmax(-1).tolist()
    assert generated == reference_next, (gemma_tokenizer.decode(generated), gemma_tokenizer.decode(reference_next))
    torch.testing.assert_close(torch.cat(logits), reference.logits[0], atol=LOGITS_ATOL, rtol=0)
    # transformers' last hidden state is after the final norm, like ModelOutput.hidden
    torch.testing.assert_close(torch.cat(hidden), reference.hidden_states[-1][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("text", [
    "def add(a, b):\n\treturn a + b  # sum\n\n\nclass Foo:\n    pass\n",
    "The quick brown fox jumps over the lazy dog. It's 3.14159 — roughly π!",
    "naïve café, Straße, 東京タワー, Привет мир, مرحبا, 🤖🎉👍🏽",
    "   leading spaces and trailing   \n\n\n  <start_of_turn>user\nhi<end_of_turn>\n<b>html</b>",
    "",
])
def test_tokenizer_matches_transformers(gemma_tokenizer, reference_tokenizer, text):
    ids = gemma_tokenizer.encode(text)
    assert ids == reference_tokenizer.encode(text, add_special_tokens=False)
    assert gemma_tokenizer.encode(text, add_bos=True) == reference_tokenizer.encode(text)
    assert gemma_tokenizer.decode(ids) == reference_tokenizer.decode(ids, skip_special_tokens=True)


def test_tokenizer_ids(gemma_tokenizer, gemma_fp32):
    assert gemma_tokenizer.bos_token_id == 2
    assert gemma_tokenizer.token_to_id("<end_of_turn>") in gemma_tokenizer.eos_token_ids
    assert 1 in gemma_tokenizer.eos_token_ids
    assert gemma_tokenizer.vocab_size == gemma_fp32.config.vocab_size == 262144
