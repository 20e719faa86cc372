"""torch.ops.specswap.first_argmax, indices_at_least and accept_chain (csrc/cpu_ops/sampling_scans.cpp).

The keyed draw's scans against torch's max(-1).indices and nonzero(x >= threshold) on ties, -inf, NaN, zeros of
both signs and lengths around the 8-lane width, in the AVX2 and the scalar form; sample_keyed draws the same
tokens with them as without. The chain's acceptance against accept_from_logits_torch (the same decisions and
draws) in both forms, which give the same results; errors that name the bad value.
"""

from __future__ import annotations

import random

import pytest
import torch

from specswap import _core, sampling
from specswap.sampling import KeyedNoise, accept_from_logits, accept_from_logits_torch, position_key, sample_keyed

_C = _core._C
first_argmax = torch.ops.specswap.first_argmax
indices_at_least = torch.ops.specswap.indices_at_least
accept_chain = torch.ops.specswap.accept_chain
argmax_rows = torch.ops.specswap.argmax_rows


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


def test_argmax_rows_is_torch_s_max_index_per_row(simd):
    for x, _ in _rows(4):
        for shape in ((1, -1), (3, 1, -1)):
            rows = x.expand(*shape[:-1], x.numel()).contiguous() if len(shape) == 2 else torch.stack([x, -x, x.flip(0)]).unsqueeze(1)
            assert torch.equal(argmax_rows(rows), rows.max(dim=-1).indices), rows
    verify = torch.randn(2, 3, 262_144, generator=torch.Generator().manual_seed(5))
    verify[1, 2, 9] = verify[1, 2, 100_000] = 50.0  # a tie: the first
    assert torch.equal(argmax_rows(verify), verify.max(dim=-1).indices) and int(argmax_rows(verify)[1, 2]) == 9
    assert argmax_rows(torch.tensor([1.0, 3.0, 2.0])).shape == () and int(argmax_rows(torch.tensor([1.0, 3.0, 2.0]))) == 1


def test_sampling_argmax_runs_argmax_rows_on_contiguous_fp32_cpu_rows(monkeypatch):
    calls = []
    monkeypatch.setitem(sampling._EXTENSION_OPS, "argmax_rows", lambda x: calls.append(x.shape) or argmax_rows(x))
    x = torch.randn(2, 3, 50)
    assert torch.equal(sampling.argmax(x), x.max(dim=-1).indices) and calls == [x.shape]
    for other in (x.double(), x.transpose(0, 1), x.bfloat16()):
        assert torch.equal(sampling.argmax(other), other.max(dim=-1).indices)
    assert calls == [x.shape]


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
    monkeypatch.setitem(sampling._EXTENSION_OPS, "first_argmax", None)
    assert sampling._row_scans(rows[0]) is None
    assert with_scans == [sample_keyed(row, position_key(i, i), keyed) for i, row in enumerate(rows)]


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(4, dtype=torch.float64), "float32"),
    (torch.zeros(2, 4), "one row"),
    (torch.zeros(8)[::2], "contiguous"),
    (torch.zeros(0), "empty"),
])
def test_errors_name_the_bad_value(bad, message):
    if message != "one row":  # argmax_rows takes rows of any leading shape
        with pytest.raises(RuntimeError, match="non-empty last dimension" if message == "empty" else message):
            argmax_rows(bad)
    with pytest.raises(RuntimeError, match=message):
        first_argmax(bad)
    with pytest.raises(RuntimeError, match=message):
        indices_at_least(bad, 0.0)


def _chains(seed: int, steps: int, vocab: int, batch: int = 32):
    """A round's acceptance inputs: greedy and sampled rows, drafts that are often the target's favourite, laws
    with zeros (a reduced draft vocabulary) and target entries at -inf."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, steps + 1, vocab, generator=generator) * 3
    logits[torch.rand(batch, steps + 1, vocab, generator=generator) < 0.05] = float("-inf")
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.5] * (batch // 4))
    favourite = logits[:, :steps].argmax(-1)
    drafts = torch.randint(0, vocab, (batch, steps), generator=generator)
    drafts = torch.where(torch.rand(batch, steps, generator=generator) < 0.7, favourite, drafts)
    draft_logits = torch.randn(batch, steps, vocab, generator=generator)
    draft_logits[:, :, vocab // 2:] = float("-inf")  # outside the draft vocabulary
    draft_probs = draft_logits.softmax(-1)
    drafts = torch.where(drafts < vocab // 2, drafts, favourite % (vocab // 2))  # drafted where q > 0
    return (logits, temperature, drafts, draft_probs, torch.rand(batch, steps, generator=generator),
            torch.rand(batch, generator=generator))


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_accept_chain_takes_the_torch_path_s_decisions_and_draws(simd, steps):
    accepted = 0
    for seed, vocab in enumerate([2, 9, 255, 256, 257, 1000, 4099]):
        inputs = _chains(seed + 10 * steps, steps, vocab)
        lengths, tokens = accept_chain(*inputs)
        expected = accept_from_logits_torch(*inputs)
        assert torch.equal(lengths, expected[0]) and torch.equal(tokens, expected[1]), (vocab, lengths, expected)
        assert bool((inputs[0][torch.arange(32), lengths, tokens] > float("-inf")).all())  # never a -inf entry
        accepted += int(lengths.sum())
    assert accepted > 0 or steps == 0


def test_accept_chain_forms_agree_on_gemma_s_vocabulary(simd_restored):
    inputs = _chains(7, 3, 262_144, batch=4)
    _C.simd_math_set(True)
    avx2 = accept_chain(*inputs)
    _C.simd_math_set(False)
    scalar = accept_chain(*inputs)
    assert torch.equal(avx2[0], scalar[0]) and torch.equal(avx2[1], scalar[1])


def test_accept_chain_draws_from_p_where_the_residual_has_no_mass():
    # q == p at the stop: max(0, p - q) is 0 everywhere, so the token is drawn from p itself. (A draft of
    # positive p is then always accepted; one of p = q = 0 is rejected.)
    logits = torch.tensor([[[0.0, float("-inf"), 2.0], [0.0, 0.0, 0.0]]])
    p = logits[0, 0].softmax(-1)
    draft_probs = p.view(1, 1, 3).clone()
    uniforms = torch.tensor([[0.5]])
    for u, token in ((0.0, 0), (0.5, 2), (0.99, 2)):
        lengths, tokens = accept_chain(logits, torch.ones(1), torch.tensor([[1]]), draft_probs, uniforms,
                                       torch.tensor([u]))
        expected = accept_from_logits_torch(logits, torch.ones(1), torch.tensor([[1]]), draft_probs, uniforms,
                                            torch.tensor([u]))
        assert lengths.tolist() == [0] and tokens.tolist() == [token] == expected[1].tolist()


def test_accept_from_logits_runs_accept_chain_on_the_cpu(monkeypatch):
    inputs = _chains(3, 2, 300)
    calls = []
    monkeypatch.setitem(sampling._EXTENSION_OPS, "accept_chain", lambda *args: calls.append(args) or accept_chain(*args))
    result = accept_from_logits(*inputs)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(result, accept_from_logits_torch(*inputs)))
    accept_from_logits(inputs[0].double(), *inputs[1:])  # not fp32: torch's operators
    assert len(calls) == 1


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "logits": a["logits"].double()}, "logits must be Double|logits must be Float"),
    (lambda a: {**a, "logits": a["logits"][0]}, "logits must have 3 dimensions"),
    (lambda a: {**a, "temperature": a["temperature"][:1]}, "temperature and residual_uniforms must be"),
    (lambda a: {**a, "draft_tokens": a["draft_tokens"][:, :1].contiguous()}, "draft_tokens and uniforms must be"),
    (lambda a: {**a, "draft_probs": a["draft_probs"][:, :, :5]}, "draft_probs must be"),
    (lambda a: {**a, "draft_tokens": a["draft_tokens"] + 1000}, "outside the vocabulary"),
    (lambda a: {**a, "uniforms": a["uniforms"].t().contiguous().t()}, "contiguous"),
])
def test_accept_chain_errors_name_the_bad_value(change, message):
    names = ("logits", "temperature", "draft_tokens", "draft_probs", "uniforms", "residual_uniforms")
    args = change(dict(zip(names, _chains(0, 2, 50, batch=4))))
    with pytest.raises(RuntimeError, match=message):
        accept_chain(*(args[name] for name in names))
