"""Cache semantics the worker relies on: rollback is forgetting a length, slots are independent."""

from __future__ import annotations

import pytest
import torch

from model_reference import make_hf_llama
from specswap.models import KVCache, load_model


@pytest.fixture
def model(tmp_path):
    return load_model(make_hf_llama(tmp_path)[1])


def run(model, cache, ids, start, slot=0):
    positions = torch.arange(start, start + len(ids))[None]
    with torch.no_grad():
        return model(torch.tensor([ids]), positions, cache, torch.tensor([slot]))


def test_rollback_by_forgetting_length_equals_fresh_run(model):
    prefix, rejected, accepted = [1, 8, 9, 10, 11], [50, 51, 52, 53], [70, 71]
    cache = model.make_cache(max_batch_size=1, capacity=32)
    run(model, cache, prefix, 0)
    run(model, cache, rejected, len(prefix))              # draft tokens written, then rejected
    out = run(model, cache, accepted, len(prefix))        # overwrite from the accepted length on
    fresh = run(model, model.make_cache(1, 32), prefix + accepted, 0)
    torch.testing.assert_close(out.logits[0], fresh.logits[0, len(prefix):], atol=1e-5, rtol=0)
    # a shorter write than what was rejected: stale keys further right must be ignored
    out_next = run(model, cache, [90], len(prefix) + len(accepted))
    fresh_next = run(model, model.make_cache(1, 32), prefix + accepted + [90], 0)
    torch.testing.assert_close(out_next.logits[0, -1], fresh_next.logits[0, -1], atol=1e-5, rtol=0)


def test_slots_do_not_interfere(model):
    cache = model.make_cache(max_batch_size=2, capacity=16)
    run(model, cache, [1, 2, 3, 4], 0, slot=0)
    before = run(model, model.make_cache(1, 16), [1, 2, 3, 4, 5], 0).logits[0, -1]
    run(model, cache, [9, 9, 9, 9, 9, 9], 0, slot=1)      # another request fills slot 1
    after = run(model, cache, [5], 4, slot=0).logits[0, -1]
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)


def test_cache_layout_and_memory(model):
    cache = model.make_cache(max_batch_size=3, capacity=40, dtype=torch.bfloat16)
    config = model.config
    assert len(cache.keys) == len(cache.values) == config.num_hidden_layers
    assert cache.keys[0].shape == (3, config.num_key_value_heads, 40, config.head_dim)
    assert cache.keys[0].data_ptr() != cache.keys[1].data_ptr()
    assert cache.memory_bytes() == 2 * config.num_hidden_layers * 3 * config.num_key_value_heads * 40 * config.head_dim * 2


def test_position_beyond_capacity_is_a_clear_error(model):
    cache = model.make_cache(max_batch_size=1, capacity=4)
    with pytest.raises(ValueError, match="capacity 4"):
        run(model, cache, [1, 2, 3, 4, 5], 0)


def test_cache_from_other_model_is_rejected(model):
    with pytest.raises(ValueError, match="layers"):
        run(model, KVCache(5, 1, 2, 8, 8), [1], 0)


def test_cacheless_training_forward_matches_cached_forward(model):
    ids = torch.tensor([[1, 4, 9, 16, 25, 36], [2, 3, 5, 7, 11, 13]])
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        cached = model(ids, positions, model.make_cache(2, 8), torch.arange(2))
        cacheless = model(ids, positions, None, None)
    torch.testing.assert_close(cacheless.logits, cached.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(cacheless.hidden, cached.hidden, atol=1e-5, rtol=0)


def test_explicit_key_length_gives_the_same_result(model):
    cache = model.make_cache(max_batch_size=2, capacity=32)
    ids = torch.tensor([[3, 4, 5], [6, 7, 8]])
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])  # rows at different positions
    with torch.no_grad():
        default = model(ids, positions, cache, torch.arange(2)).logits
        explicit = model(ids, positions, cache, torch.arange(2), key_length=20).logits
    torch.testing.assert_close(explicit, default, atol=1e-6, rtol=0)
