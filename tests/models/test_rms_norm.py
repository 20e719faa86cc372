"""torch.ops.specswap.rms_norm: the RMSNorm module's formula in one operator, used for CPU inference."""
import pytest
import torch

from specswap.models.layers import RMSNorm


def reference(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The module's Python formula (what runs with gradients)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    if norm.weight_offset == 0.0:
        return norm.weight * x32.to(x.dtype)
    return (x32 * (norm.weight_offset + norm.weight.float())).to(x.dtype)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [640, 35])  # a tail past the 8 lanes
def test_fused_norm_matches_the_formula(offset, dtype, hidden):
    generator = torch.Generator().manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-6, offset).to(dtype)
    norm.weight.data.copy_(torch.randn(hidden, generator=generator))
    x = (torch.randn(3, 5, hidden, generator=generator) * 4).to(dtype)
    with torch.inference_mode():
        assert norm._fused(x)
        fused = norm(x)
    expected = reference(norm, x).detach()
    assert fused.dtype == expected.dtype == dtype and fused.shape == x.shape
    # the reduction order differs from torch's mean: a few fp32 ulps, which bf16 rounding almost always absorbs
    tolerance = 4e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(fused.float(), expected.float(), rtol=tolerance, atol=tolerance)


def test_fused_norm_is_batch_invariant():
    norm = RMSNorm(640, 1e-6, 1.0)
    norm.weight.data.normal_()
    x = torch.randn(9, 640)
    with torch.inference_mode():
        together = norm(x)
        for row in range(9):
            assert torch.equal(norm(x[row:row + 1]), together[row:row + 1])


def test_training_keeps_the_differentiable_formula():
    norm = RMSNorm(64, 1e-6, 1.0)
    x = torch.randn(2, 64, requires_grad=True)
    assert not norm._fused(x)
    norm(x).sum().backward()
    assert x.grad is not None and norm.weight.grad is not None


def test_a_wider_weight_keeps_torchs_promotion():
    norm = RMSNorm(64)  # fp32 weight, offset 0: weight * bf16 is fp32 in torch
    x = torch.randn(2, 64).to(torch.bfloat16)
    with torch.inference_mode():
        assert not norm._fused(x)
        assert norm(x).dtype == torch.float32


def test_bad_shapes_are_named():
    with pytest.raises(RuntimeError, match="does not fit"):
        torch.ops.specswap.rms_norm(torch.randn(2, 64), torch.ones(32), 1e-6, 0.0)
