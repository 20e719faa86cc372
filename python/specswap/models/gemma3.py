"""Gemma 3 text decoder (``model_type`` "gemma3_text") for the runtime, built from the shared layers.

What differs from Llama, and where it lives:
- embeddings scaled by sqrt(hidden_size), rounded to the compute dtype (``ScaledEmbedding``);
- RMSNorm weights stored as (w - 1) (``RMSNorm(weight_offset=1.0)``), four norms per block: before and
  after attention and before and after the MLP (``Gemma3DecoderLayer``);
- per-head RMSNorm of queries and keys before rotary (``Attention(qk_norm_eps=...)``);
- attention scale query_pre_attn_scalar ** -0.5 and a head_dim independent of hidden_size;
- interleaved sliding-window and global layers, each kind with its own rotary base and its own mask;
- optional final-logit soft-capping; tied embeddings.

The KV cache is the Llama one: every layer keeps a full-capacity row per slot, and a sliding layer's mask
hides keys older than the window, so rollback stays "forget a length" for both kinds of layer.
transformers' ``Gemma3ForCausalLM`` is the numerical reference (tests/gemma).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .model_config import CheckpointError, RopeConfig, eos_ids
from .kv_cache import KVCache
from .layers import (ACTIVATIONS, Attention, AttentionPlan, GatedMLP, RMSNorm, RotaryEmbedding, keys_needed,
                     plan_attention)
from .causal_lm import CausalLM, check_cache, check_cacheless
from .outputs import ModelOutput

SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPES = (SLIDING_ATTENTION, FULL_ATTENTION)
# transformers' Gemma3TextConfig defaults, used when a config.json leaves them out
DEFAULT_GLOBAL_ROPE_THETA = 1_000_000.0
DEFAULT_LOCAL_ROPE_THETA = 10_000.0
DEFAULT_SLIDING_WINDOW_PATTERN = 6


@dataclass(frozen=True)
class Gemma3Config:
    """The fields of a Hugging Face Gemma 3 text ``config.json`` that the runtime uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    rope_global: RopeConfig
    rope_local: RopeConfig
    query_pre_attn_scalar: float
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    bos_token_id: int | None = 2
    eos_token_id: tuple[int, ...] = (1,)
    pad_token_id: int | None = 0
    model_type: str = "gemma3_text"

    @property
    def embed_scale(self) -> float:
        return self.hidden_size ** 0.5

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config.json") -> "Gemma3Config":
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [name for name in required if name not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing required fields {missing}")
        if raw.get("attn_logit_softcapping") is not None:
            raise CheckpointError(f"{source}: attn_logit_softcapping={raw['attn_logit_softcapping']} is not supported "
                                  "(Gemma 3 sets it to null)")
        if raw.get("use_bidirectional_attention"):
            raise CheckpointError(f"{source}: use_bidirectional_attention=true is not supported (causal LM only)")
        activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if activation not in ACTIVATIONS:
            raise CheckpointError(f"{source}: hidden_activation {activation!r} is not supported; "
                                  f"valid: {sorted(ACTIVATIONS)}")
        num_layers = int(raw["num_hidden_layers"])
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads={num_heads} is not a multiple of "
                                  f"num_key_value_heads={num_kv_heads}")
        head_dim = int(raw.get("head_dim") or 256)
        layer_types = raw.get("layer_types")
        if layer_types is None:
            pattern = int(raw.get("sliding_window_pattern") or DEFAULT_SLIDING_WINDOW_PATTERN)
            layer_types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers)]
        layer_types = tuple(layer_types)
        bad = sorted(set(layer_types) - set(LAYER_TYPES))
        if len(layer_types) != num_layers or bad:
            raise CheckpointError(f"{source}: layer_types must list {num_layers} entries from {LAYER_TYPES}; "
                                  f"got {len(layer_types)} with unknown {bad}")
        rope_global, rope_local = _gemma_ropes(raw, source)
        softcap = raw.get("final_logit_softcapping")
        return Gemma3Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            layer_types=layer_types,
            sliding_window=int(raw.get("sliding_window") or 4096),
            rope_global=rope_global,
            rope_local=rope_local,
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            hidden_activation=activation,
            final_logit_softcapping=None if softcap is None else float(softcap),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            attention_bias=bool(raw.get("attention_bias", False)),
            bos_token_id=raw.get("bos_token_id", 2),
            eos_token_id=eos_ids(raw.get("eos_token_id", 1)),
            pad_token_id=raw.get("pad_token_id", 0),
            model_type=str(raw.get("model_type", "gemma3_text")),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers' Gemma3TextConfig accepts."""
        eos = list(self.eos_token_id)
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_activation": self.hidden_activation,
            "rms_norm_eps": self.rms_norm_eps,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "rope_parameters": {
                FULL_ATTENTION: {"rope_type": "default", "rope_theta": self.rope_global.theta},
                SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": self.rope_local.theta},
            },
            "query_pre_attn_scalar": (int(self.query_pre_attn_scalar) if self.query_pre_attn_scalar.is_integer()
                                      else self.query_pre_attn_scalar),  # transformers insists on an int
            "final_logit_softcapping": self.final_logit_softcapping,
            "attn_logit_softcapping": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
            "dtype": "float32",
        }


def _gemma_ropes(raw: dict[str, Any], source: str) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) rotary configs from transformers >= 5 ``rope_parameters`` per layer type, or from the older
    ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling`` fields."""
    params = raw.get("rope_parameters") or {}
    if FULL_ATTENTION in params or SLIDING_ATTENTION in params:
        full = dict(params.get(FULL_ATTENTION) or {})
        sliding = dict(params.get(SLIDING_ATTENTION) or {})
    else:
        full = dict(raw.get("rope_scaling") or {})
        full.setdefault("rope_theta", raw.get("rope_theta", DEFAULT_GLOBAL_ROPE_THETA))
        sliding = {"rope_theta": raw.get("rope_local_base_freq", DEFAULT_LOCAL_ROPE_THETA)}
    full.setdefault("rope_theta", DEFAULT_GLOBAL_ROPE_THETA)
    sliding.setdefault("rope_theta", DEFAULT_LOCAL_ROPE_THETA)
    ropes = []
    for kind, rope_params in ((FULL_ATTENTION, full), (SLIDING_ATTENTION, sliding)):
        rope = RopeConfig.from_hf({"rope_parameters": rope_params}, f"{source} ({kind})")
        if rope.rope_type != "default":  # llama3 scaling is not a Gemma scheme
            raise CheckpointError(f"{source} ({kind}): rope_type {rope.rope_type!r} is not supported for Gemma 3; "
                                  "valid: 'default'")
        ropes.append(rope)
    return ropes[0], ropes[1]


class ScaledEmbedding(nn.Embedding):
    """Embedding lookup times sqrt(hidden_size), the scale rounded to the weight dtype as in the reference."""

    def __init__(self, num_embeddings: int, embedding_dim: int, embed_scale: float):
        super().__init__(num_embeddings, embedding_dim)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # fp32 first, then the weight dtype: the same rounding as the reference's fp32 buffer cast at use; a
        # fill, not torch.tensor: copying a host value to a GPU synchronizes, which a CUDA graph capture refuses
        scale = torch.full((), self.embed_scale, dtype=torch.float32, device=self.weight.device).to(self.weight.dtype)
        return super().forward(input_ids) * scale


class Gemma3DecoderLayer(nn.Module):
    """x + post_attn_norm(attn(in_norm(x))), then x + post_ffw_norm(mlp(pre_ffw_norm(x)))."""

    def __init__(self, config: Gemma3Config, layer_type: str):
        super().__init__()
        self.is_sliding = layer_type == SLIDING_ATTENTION
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, weight_offset=1.0)
        self.self_attn = Attention(hidden, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                   bias=config.attention_bias, scale=config.query_pre_attn_scalar ** -0.5,
                                   qk_norm_eps=eps, qk_norm_offset=1.0)
        self.post_attention_layernorm = RMSNorm(hidden, eps, weight_offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, weight_offset=1.0)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_activation)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, weight_offset=1.0)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_buffer: torch.Tensor | None,
                value_buffer: torch.Tensor | None, slots: torch.Tensor | None, positions: torch.Tensor,
                plan: AttentionPlan | None) -> torch.Tensor:
        # hidden: [B, T, H]
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, key_buffer, value_buffer, slots, positions,
                                  plan)
        hidden = hidden + self.post_attention_layernorm(attended)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3TextModel(nn.Module):
    """Embedding, decoder layers and final norm (``model.*`` in Hugging Face checkpoints)."""

    def __init__(self, config: Gemma3Config):
        super().__init__()
        self.embed_tokens = ScaledEmbedding(config.vocab_size, config.hidden_size, config.embed_scale)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, kind) for kind in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_offset=1.0)


class Gemma3ForCausalLM(CausalLM):
    """Gemma 3 text model with the runtime's static KV cache; same call contract as ``LlamaForCausalLM``.

    ``embed_tokens`` returns scaled embeddings, so a draft head that shares it sees what the decoder sees.
    """

    def __init__(self, config: Gemma3Config):
        super().__init__()
        self.config = config
        self.model = Gemma3TextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary_global = RotaryEmbedding(config.rope_global, config.head_dim)
        self.rotary_local = RotaryEmbedding(config.rope_local, config.head_dim)
        self.tie_weights()

    def forward_hidden(self, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache | None,
                       slots: torch.Tensor | None, key_length: int | None = None,
                       logits_at: torch.Tensor | None = None, with_logits: bool = True,
                       tree_mask: torch.Tensor | None = None, aux_points: tuple[int, ...] | None = None) -> ModelOutput:
        """The decoder and LM head applied to (scaled) input embeddings ``hidden``: [B, T, H].

        ``cache=None`` is the training path: causal attention within the T tokens, nothing stored; it has no
        sliding mask, so T must not exceed the window.
        """
        rotary = {True: self.rotary_local(positions, hidden.dtype), False: self.rotary_global(positions, hidden.dtype)}
        captured = None if aux_points is None else []  # EAGLE-3 features (``CausalLM.forward``)
        if cache is None:
            check_cacheless(tree_mask)
            if hidden.shape[1] > self.config.sliding_window:
                raise ValueError(f"a cacheless forward of {hidden.shape[1]} tokens exceeds the sliding window "
                                 f"{self.config.sliding_window}; pass a KV cache for longer inputs")
            for index, layer in enumerate(self.model.layers):
                self.capture_aux(captured, aux_points, index, hidden)
                cos, sin = rotary[layer.is_sliding]
                hidden = layer(hidden, cos, sin, None, None, None, positions, None)
        else:
            check_cache(cache, self.config.num_hidden_layers, positions, slots)
            if key_length is None:  # one host sync shared by both masks
                key_length = keys_needed(positions, tree_mask)
            plans = {True: plan_attention(positions, cache, key_length, self.config.sliding_window, tree_mask),
                     False: plan_attention(positions, cache, key_length, tree_mask=tree_mask)}
            for index, (layer, key_buffer, value_buffer) in enumerate(zip(self.model.layers, cache.keys,
                                                                          cache.values)):
                self.capture_aux(captured, aux_points, index, hidden)
                cos, sin = rotary[layer.is_sliding]
                hidden = layer(hidden, cos, sin, key_buffer, value_buffer, slots, positions, plans[layer.is_sliding])
        self.capture_aux(captured, aux_points, len(self.model.layers), hidden)
        hidden = self.model.norm(hidden)
        self.capture_aux(captured, aux_points, len(self.model.layers) + 1, hidden)  # after the final norm
        return self.output(hidden, logits_at, with_logits, captured)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.config.final_logit_softcapping is not None:
            cap = self.config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


__all__ = ["Gemma3Config", "Gemma3DecoderLayer", "Gemma3ForCausalLM", "ScaledEmbedding"]
