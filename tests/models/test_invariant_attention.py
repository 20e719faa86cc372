"""torch.ops.specswap.invariant_attention: softmax attention over each row's cache slot, read in place.

Against float64 attention; the AVX2 form against the scalar form bit for bit; a query's bits whatever queries
are beside it; keys read from the slot named, not from the row's index; errors that name the bad value.
"""

from __future__ import annotations

import pytest
import torch

from specswap import _core

_C = _core._C


def _case(dim: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, length, slots_total, capacity, keys = 2, 4, 2, 3, 3, 24, 17
    q = torch.randn(batch, heads, length, dim, generator=generator)
    key_buffer = torch.randn(slots_total, kv_heads, capacity, dim, generator=generator)
    value_buffer = torch.randn(slots_total, kv_heads, capacity, dim, generator=generator)
    slots = torch.tensor([2, 0])
    mask = torch.rand(batch, 1, length, keys, generator=generator) > 0.3
    mask[1, 0, 2] = False  # a query that may see no key: zeros
    return q, key_buffer, value_buffer, slots, mask


def _reference(q, key_buffer, value_buffer, slots, mask, scale):
    keys = key_buffer[slots, :, :mask.shape[-1]].double()
    values = value_buffer[slots, :, :mask.shape[-1]].double()
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = (q.double() @ keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    return weights @ values


@pytest.mark.parametrize("dim", [256, 44, 5])  # Gemma's head dim; a tail after the 8-lane blocks; tail only
def test_matches_float64_attention_and_both_forms_give_the_same_bits(dim, simd_restored):
    q, key_buffer, value_buffer, slots, mask = _case(dim)
    scale = dim ** -0.5
    outs = []
    for simd in (False, True):
        _C.simd_math_set(simd)
        outs.append(torch.ops.specswap.invariant_attention(q, key_buffer, value_buffer, slots, mask, scale))
    torch.testing.assert_close(outs[0].double(), _reference(q, key_buffer, value_buffer, slots, mask, scale),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][1, :, 2], torch.zeros_like(outs[0][1, :, 2]))


def test_a_query_has_the_same_bits_alone(simd_restored):
    q, key_buffer, value_buffer, slots, mask = _case(256, seed=1)
    full = torch.ops.specswap.invariant_attention(q, key_buffer, value_buffer, slots, mask, 0.0625)
    for b in range(q.shape[0]):
        for t in range(q.shape[2]):
            alone = torch.ops.specswap.invariant_attention(q[b:b + 1, :, t:t + 1], key_buffer, value_buffer,
                                                           slots[b:b + 1], mask[b:b + 1, :, t:t + 1], 0.0625)
            assert torch.equal(alone[0, :, 0], full[b, :, t]), (b, t)


def test_keys_come_from_the_slot_named():
    q, key_buffer, value_buffer, slots, mask = _case(64, seed=2)
    out = torch.ops.specswap.invariant_attention(q, key_buffer, value_buffer, slots, mask, 0.125)
    moved_keys, moved_values = torch.zeros_like(key_buffer), torch.zeros_like(value_buffer)
    moved_keys[1], moved_values[1] = key_buffer[2], value_buffer[2]  # slot 2's rows now in slot 1
    moved_keys[0], moved_values[0] = key_buffer[0], value_buffer[0]
    moved = torch.ops.specswap.invariant_attention(q, moved_keys, moved_values, torch.tensor([1, 0]), mask, 0.125)
    assert torch.equal(out, moved)


def test_errors_name_the_bad_value():
    q, key_buffer, value_buffer, slots, mask = _case(16)
    call = torch.ops.specswap.invariant_attention
    with pytest.raises(RuntimeError, match="slot 3 is outside the cache's 3 slots"):
        call(q, key_buffer, value_buffer, torch.tensor([3, 0]), mask, 1.0)
    with pytest.raises(RuntimeError, match="must be float32, got Float, BFloat16"):
        call(q, key_buffer.bfloat16(), value_buffer, slots, mask, 1.0)
    with pytest.raises(RuntimeError, match="1 slots for a batch of 2"):
        call(q, key_buffer, value_buffer, slots[:1], mask, 1.0)
    with pytest.raises(RuntimeError, match="at most the cache capacity 24"):
        call(q, key_buffer, value_buffer, slots, torch.ones(2, 1, 3, 25, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="slots must be 1-D int64"):
        call(q, key_buffer, value_buffer, slots.int(), mask, 1.0)
