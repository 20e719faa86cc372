"""Weights kept in their GGUF block formats and computed with ggml's CPU kernels (``torch.ops.specswap.ggml_*``).

A GGUF file's quantized tensors are used as they are: ``QuantizedLinear`` holds one weight as uint8 blocks
[out_features, row_bytes] and computes ``x @ W.T`` through ggml's dot products (activations quantized per row to
the type's dot-product type, as llama.cpp does), ``QuantizedEmbedding`` dequantizes the rows it looks up. Both are
batch-invariant: a row's output has the same bits whatever rows are beside it, so verifying k + 1 tokens at once
gives what decoding them one at a time gives.

ggml itself comes from the ``libggml-python`` package (a dependency on Linux x86-64), loaded on first use.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from .._core import _C
from ..capability import cpu_capability, native_kernels_problem

# ggml_type ids (ggml.h); the GGUF file stores the same numbers
GGML_TYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30,
}
# Q8_0, Q5_0, Q4_1, Q4_K and Q6_K interleaved by 8 rows (csrc/quant/x8_kernels.h): layouts of our own, not GGUF types,
# holding the same bytes. Weights of these types are repacked at load time where the CPU has AVX2, for multi-row kernels
# whose extra rows cost far less than a plain block kernel's: REPACKED maps a file type to its layout.
REPACKED: dict[str, str] = {"Q8_0": "Q8_0x8", "Q5_0": "Q5_0x8", "Q4_1": "Q4_1x8", "Q4_K": "Q4_Kx8", "Q6_K": "Q6_Kx8"}
LAYOUT_TYPES: dict[str, int] = {"Q8_0x8": 1008, "Q5_0x8": 1006, "Q4_1x8": 1003, "Q4_Kx8": 1012, "Q6_Kx8": 1014}
FILE_TYPE_OF_LAYOUT: dict[str, str] = {layout: file_type for file_type, layout in REPACKED.items()}
GGML_TYPE_NAMES = {number: name for name, number in (GGML_TYPES | LAYOUT_TYPES).items()}


def load_ggml() -> None:
    """Load ggml's CPU library once; errors say what is missing and how to get it."""
    if getattr(_C, "with_ggml", False) and _C.ggml_loaded():
        return  # every block linear of a model asks: the loaded case costs one call
    problem = native_kernels_problem()
    if problem is not None:
        raise RuntimeError(f"quantized (GGUF) weights cannot run natively: {problem}; or load the model with "
                           "weights='bf16' or 'fp32'")
    _C.ggml_load(str(Path(importlib.util.find_spec("libggml").origin).parent / "lib64"))
    # the multi-row kernels are AVX2 code, their Q8_0-family integer dot AVX-512 VNNI where it exists (the C++
    # also checks cpuid): they run only where the capability says so, so SPECSWAP_CPU_CAPS=-avx512 runs the AVX2
    # kernels and -avx2 sends every row through ggml's vec_dot, as such CPUs would
    capability = cpu_capability()
    _C.ggml_set_fast_kernels(capability.avx2)
    _C.ggml_set_vnni(capability.avx512_vnni)


def ggml_type(name_or_id: str | int) -> int:
    """A ggml type id from its name ('Q8_0', or a layout: 'Q8_0x8') or id; anything else is an error listing the
    supported types."""
    if isinstance(name_or_id, str) and name_or_id in LAYOUT_TYPES:
        return LAYOUT_TYPES[name_or_id]
    if isinstance(name_or_id, str) and name_or_id.upper() in GGML_TYPES:
        return GGML_TYPES[name_or_id.upper()]
    if isinstance(name_or_id, int) and name_or_id in GGML_TYPE_NAMES:
        return name_or_id
    raise ValueError(f"ggml type {name_or_id!r} is not supported; supported: {', '.join(GGML_TYPES)}")


def quantize(weight: torch.Tensor, kind: str | int) -> torch.Tensor:
    """weight [N, K] float -> [N, row_bytes] uint8 blocks of ggml type ``kind`` (ggml's own quantizer)."""
    load_ggml()
    return torch.ops.specswap.ggml_quantize(weight.detach().cpu(), ggml_type(kind))


def dequantize(blocks: torch.Tensor, kind: str | int, in_features: int) -> torch.Tensor:
    """[N, row_bytes] uint8 blocks -> [N, in_features] fp32."""
    load_ggml()
    return torch.ops.specswap.ggml_dequantize(blocks, ggml_type(kind), in_features)


def row_bytes(kind: str | int, in_features: int) -> int:
    load_ggml()
    return int(_C.ggml_row_bytes(ggml_type(kind), in_features))


def repack_default() -> bool:
    """Whether Q8_0 / Q5_0 / Q4_1 / Q4_K / Q6_K weights are repacked (``REPACKED``) by default: where the CPU capability has AVX2 (its kernels
    are AVX2 and AVX-512 VNNI code; without AVX2 ggml's one-row vec_dot is faster than their scalar form)."""
    return cpu_capability().avx2


class QuantizedLinear(nn.Module):
    """A linear over ggml blocks: x [..., in_features] (fp32 or bf16) -> [..., out_features], same dtype.

    ``blocks`` are in the file's type ``kind``; weights of a ``REPACKED`` type with a multiple of 8 rows are repacked to
    their interleaved layout (``REPACKED``) when ``repack`` is true (default: ``repack_default()``).
    ``block_type`` names the file's type, ``weight_type`` is the id of the one the weight is held in."""

    def __init__(self, blocks: torch.Tensor, kind: str | int, in_features: int, bias: torch.Tensor | None = None,
                 repack: bool | None = None):
        super().__init__()
        load_ggml()
        self.weight_type = ggml_type(kind)
        name = GGML_TYPE_NAMES[self.weight_type]
        self.block_type = FILE_TYPE_OF_LAYOUT.get(name, name)
        self.in_features, self.out_features = int(in_features), int(blocks.shape[0])
        expected = row_bytes(self.weight_type, self.in_features)
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != expected:
            raise ValueError(f"{GGML_TYPE_NAMES[self.weight_type]} weight for in_features={in_features} must be uint8 "
                             f"[N, {expected}], got {blocks.dtype} {tuple(blocks.shape)}")
        blocks = blocks.contiguous()
        if (repack_default() if repack is None else repack) and name in REPACKED \
                and self.out_features % 8 == 0:
            blocks = torch.ops.specswap.ggml_repack(blocks, self.weight_type, self.in_features)
            self.weight_type = LAYOUT_TYPES[REPACKED[self.block_type]]
        self.register_buffer("weight", blocks)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @property
    def repacked(self) -> bool:
        """Whether the weight is held in an interleaved layout (``LAYOUT_TYPES``)."""
        return GGML_TYPE_NAMES[self.weight_type] in FILE_TYPE_OF_LAYOUT

    def plain_blocks(self) -> tuple[torch.Tensor, str]:
        """The weight as rows of GGUF blocks and their type name (a repacked weight gives its file's blocks)."""
        if self.repacked:
            return torch.ops.specswap.ggml_unrepack(self.weight, self.weight_type, self.in_features), self.block_type
        return self.weight, self.block_type

    def rows(self, index: torch.Tensor) -> "QuantizedLinear":
        """A linear over the weight rows ``index`` (say a draft vocabulary's rows of an LM head), repacked alike."""
        blocks, kind = self.plain_blocks()
        return QuantizedLinear(blocks[index], kind, self.in_features, repack=self.repacked)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kind: str | int) -> "QuantizedLinear":
        """``linear``'s weight quantized by ggml to ``kind``; its bias (if any) kept in its dtype."""
        return cls(quantize(linear.weight.float(), kind), kind, linear.in_features, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.specswap.ggml_linear(x, self.weight, self.weight_type)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        held = f" as {GGML_TYPE_NAMES[self.weight_type]}" if self.repacked else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"type={self.block_type}{held}")


class QuantizedEmbedding(nn.Module):
    """Rows of a ggml-block table, dequantized on lookup to ``dtype`` (times ``scale`` rounded to it, when given)."""

    def __init__(self, table: QuantizedLinear, dtype: torch.dtype, scale: float | None = None):
        super().__init__()
        self.table = table  # shared with a tied LM head: one copy of the blocks
        self.dtype = dtype
        self.scale = scale
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    @property
    def weight(self) -> torch.Tensor:  # the blocks (uint8), so weight tying keeps one copy
        return self.table.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.ops.specswap.ggml_embedding(self.table.weight, self.table.weight_type, self.embedding_dim,
                                                 ids, self.dtype)
        if self.scale is None:
            return rows
        return rows * torch.tensor(self.scale, dtype=torch.float32).to(self.dtype)


__all__ = ["FILE_TYPE_OF_LAYOUT", "GGML_TYPES", "LAYOUT_TYPES", "REPACKED", "repack_default", "QuantizedEmbedding", "QuantizedLinear", "dequantize", "ggml_type",
           "load_ggml", "quantize", "row_bytes"]
