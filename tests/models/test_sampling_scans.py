"""torch.ops.specswap.first_argmax and indices_at_least (csrc/quant/sampling_scans.cpp), the keyed draw's scans.

Against torch's max(-1).indices and nonzero(x >= threshold) on ties, -inf, NaN, zeros of both signs and lengths
around the 8-lane width, in the AVX2 and the scalar form; sample_keyed draws the same tokens with them as
without; errors that name the bad value.
"""

from __future__ import annotations

import random

import pytest
import torch

from specswap import _core, sampling
from specswap.sampling import KeyedNoise, position_key, sample_keyed

_C = _core._C
first_argmax = torch.ops.specswap.first_argmax
indices_at_least = torch.ops.specswap.indices_at_least


@pytest.fixture(params=[True, False], ids=["avx2", "scalar"])
def simd(request, simd_restored):
    _C.simd_math_set(request.param)
    return request.param


def _rows(seed: int):
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    for trial in range(400):
        n = rng.choice([1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000])
        x = torch.randn(n, generator=generator) * 3
        kind = trial % 6
        if kind == 1:
            x = torch.round(x)  # ties
        elif kind == 2:
            x[torch.rand(n, generator=generator) < 0.3] = float("-inf")
        elif kind == 3:
            x[rng.randrange(n)] = float("nan")
        elif kind == 4:
            x = torch.full((n,), float("-inf"))
        elif kind == 5:
            x = torch.where(torch.rand(n, generator=generator) < 0.5, torch.tensor(0.0), torch.tensor(-0.0))
        yield x, rng.uniform(-6.0, 6.0) + 1e-9  # a threshold fp32 cannot hold exactly


def test_first_argmax_is_torch_s_max_index(simd):
    for x, _ in _rows(0):
        assert first_argmax(x) == int(x.max(dim=-1).indices), x
    big = torch.randn(262_144, generator=torch.Generator().manual_seed(1))
    big[200_000] = big[7] = 9.0  # a tie: the first
    assert first_argmax(big) == 7


def test_indices_at_least_is_torch_s_nonzero(simd):
    for x, threshold in _rows(2):
        assert torch.equal(indices_at_least(x, threshold), torch.nonzero(x >= threshold).squeeze(-1)), (x, threshold)
    x = torch.tensor([1.0, 2.0, 3.0])
    assert indices_at_least(x, 2.0).tolist() == [1, 2] and indices_at_least(x, 4.0).tolist() == []
    assert indices_at_least(x, 2.0).dtype == torch.int64
    ramp = torch.arange(40.0)  # a threshold equal to entries inside the 8-lane body: they count
    assert indices_at_least(ramp, 5.0).tolist() == list(range(5, 40))


def test_sample_keyed_draws_the_same_tokens_with_the_scans(monkeypatch):
    keyed = KeyedNoise(4096)
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randn(4096, generator=generator) * scale for scale in (0.3, 3.0, 30.0) for _ in range(30)]
    assert sampling._row_scans(rows[0]) is not None  # the scans are what runs here
    with_scans = [sample_keyed(row, position_key(i, i), keyed) for i, row in enumerate(rows)]
    monkeypatch.setattr(sampling, "_ROW_SCANS", ())
    assert sampling._row_scans(rows[0]) is None
    assert with_scans == [sample_keyed(row, position_key(i, i), keyed) for i, row in enumerate(rows)]


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(4, dtype=torch.float64), "float32"),
    (torch.zeros(2, 4), "one row"),
    (torch.zeros(8)[::2], "contiguous"),
    (torch.zeros(0), "empty"),
])
def test_errors_name_the_bad_value(bad, message):
    with pytest.raises(RuntimeError, match=message):
        first_argmax(bad)
    with pytest.raises(RuntimeError, match=message):
        indices_at_least(bad, 0.0)
