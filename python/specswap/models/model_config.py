"""Model configs read from Hugging Face ``config.json`` files.

One reader per architecture; each returns a frozen dataclass so a config can
be shared between a model, its cache and a draft head without surprises.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "llama3")


class CheckpointError(ValueError):
    """A checkpoint (config, weights, tokenizer) is missing or does not fit."""


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Read ``config.json`` from a checkpoint directory (or the file itself)."""
    config_path = Path(path)
    if config_path.is_dir():
        config_path = config_path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: missing config.json (expected a checkpoint directory holding "
                              "config.json + model.safetensors)")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{config_path}: not valid JSON ({error})") from error


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; ``rope_type`` is "default" or "llama3"."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @staticmethod
    def from_hf(raw: dict[str, Any], source: str) -> "RopeConfig":
        # transformers >= 5 writes "rope_parameters"; older files write rope_theta + rope_scaling
        params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(f"{source}: rope_type {rope_type!r} is not supported; "
                                  f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if rope_type == "default":
            return RopeConfig(theta=theta)
        return RopeConfig(
            theta=theta,
            rope_type=rope_type,
            factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face Llama ``config.json`` that the runtime uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    model_type: str = "llama"
    # the variants that share the Llama block: Qwen 2 (biases on q/k/v only), Qwen 3 (per-head q/k RMSNorm),
    # Mistral (a sliding attention window); None = attention_bias decides the q/k/v biases
    qkv_bias: bool | None = None
    qk_norm: bool = False
    sliding_window: int | None = None

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [name for name in required if name not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing required fields {missing}")
        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise CheckpointError(f"{source}: hidden_act {hidden_act!r} is not supported for Llama; valid: 'silu'")
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads={num_heads} is not a multiple of "
                                  f"num_key_value_heads={num_kv_heads}")
        head_dim = raw.get("head_dim") or int(raw["hidden_size"]) // num_heads
        return LlamaConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(raw, source),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=eos_ids(raw.get("eos_token_id")),
            model_type=str(raw.get("model_type", "llama")),
            sliding_window=int(raw["sliding_window"]) if raw.get("sliding_window") else None,
        )

    @staticmethod
    def from_mistral_dict(raw: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        """Mistral: the Llama block with an optional sliding attention window (``sliding_window``)."""
        return LlamaConfig.from_dict(raw, source)

    @staticmethod
    def from_qwen2_dict(raw: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        """Qwen 2: the Llama block with biases on the q/k/v projections (never on o_proj); its sliding window is
        used only when ``use_sliding_window`` says so, which this runtime refuses."""
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{source}: Qwen2 use_sliding_window=true is not supported; valid: false")
        config = LlamaConfig.from_dict({**raw, "sliding_window": None}, source)
        return replace(config, qkv_bias=True, attention_bias=False)

    @staticmethod
    def from_qwen3_dict(raw: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        """Qwen 3: the Llama block with a per-head RMSNorm of queries and keys before rotary."""
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{source}: Qwen3 use_sliding_window=true is not supported; valid: false")
        return replace(LlamaConfig.from_dict({**raw, "sliding_window": None}, source), qk_norm=True)

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers' LlamaConfig accepts."""
        rope_parameters: dict[str, Any] = {"rope_theta": self.rope.theta, "rope_type": self.rope.rope_type}
        if self.rope.rope_type == "llama3":
            rope_parameters.update(factor=self.rope.factor, low_freq_factor=self.rope.low_freq_factor,
                                   high_freq_factor=self.rope.high_freq_factor,
                                   original_max_position_embeddings=self.rope.original_max_position_embeddings)
        eos = list(self.eos_token_id)
        model_type = self.model_type if self.model_type in ("mistral", "qwen2", "qwen3") else "llama"
        variant = {"mistral": {"sliding_window": self.sliding_window}, "qwen2": {"use_sliding_window": False},
                   "qwen3": {"use_sliding_window": False}}.get(model_type, {})
        return {
            "architectures": [{"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
                              + "ForCausalLM"],
            "model_type": model_type,
            **variant,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "dtype": "float32",
        }


@dataclass(frozen=True)
class EagleConfig:
    """An EAGLE-1 style draft head: fc(2H -> H) + one Llama decoder layer + norm.

    ``target_vocab_size`` is the vocabulary of the target whose embedding and
    LM head the head shares; ``draft_vocab_size`` is the number of draft
    logits (equal to the target's unless a token_map restricts it).
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    fc_bias: bool = False
    model_type: str = "eagle"

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config.json") -> "EagleConfig":
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "target_vocab_size")
        missing = [name for name in required if name not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing required EAGLE fields {missing}")
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        return EagleConfig(
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // num_heads),
            target_vocab_size=int(raw["target_vocab_size"]),
            draft_vocab_size=int(raw.get("draft_vocab_size") or raw["target_vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(raw, source),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            fc_bias=bool(raw.get("fc_bias", False)),
        )

    @staticmethod
    def for_target(target: LlamaConfig, draft_vocab_size: int | None = None) -> "EagleConfig":
        """A head shaped like one layer of ``target``."""
        return EagleConfig(
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            target_vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size or target.vocab_size,
            rms_norm_eps=target.rms_norm_eps,
            rope=target.rope,
            max_position_embeddings=target.max_position_embeddings,
        )

    def decoder_config(self) -> LlamaConfig:
        """The Llama config of the head's single decoder layer."""
        return LlamaConfig(
            vocab_size=self.target_vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope=self.rope,
            max_position_embeddings=self.max_position_embeddings,
        )

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        rope = raw.pop("rope")
        raw["rope_parameters"] = {"rope_theta": rope["theta"], "rope_type": rope["rope_type"]}
        if rope["rope_type"] == "llama3":
            raw["rope_parameters"].update({k: rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                                "original_max_position_embeddings")})
        raw["architectures"] = ["EagleHead"]
        return raw
