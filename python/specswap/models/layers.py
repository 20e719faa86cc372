"""Building blocks shared by every architecture: RMSNorm, rotary embedding,
attention over a ``KVCache``, gated MLP and the pre-norm decoder layer.

Each piece is parameterised where architectures differ (norm weight offset,
activation, attention scale, sliding window) so a second model family reuses
them instead of copying them. Parameter names follow Hugging Face so
checkpoints load by name.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .model_config import LlamaConfig, RopeConfig
from .kv_cache import KVCache

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
# torch.ops.specswap.gated_activation's name for each (fp32 inference on the CPU)
FUSED_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), computed in fp32 like the reference models."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, weight_offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) if weight_offset == 0.0 else torch.zeros(hidden_size))
        self.eps = eps
        self.weight_offset = weight_offset  # Gemma stores (weight - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., H]
        input_dtype = x.dtype
        if self._fused(x):  # one operator, same formula; inference on the CPU only (it has no gradient)
            return torch.ops.specswap.rms_norm(x, self.weight, self.eps, self.weight_offset)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_offset == 0.0:
            return self.weight * x32.to(input_dtype)
        return (x32 * (self.weight_offset + self.weight.float())).to(input_dtype)


    def _fused(self, x: torch.Tensor) -> bool:
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or not _fused_ops_available():
            return False
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return False
        # offset 0 multiplies in x's dtype: only when the weight has it (a wider weight would promote the output)
        return self.weight.dtype == x.dtype or (self.weight_offset != 0.0 and self.weight.dtype == torch.float32)


@functools.cache
def _fused_ops_available() -> bool:
    """Whether specswap._C (loaded here on first use) registered torch.ops.specswap's rms_norm and
    gated_activation."""
    try:
        from .. import _core  # noqa: F401, PLC0415
    except ImportError:
        return False
    return hasattr(torch.ops.specswap, "rms_norm") and hasattr(torch.ops.specswap, "gated_activation")


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """inv_freq: [head_dim / 2] in fp32, with llama3 frequency scaling when configured."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "default":
        return inv_freq
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for absolute positions, computed once per forward and shared by all layers."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inverse_frequencies(rope, head_dim), persistent=False)

    def reset(self, device: torch.device | str) -> None:
        """Recompute inv_freq (after weights were loaded onto a meta-initialised model)."""
        self.inv_freq = rope_inverse_frequencies(self.rope, self.head_dim).to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, 1, T, head_dim] (broadcast over heads)
        freqs = positions.float()[..., None] * self.inv_freq  # [B, T, head_dim/2]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, T, head_dim]; cos, sin: [B, 1, T, head_dim]
    return x * cos + rotate_half(x) * sin


@dataclass
class AttentionPlan:
    """What every layer of one forward shares: the key range to read, the mask and where new keys are stored."""

    key_length: int                # keys at positions [0, key_length) are read
    mask: torch.Tensor             # [B, 1, T, key_length] bool, True = may attend
    write_positions: torch.Tensor  # [B, T] cache positions the T new keys/values are stored at


class TreeRegion(NamedTuple):
    """A forward's tokens as the last T nodes of a draft tree stored from cache position ``base``: node r of the
    region sits at base + r. ``mask`` [B, T, R] (R >= T): True where new token t may see region node r (its
    ancestors and itself). A drafter's tree steps pass one (each depth's frontier sees the nodes drafted before
    it); a plain ``tree_mask`` [T, T] is the region of the T tokens themselves, based at the first one's position.
    Any (mask, base) pair is taken as one (the worker, which imports no model module, passes tuples)."""

    mask: torch.Tensor   # [B, T, R] bool
    base: torch.Tensor   # [B, 1] int64


def _region(positions: torch.Tensor, tree_mask: torch.Tensor | TreeRegion) -> TreeRegion:
    if isinstance(tree_mask, tuple):  # a TreeRegion, or the (mask, base) pair a drafter builds
        return TreeRegion(*tree_mask)
    return TreeRegion(tree_mask, positions[:, :1])


def keys_needed(positions: torch.Tensor, tree_mask: torch.Tensor | TreeRegion | None) -> int:
    """The key length a forward at ``positions`` reads: past its last position, or its last tree node's (a host
    sync; callers that know it pass ``key_length`` instead)."""
    if tree_mask is None:
        return int(positions.max().item()) + 1
    region = _region(positions, tree_mask)
    return int(region.base.max().item()) + region.mask.shape[-1]


def plan_attention(positions: torch.Tensor, cache: KVCache, key_length: int | None = None,
                   sliding_window: int | None = None, tree_mask: torch.Tensor | None = None) -> AttentionPlan:
    """Build the mask from absolute positions: a query sees keys of its slot at positions <= its own.

    ``key_length`` (max position + 1 or more) may be passed by a caller that already knows it, which avoids a
    device-to-host sync; otherwise it is read from ``positions``.

    ``tree_mask`` ([T, T] or [B, T, T] bool, True where query node i may see node j; None = a chain): the T new
    tokens are the nodes of a draft tree whose root is the first. Node i is then stored at cache position
    positions[:, 0] + i (not at its own position, which is its depth past the root's and is shared by
    siblings); it sees every key before the root's position (by the sliding window of its own position) and
    the nodes the mask names. ``key_length`` must exceed positions[:, 0] + T - 1. A ``TreeRegion`` stores
    the T tokens as the last nodes of a larger region (a drafter's tree steps).
    """
    # positions: [B, T]
    if key_length is None:
        key_length = keys_needed(positions, tree_mask)
    if key_length > cache.capacity:
        raise ValueError(f"position {key_length - 1} does not fit the KV cache (capacity {cache.capacity}); "
                         f"valid positions are 0..{cache.capacity - 1}")
    key_positions = cache.key_positions[:key_length]              # [L]
    query_positions = positions[:, None, :, None]                 # [B, 1, T, 1]
    if tree_mask is None:
        mask = key_positions <= query_positions                   # [B, 1, T, L]
        write_positions = positions
    else:
        length = positions.shape[1]
        region = _region(positions, tree_mask)
        nodes = region.mask.shape[-1]
        if region.mask.shape[-2] != length or nodes < length:
            raise ValueError(f"tree_mask has shape {tuple(region.mask.shape)}; it must be [T, T] or [B, T, T] "
                             f"(a TreeRegion: [B, T, R], R >= T) for T={length} tokens")
        root = region.base                                        # [B, 1]
        write_positions = root + (nodes - length) + torch.arange(length, device=positions.device)  # [B, T]
        node = key_positions - root                               # [B, L]: key's node index, if in the tree
        in_tree = (node >= 0) & (node < nodes)
        tree = region.mask.expand(positions.shape[0], length, nodes)                  # [B, T, R]
        sees_node = tree.gather(2, node.clamp(0, nodes - 1)[:, None, :].expand(-1, length, -1))  # [B, T, L]
        mask = ((node < 0)[:, None, None, :] | (in_tree[:, None, :] & sees_node)[:, None])       # [B, 1, T, L]
    if sliding_window is not None:
        mask = mask & (key_positions > query_positions - sliding_window)
    return AttentionPlan(key_length=key_length, mask=mask, write_positions=write_positions)


def write_kv(key_buffer: torch.Tensor, value_buffer: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
             keys: torch.Tensor, values: torch.Tensor) -> None:
    """Store new keys/values at (slot, position) in place."""
    # key_buffer: [max_batch, kv_heads, capacity, head_dim]; keys: [B, kv_heads, T, head_dim]
    # slots[:, None] and positions broadcast to [B, T]; the indexed view is [B, T, kv_heads, head_dim]
    # the cache may hold a different dtype than the compute (make_cache(dtype=...), autocast); .to is a no-op if equal
    key_buffer[slots[:, None], :, positions] = keys.transpose(1, 2).to(key_buffer.dtype)
    value_buffer[slots[:, None], :, positions] = values.transpose(1, 2).to(value_buffer.dtype)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads, reading and writing a per-layer KV buffer."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = False,
                 scale: float | None = None, qk_norm_eps: float | None = None, qk_norm_offset: float = 0.0,
                 qkv_bias: bool | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale if scale is not None else head_dim ** -0.5
        # qkv_bias (None = bias): Qwen 2 has biases on q/k/v but not on o_proj
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        # Gemma 3, Qwen 3: RMSNorm over each head's queries and keys before rotary (None = no such norm)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps, qk_norm_offset) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps, qk_norm_offset) if qk_norm_eps is not None else None
        # fp32 cached attention through torch.ops.specswap.invariant_attention: a query's output has the same bits
        # whatever queries and padded keys are beside it (set for models with block-quantized weights, whose
        # per-block activation rounding would turn SDPA's last-bit differences into different tokens)
        self.batch_invariant = False

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_buffer: torch.Tensor | None,
                value_buffer: torch.Tensor | None, slots: torch.Tensor | None, positions: torch.Tensor,
                plan: AttentionPlan | None) -> torch.Tensor:
        # hidden: [B, T, H]
        batch, length, _ = hidden.shape
        q = self.q_proj(hidden).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        # q: [B, heads, T, D]; k, v: [B, kv_heads, T, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        gqa = self.num_heads != self.num_kv_heads
        if plan is None:
            # cacheless (training): causal attention within these T tokens only
            out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True, scale=self.scale,
                                                 enable_gqa=gqa)
        else:
            write_kv(key_buffer, value_buffer, slots, plan.write_positions, k, v)
            invariant = self.batch_invariant and q.dtype == torch.float32
            if invariant and key_buffer.dtype == torch.float32:
                # the first L positions of each row's slot, read in place
                out = torch.ops.specswap.invariant_attention(q, key_buffer, value_buffer, slots, plan.mask,
                                                             self.scale)
            else:
                # past + new keys of each request's slot: [B, kv_heads, L, D]
                keys = key_buffer[slots, :, :plan.key_length].to(q.dtype)
                values = value_buffer[slots, :, :plan.key_length].to(q.dtype)
                if invariant:  # a cache of another dtype: its rows converted, as rows 0..B-1
                    rows = torch.arange(batch, device=q.device)
                    out = torch.ops.specswap.invariant_attention(q, keys, values, rows, plan.mask, self.scale)
                else:
                    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=plan.mask, scale=self.scale,
                                                         enable_gqa=gqa)
        # out: [B, heads, T, D] -> [B, T, heads * D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not supported; valid: {sorted(ACTIVATIONS)}")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.activation = activation  # its gated_activation name: FUSED_ACTIVATIONS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        fused = FUSED_ACTIVATIONS.get(self.activation)
        if fused is not None and gate.dtype == torch.float32 and gate.device.type == "cpu" and \
                not (torch.is_grad_enabled() and gate.requires_grad) and _fused_ops_available():
            # one operator, the same formula (its exp's scalar and AVX2 forms give the same bits)
            return self.down_proj(torch.ops.specswap.gated_activation(gate, up, fused))
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm Llama block: x + attn(norm(x)), then x + mlp(norm(x)); Qwen 2 / Qwen 3 / Mistral differ only in
    what their config sets (q/k/v biases, q/k norms; Mistral's window is the model's attention plan)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim, bias=config.attention_bias, qkv_bias=config.qkv_bias,
                                   qk_norm_eps=config.rms_norm_eps if config.qk_norm else None)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, "silu", bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_buffer: torch.Tensor | None,
                value_buffer: torch.Tensor | None, slots: torch.Tensor | None, positions: torch.Tensor,
                plan: AttentionPlan | None) -> torch.Tensor:
        # hidden: [B, T, H]
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, key_buffer, value_buffer, slots,
                                         positions, plan)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))
