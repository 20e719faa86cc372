"""EAGLE-3 draft heads in the layouts SGLang and vLLM load: ``LlamaForCausalLMEagle3`` as SpecForge saves it
(``midlayer.*``), and vLLM's speculators format (``speculators_model_type: "eagle3"``, ``layers.0.*``).

The head fuses three of the target's hidden states (a low, a middle and a high capture point, concatenated:
3H wide) with ``fc`` (3H -> H), then runs one decoder layer (``midlayer``) whose attention reads the normed token
embedding next to the normed hidden state (2H wide: ``input_layernorm`` on the embedding, ``hidden_norm`` on the
hidden state; with ``norm_before_residual`` the residual is the normed hidden state); ``norm`` and a
draft-vocabulary ``lm_head`` give its logits. Its embedding is the target's, as SGLang's (a shipped
``embed_tokens.weight`` is ignored, with one log line). ``d2t`` maps draft ids to target ids (target_id =
draft_id + d2t[draft_id]; absent: the draft vocabulary is the target's); ``t2d`` marks those target ids.

It presents the call of our EAGLE head (``models.eagle.EagleHead``): fed the target's fused features
(``fused_feature_size`` wide) it applies ``fc``; fed its own previous hidden state (H wide) it does not. The
hidden state it returns (and feeds itself) is the residual stream before ``norm``, as SGLang's.

Capture points p in 0..L + 1 (``CausalLM.check_aux_points``): the residual stream entering layer p; L is the
last layer's output before the final norm, L + 1 the final-normed state. ``eagle_aux_hidden_state_layer_ids``
name layer *outputs* in SpecForge's layout (p = id + 1, as SGLang captures them) and boundaries in the
speculators format (p = id, as vLLM captures them); without them, SGLang's and vLLM's default: the inputs of
layers [2, L // 2, L - 3]. The last layer's output is read after the final norm in SpecForge's layout (its
training reads Hugging Face's ``hidden_states[L]``, which is normed) and before it in the speculators format
(vLLM's boundary L); the config key ``specswap_last_layer_capture`` ("pre_norm" / "post_norm") overrides either,
and every head this runtime saves records it. ``AuxHiddenTarget`` is the target as an EAGLE-3 worker calls it
(the target object itself is never changed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .causal_lm import CausalLM, check_cache
from .kv_cache import KVCache
from .layers import Attention, GatedMLP, RMSNorm, RotaryEmbedding, plan_attention
from .model_config import CheckpointError, RopeConfig, read_config_json
from .outputs import ModelOutput
from .weights_io import WEIGHTS_FILE, assign_weights, checkpoint_dir, read_weights, weights_file

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
LAST_LAYER_CAPTURES = ("pre_norm", "post_norm")
LAST_LAYER_CAPTURE_KEY = "specswap_last_layer_capture"
# speculators eagle3 options this head does not implement: refused by name, never ignored
SPECULATORS_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")
logger = logging.getLogger(__name__)
_logged: set[str] = set()


def log_once(message: str) -> None:
    """One warning line per distinct message in this process."""
    if message not in _logged:
        _logged.add(message)
        logger.warning(message)


def default_capture_points(num_layers: int) -> tuple[int, ...]:
    """SGLang's (and vLLM's) default for a head without layer ids: the inputs of layers 2, L // 2 and L - 3."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """What an EAGLE-3 ``config.json`` holds that the head needs."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_vocab_size: int            # config "vocab_size": the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    aux_layer_ids: tuple[int, ...] | None = None  # eagle_aux_hidden_state_layer_ids (None: SGLang's default)
    hidden_act: str = "silu"
    fc_bias: bool = False             # config "bias"
    num_aux: int = 3
    model_type: str = "llama"
    # capture point of aux layer id i: i + aux_layer_offset (1: SpecForge's layer outputs; 0: speculators' boundaries)
    aux_layer_offset: int = 1
    # the last layer's output: "pre_norm" / "post_norm" (None: the layout's default, see the module docstring)
    last_layer_capture: str | None = None
    norm_before_residual: bool = False  # the layer's residual is hidden_norm(hidden) (speculators' option)

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config.json") -> "Eagle3Config":
        """SpecForge's layout, or the speculators format when ``speculators_model_type`` is present."""
        if "speculators_model_type" in raw:
            return Eagle3Config.from_speculators_dict(raw, source)
        architectures = raw.get("architectures") or []
        if not any(name in ARCHITECTURES for name in architectures):
            raise CheckpointError(f"{source}: architectures {architectures} name no EAGLE-3 head; expected one of "
                                  f"{list(ARCHITECTURES)} (or a speculators config with speculators_model_type "
                                  "'eagle3')")
        eagle = raw.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
        return Eagle3Config._parse(raw, ids, source, aux_layer_offset=1,
                                   norm_before_residual=bool(raw.get("norm_before_residual", False)))

    @staticmethod
    def from_speculators_dict(raw: dict[str, Any], source: str = "config.json") -> "Eagle3Config":
        """vLLM's speculators format: the decoder layer's fields in ``transformer_layer_config``, the EAGLE-3 ones
        (``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual``, aux layer ids) at the top."""
        kind = raw.get("speculators_model_type")
        if kind != "eagle3":
            raise CheckpointError(f"{source}: speculators_model_type {kind!r} is not an EAGLE-3 head; supported: "
                                  "'eagle3'")
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise CheckpointError(f"{source}: a speculators eagle3 config needs a 'transformer_layer_config' object")
        if layer.get("model_type", "llama") != "llama":
            raise CheckpointError(f"{source}: transformer_layer_config.model_type {layer.get('model_type')!r} is not "
                                  "supported; valid: 'llama'")
        unsupported = [name for name in SPECULATORS_UNSUPPORTED if raw.get(name)] + \
                      [f"transformer_layer_config.{name}" for name in ("attention_bias", "mlp_bias") if layer.get(name)]
        if unsupported:
            raise CheckpointError(f"{source}: {unsupported} set; this EAGLE-3 head does not implement them")
        merged = {**layer, "draft_vocab_size": raw.get("draft_vocab_size"),
                  "target_hidden_size": raw.get("target_hidden_size")}
        if LAST_LAYER_CAPTURE_KEY in raw:
            merged[LAST_LAYER_CAPTURE_KEY] = raw[LAST_LAYER_CAPTURE_KEY]
        # vLLM reads a speculators config without norm_before_residual as true
        return Eagle3Config._parse(merged, raw.get("eagle_aux_hidden_state_layer_ids"), source, aux_layer_offset=0,
                                   norm_before_residual=bool(raw.get("norm_before_residual", True)))

    @staticmethod
    def _parse(raw: dict[str, Any], ids, source: str, aux_layer_offset: int,
               norm_before_residual: bool) -> "Eagle3Config":
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [name for name in required if name not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing required EAGLE-3 fields {missing}")
        layers = int(raw.get("num_hidden_layers", 1))
        if layers != 1:
            raise CheckpointError(f"{source}: num_hidden_layers {layers}: only single-layer EAGLE-3 heads "
                                  "(one midlayer) are supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act {raw.get('hidden_act')!r} is not supported; valid: 'silu'")
        if ids is not None and (not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, int) for i in ids)):
            # one layer would make fc's input as wide as the head's own hidden state, which it tells apart by width
            raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids must list at least two layer indices; "
                                  f"got {ids!r}")
        last = raw.get(LAST_LAYER_CAPTURE_KEY)
        if last is not None and last not in LAST_LAYER_CAPTURES:
            raise CheckpointError(f"{source}: {LAST_LAYER_CAPTURE_KEY} {last!r}; valid: {list(LAST_LAYER_CAPTURES)}")
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        vocab = int(raw["vocab_size"])
        return Eagle3Config(
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            target_vocab_size=vocab,
            draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(raw, source),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            aux_layer_ids=None if ids is None else tuple(ids),
            fc_bias=bool(raw.get("bias", False)),
            num_aux=3 if ids is None else len(ids),
            aux_layer_offset=aux_layer_offset,
            last_layer_capture=last,
            norm_before_residual=norm_before_residual,
        )

    def to_dict(self) -> dict[str, Any]:
        """config.json in SpecForge's layout (layer ids as layer outputs), with the last layer's capture point."""
        raw: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": self.model_type,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps, "vocab_size": self.target_vocab_size,
            "draft_vocab_size": self.draft_vocab_size, "target_hidden_size": self.target_hidden_size,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": False,
            "bias": self.fc_bias, "rope_theta": self.rope.theta, "norm_before_residual": self.norm_before_residual,
            LAST_LAYER_CAPTURE_KEY: self.resolved_last_layer_capture,
        }
        if self.rope.rope_type != "default":
            raw["rope_scaling"] = {"rope_type": self.rope.rope_type, "factor": self.rope.factor,
                                   "low_freq_factor": self.rope.low_freq_factor,
                                   "high_freq_factor": self.rope.high_freq_factor,
                                   "original_max_position_embeddings": self.rope.original_max_position_embeddings}
        if self.aux_layer_ids is not None:
            outputs = [i + self.aux_layer_offset - 1 for i in self.aux_layer_ids]
            if min(outputs) < 0:
                raise ValueError(f"aux layer ids {list(self.aux_layer_ids)} capture the embedding, which SpecForge's "
                                 "layout (layer outputs) cannot name")
            raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": outputs, "use_aux_hidden_state": True}
        return raw

    @property
    def resolved_last_layer_capture(self) -> str:
        """The last layer's capture: the config's, else the layout's default (see the module docstring)."""
        return self.last_layer_capture or ("post_norm" if self.aux_layer_offset == 1 else "pre_norm")

    def capture_points(self, num_layers: int, source: str = "config.json") -> tuple[int, ...]:
        """The target's capture points (``CausalLM.check_aux_points``: 0..L + 1), in layer order."""
        if self.aux_layer_ids is None:
            points = default_capture_points(num_layers)
            if not all(0 <= p <= num_layers for p in points):
                raise CheckpointError(f"{source}: the default auxiliary layers {list(points)} do not fit a target "
                                      f"of {num_layers} layers; give eagle_config.eagle_aux_hidden_state_layer_ids")
        else:
            points = tuple(i + self.aux_layer_offset for i in self.aux_layer_ids)
            bad = [i for i, p in zip(self.aux_layer_ids, points) if not 0 <= p <= num_layers]
            if bad:
                raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids {list(self.aux_layer_ids)} name "
                                      f"layers {bad} outside the target's 0..{num_layers - self.aux_layer_offset}")
        if num_layers in points and self.resolved_last_layer_capture == "post_norm":
            if self.last_layer_capture is None:
                log_once(f"{source}: the auxiliary layers include the last layer's output, read after the target's "
                         f"final norm as SpecForge's training reads it (hidden_states[L]); a head trained on it "
                         f"before the norm says {LAST_LAYER_CAPTURE_KEY}: \"pre_norm\"")
            points = tuple(num_layers + 1 if p == num_layers else p for p in points)
        return tuple(sorted(points))


class Eagle3DecoderLayer(nn.Module):
    """The head's ``midlayer``: attention over [input_layernorm(embed), hidden_norm(hidden)] (2H wide), then the
    Llama MLP; residuals on the hidden state."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        # q/k/v read the 2H-wide concatenation; o_proj writes H
        for name, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads),
                            ("v_proj", config.num_key_value_heads)):
            setattr(self.self_attn, name, nn.Linear(2 * hidden, heads * config.head_dim, bias=False))
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_act)
        self.norm_before_residual = config.norm_before_residual

    def forward(self, embeds, hidden, cos, sin, key_buffer, value_buffer, slots, positions, plan):
        normed = self.hidden_norm(hidden)
        attn_in = torch.cat((self.input_layernorm(embeds), normed), dim=-1)   # [B, T, 2H]
        residual = normed if self.norm_before_residual else hidden
        hidden = residual + self.self_attn(attn_in, cos, sin, key_buffer, value_buffer, slots, positions, plan)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """fc (3H -> H, on fused target features only) -> midlayer -> norm -> draft lm_head; ``token_map`` (draft id
    -> target id, from ``d2t``) or None when the draft vocabulary is the target's, in order.

    ``capture_points``: where the target's features come from (``Eagle3Config.capture_points``), set by the loader
    for its target. The embedding is the target's (a plain attribute: not saved, not moved).
    """

    def __init__(self, config: Eagle3Config, embed_tokens: nn.Module, token_map: torch.Tensor | None = None,
                 capture_points: tuple[int, ...] = ()):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.num_aux * config.target_hidden_size, config.hidden_size, bias=config.fc_bias)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        object.__setattr__(self, "embed_tokens", embed_tokens)
        self.capture_points = tuple(capture_points)
        self.token_map: torch.Tensor | None = token_map

    @property
    def fused_feature_size(self) -> int:
        return self.fc.in_features

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    def finish_loading(self, device: torch.device | str) -> None:
        self.rotary.reset(device)

    def quantize_int8(self) -> None:
        """Weight-only int8 for every linear of the head, its draft ``lm_head`` included
        (``draft_quantization``): drafts only propose, so the output is unchanged."""
        from .draft_quantization import quantize_linears_int8  # noqa: PLC0415
        quantize_linears_int8(self)

    def quantize_q8_0(self) -> None:
        """ggml Q8_0 blocks for every linear of the head (targets with native weights); a bias stays dense."""
        from .quantized import QuantizedLinear  # noqa: PLC0415
        for name, module in list(self.named_modules()):
            if isinstance(module, nn.Linear):
                parent, _, child = name.rpartition(".")
                setattr(self.get_submodule(parent), child, QuantizedLinear.from_linear(module, "Q8_0"))

    def make_cache(self, max_batch_size: int, capacity: int, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> KVCache:
        weight = self.norm.weight  # in the activation dtype whatever the linears hold
        return KVCache(1, max_batch_size, self.config.num_key_value_heads, capacity, self.config.head_dim,
                       dtype=dtype or weight.dtype, device=device or weight.device)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None, slots: torch.Tensor | None, key_length: int | None = None,
                logits_at: torch.Tensor | None = None, tree_mask=None) -> ModelOutput:
        """input_ids, positions: [B, T]; features: [B, T, 3H] (the target's, fused by fc) or [B, T, H] (the head's
        own previous hidden); slots: [B] -> logits [B, T, Vd] ([B, 1, Vd] with ``logits_at`` [B]), hidden
        [B, T, H] before the final norm."""
        width = features.shape[-1]
        if width == self.fc.in_features:
            hidden = self.fc(features)
        elif width == self.config.hidden_size:
            hidden = features
        else:
            raise ValueError(f"EAGLE-3 head: features are {width} wide; expected the target's fused features "
                             f"({self.fc.in_features}) or the head's hidden state ({self.config.hidden_size}); an "
                             f"EAGLE-3 head reads the target through AuxHiddenTarget")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)                     # [B, T, H]
        cos, sin = self.rotary(positions, hidden.dtype)
        if cache is None:  # training: causal attention within the T tokens
            hidden = self.midlayer(embeds, hidden, cos, sin, None, None, None, positions, None)
        else:
            check_cache(cache, 1, input_ids, slots)
            plan = plan_attention(positions, cache, key_length, tree_mask=tree_mask)  # a tree drafter's region
            hidden = self.midlayer(embeds, hidden, cos, sin, cache.keys[0], cache.values[0], slots, positions, plan)
        rows = hidden if logits_at is None else \
            hidden[torch.arange(hidden.shape[0], device=hidden.device), logits_at].unsqueeze(1)
        return ModelOutput(logits=self.lm_head(self.norm(rows)), hidden=hidden)


class AuxHiddenTarget(nn.Module):
    """``target`` as an EAGLE-3 worker calls it: the same forward, whose ``hidden`` is the fused auxiliary hidden
    states at ``points`` ([B, T, len(points) * H]). It holds the target (no copy: the parameters, cache shape,
    dtype and device are the target's), so one target can serve EAGLE-3, EAGLE and target-only workers at once."""

    def __init__(self, target: CausalLM, points: tuple[int, ...]):
        super().__init__()
        self.target = target
        self.config = target.config
        self.aux_points = CausalLM.check_aux_points(points, target.config.num_hidden_layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def feature_size(self) -> int:
        return len(self.aux_points) * self.config.hidden_size

    def make_cache(self, *args, **kwargs) -> KVCache:
        return self.target.make_cache(*args, **kwargs)

    def forward(self, *args, **kwargs) -> ModelOutput:
        return self.target(*args, aux_points=self.aux_points, **kwargs)


# ------------------------------------------------------------------------------------------ checkpoints

def _tensor_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the layout, by name: its shape (``OPTIONAL_TENSORS`` may be absent)."""
    h, heads, kv, d, i = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                          config.head_dim, config.intermediate_size)
    shapes = {
        "fc.weight": (h, config.num_aux * config.target_hidden_size),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * d),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (config.draft_vocab_size, h),
        "d2t": (config.draft_vocab_size,),
        "t2d": (config.target_vocab_size,),
        "embed_tokens.weight": (config.target_vocab_size, h),
    }
    if config.fc_bias:
        shapes["fc.bias"] = (h,)
    return shapes


# embed_tokens.weight: the target's is used (SGLang's set_embed); d2t: absent for a full-vocabulary head
OPTIONAL_TENSORS = ("embed_tokens.weight", "d2t", "t2d")


def token_map_from_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None, target_vocab_size: int,
                       source: str) -> torch.Tensor:
    """draft id -> target id (draft_id + d2t[draft_id]), checked: in range, distinct, and agreeing with ``t2d``."""
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise CheckpointError(f"{source}: d2t must hold integer offsets; got dtype {d2t.dtype}")
    token_map = torch.arange(d2t.numel()) + d2t.long()
    bad = ((token_map < 0) | (token_map >= target_vocab_size)).nonzero().flatten()
    if bad.numel():
        raise CheckpointError(f"{source}: d2t maps draft ids {bad[:5].tolist()} to target ids "
                              f"{token_map[bad[:5]].tolist()}, out of range 0..{target_vocab_size - 1}")
    if torch.unique(token_map).numel() != token_map.numel():
        raise CheckpointError(f"{source}: d2t maps two draft ids to one target id")
    if t2d is not None:
        marked = torch.zeros(target_vocab_size, dtype=torch.bool)
        marked[token_map] = True
        if not torch.equal(t2d.bool(), marked):
            raise CheckpointError(f"{source}: t2d disagrees with d2t (it must be true exactly at the "
                                  f"{token_map.numel()} target ids d2t maps to)")
    return token_map


def head_tensor_name(name: str) -> str:
    """A checkpoint tensor's name in this head: ``model.`` prefixes dropped, the speculators format's
    ``layers.0.`` (vLLM's name for the one decoder layer) as ``midlayer.``."""
    name = name.removeprefix("model.")
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def check_head_tensors(config: Eagle3Config, weights: dict[str, torch.Tensor], source: str) -> None:
    """Every tensor the layout needs, none it does not know, each in its shape; else ``CheckpointError`` naming
    them."""
    shapes = _tensor_shapes(config)
    missing = sorted(set(shapes) - set(weights) - set(OPTIONAL_TENSORS))
    unknown = sorted(set(weights) - set(shapes))
    if missing or unknown:
        problems = ([f"missing tensors {missing}"] if missing else []) + \
                   ([f"unknown tensors {unknown[:8]}"] if unknown else [])
        raise CheckpointError(f"{source}: not an EAGLE-3 head of this config: {'; '.join(problems)}")
    wrong = [f"{name}: {tuple(t.shape)}, expected {shapes[name]}" for name, t in weights.items()
             if tuple(t.shape) != shapes[name]]
    if wrong:
        raise CheckpointError(f"{source}: wrong shapes: {'; '.join(wrong[:5])}")


def head_token_map(config: Eagle3Config, weights: dict[str, torch.Tensor], source: str) -> torch.Tensor | None:
    """draft id -> target id from (and popping) ``d2t`` / ``t2d``; None when the draft vocabulary is the target's,
    in order. Without ``d2t`` the draft vocabulary must be the target's (as SGLang and vLLM read it)."""
    d2t, t2d = weights.pop("d2t", None), weights.pop("t2d", None)
    if d2t is None:
        if config.draft_vocab_size != config.target_vocab_size:
            raise CheckpointError(f"{source}: no d2t, but draft_vocab_size {config.draft_vocab_size} is smaller "
                                  f"than the target vocabulary {config.target_vocab_size}: a reduced draft "
                                  "vocabulary needs d2t (target id = draft id + d2t[draft id])")
        d2t = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    token_map = token_map_from_d2t(d2t, t2d, config.target_vocab_size, source)
    return None if torch.equal(token_map, torch.arange(config.target_vocab_size)) else token_map


def read_eagle3_checkpoint(directory: Path, target: nn.Module) -> tuple[Eagle3Config, dict[str, torch.Tensor]]:
    """The config (checked against ``target``) and the head's tensors, under this head's names."""
    source = str(directory / "config.json")
    config = Eagle3Config.from_dict(read_config_json(directory), source)
    target_config = target.config
    for name, mine, theirs in (("hidden_size", config.hidden_size, target_config.hidden_size),
                               ("target_hidden_size", config.target_hidden_size, target_config.hidden_size),
                               ("vocab_size", config.target_vocab_size, target_config.vocab_size)):
        if mine != theirs:
            raise CheckpointError(f"{source}: {name} {mine} does not match the target's {theirs}")
    if config.draft_vocab_size > config.target_vocab_size:
        raise CheckpointError(f"{source}: draft_vocab_size {config.draft_vocab_size} exceeds the target vocabulary "
                              f"{config.target_vocab_size}")
    weights = {head_tensor_name(name): t for name, t in read_weights(directory).items()}
    return config, weights


def load_eagle3_head(path: str | Path, target: nn.Module, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None, quantization: str | None = None) -> Eagle3Head:
    """An EAGLE-3 checkpoint directory (config.json + model.safetensors or pytorch_model.bin, SpecForge's layout or
    the speculators format) as a head over the built ``target``, whose embedding it uses; the target's capture
    points are recorded on the head (``capture_points``), and the drafter sets them on the target. Wrong
    shapes, missing or unknown tensors, a ``d2t`` out of range and configs that do not fit the target raise
    ``CheckpointError`` naming them. ``quantization``: None, "int8" or "q8_0" for the head's linears after loading
    (``Eagle3Head.quantize_int8`` / ``quantize_q8_0``)."""
    if quantization not in (None, "int8", "q8_0"):
        raise ValueError(f"quantization must be None, 'int8' or 'q8_0'; got {quantization!r}")
    directory = checkpoint_dir(path)
    config, weights = read_eagle3_checkpoint(directory, target)
    points = config.capture_points(target.config.num_hidden_layers, str(directory / "config.json"))
    weights_source = str(weights_file(directory))
    check_head_tensors(config, weights, weights_source)
    token_map = head_token_map(config, weights, weights_source)
    if weights.pop("embed_tokens.weight", None) is not None:  # SGLang's set_embed: the hidden sizes match
        log_once(f"{weights_source}: embed_tokens.weight is ignored; the head uses the target's embedding "
                 "(its hidden size matches the head's), as SGLang does")
    dtype = dtype or target.dtype
    device = device or target.device
    with torch.device("meta"):
        head = Eagle3Head(config, target.embed_tokens, capture_points=points)
    assign_weights(head, weights, dtype, device, str(directory))
    if token_map is not None:
        head.token_map = token_map.to(device)
    if quantization == "int8":
        head.quantize_int8()
    elif quantization == "q8_0":
        head.quantize_q8_0()
    return head.eval()


def save_eagle3_head(head: Eagle3Head, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write the head in SpecForge's layout: config.json (with the last layer's capture point) + model.safetensors
    with d2t and t2d, no embedding (the target's)."""
    from safetensors.torch import save_file  # noqa: PLC0415

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t for name, t in head.state_dict().items()}
    vocab = head.config.target_vocab_size
    token_map = head.token_map.cpu() if head.token_map is not None else torch.arange(vocab)
    state["d2t"] = token_map - torch.arange(token_map.numel())
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[token_map] = True
    state["t2d"] = t2d
    state = {name: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach().cpu().contiguous()
             for name, t in state.items()}
    (directory / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
