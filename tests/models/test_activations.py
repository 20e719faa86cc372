"""torch.ops.specswap.gated_activation and the exp under it (csrc/cpu_ops/simd_math.h).

Against torch's formulas; the AVX2 form against the scalar form bit for bit; wired into GatedMLP for fp32 CPU
inference only; errors that name the bad value.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specswap import _core
from specswap.models.layers import GatedMLP

_C = _core._C


def _values() -> torch.Tensor:
    # the exp's whole range and past it on both sides, zeros of both signs, and a length with a tail after 8 lanes
    spread = torch.linspace(-95.0, 95.0, 4001)
    return torch.cat((spread, torch.randn(997, generator=torch.Generator().manual_seed(0)) * 3,
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30])))


@pytest.mark.parametrize("activation, reference", [
    ("gelu_tanh", lambda g: F.gelu(g.double(), approximate="tanh")),
    ("silu", lambda g: F.silu(g.double())),
])
def test_matches_torch_and_both_forms_give_the_same_bits(activation, reference, simd_restored):
    gate = _values().reshape(1, -1)
    up = torch.randn_like(gate)
    outs = []
    for simd in (False, True):
        _C.simd_math_set(simd)
        outs.append(torch.ops.specswap.gated_activation(gate, up, activation))
    assert torch.equal(outs[0], outs[1])
    expected = reference(gate) * up.double()
    torch.testing.assert_close(outs[0].double(), expected, rtol=2e-6, atol=1e-6)


def test_gated_mlp_uses_it_for_fp32_inference_and_agrees_with_its_formula(monkeypatch):
    torch.manual_seed(1)
    mlp = GatedMLP(64, 128, "gelu_pytorch_tanh")
    x = torch.randn(2, 3, 64)
    with torch.inference_mode():
        fused = mlp(x)
        calls = []
        real = torch.ops.specswap.gated_activation
        monkeypatch.setattr(torch.ops.specswap, "gated_activation",
                            lambda *a: calls.append(a[2]) or real(*a), raising=False)
        mlp(x)
    assert calls == ["gelu_tanh"]
    plain = mlp.down_proj(F.gelu(mlp.gate_proj(x), approximate="tanh") * mlp.up_proj(x))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    # training keeps torch's operators (the fused one has no gradient)
    y = mlp(x.requires_grad_())
    y.sum().backward()
    assert mlp.gate_proj.weight.grad is not None


def test_errors_name_the_bad_value():
    gate = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="activation 'relu' is not supported; valid: gelu_tanh, silu"):
        torch.ops.specswap.gated_activation(gate, gate, "relu")
    with pytest.raises(RuntimeError, match="must be float32, got BFloat16, Float"):
        torch.ops.specswap.gated_activation(gate.bfloat16(), gate, "silu")
    with pytest.raises(RuntimeError, match=r"gate \[4, 8\] and up \[4, 7\] must have the same shape"):
        torch.ops.specswap.gated_activation(gate, gate[:, :7], "silu")
