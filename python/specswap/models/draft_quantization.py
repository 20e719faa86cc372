"""Weight-only int8 for draft models: per-output-channel symmetric int8 weights, activations in their own dtype.

A draft step at batch 1 is bound by reading its weights (the Gemma head reads ~34 MB per step in bf16), so
halving the bytes nearly halves the step. Drafts only propose: the target's verification keeps the output exact,
so a quantized draft can change how many tokens are accepted, never which tokens come out. Targets are never
quantized here.
"""

from __future__ import annotations

import torch
from torch import nn



def quantize_rows_int8(weight: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], scales [N] in ``scale_dtype``) with weight ~= int8 * scale per row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)  # [N]
    return (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales.to(scale_dtype)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] int8 * scales [N]).T -> [..., N] in x's dtype (one fused aten kernel)."""
    flat = x.reshape(-1, x.shape[-1])
    return torch._weight_int8pack_mm(flat, weight, scales).view(*x.shape[:-1], weight.shape[0])


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights and per-output-channel scales (weight-only quantization)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scales = quantize_rows_int8(linear.weight, linear.weight.dtype)
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = int8_linear(x, self.weight, self.scales)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only"


def quantize_linears_int8(module: nn.Module) -> int:
    """Replace every nn.Linear inside ``module`` by an Int8Linear in place; returns how many were replaced."""
    replaced = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
            replaced += 1
        else:
            replaced += quantize_linears_int8(child)
    return replaced
