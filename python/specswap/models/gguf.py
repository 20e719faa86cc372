"""GGUF checkpoints: read metadata and tensors, dequantize, and convert once into a local safetensors cache.

A GGUF file (llama.cpp's format) holds quantized weights under llama.cpp tensor names, the config as
metadata keys and the tokenizer's vocabulary. ``build_gguf_cache`` turns one into plain checkpoint
directories that ``load_model`` / ``load_tokenizer`` read:

    <cache_dir>/manifest.json             what the cache was built from (GGUF sha256 and size, cache version)
    <cache_dir>/bfloat16/                 config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
    <cache_dir>/float32/                  config.json, model.safetensors (fp32), tokenizer.json, tokenizer_config.json
    <cache_dir>/native/                   config.json, model.safetensors (the file's blocks as uint8, the rest
                                          fp32; metadata "ggml_types"), tokenizer.json, tokenizer_config.json

``ensure_gguf_cache`` reuses a cache only when its manifest matches the GGUF and every file it lists is
whole (size and safetensors header checked, no full read); otherwise it says why and rebuilds.

Conventions followed (transformers' GGUF loader is the reference, tests/gemma checks parity):
- llama.cpp stores Gemma norm weights as (1 + w); they are converted back to w in fp32, because the
  model applies (1 + w) itself (``RMSNorm(weight_offset=1.0)``);
- Gemma uses NEOX-style rotary, so q/k weights are not permuted (unlike llama.cpp's Llama files);
- the tokenizer is rebuilt from the metadata as transformers' GGUF conversion does (``gguf_tokenizer``).

Needs the ``gguf`` package (``pip install "specswap[gemma]"``); only cache building imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .model_config import CheckpointError
from .gguf_tokenizer import build_gguf_tokenizer, sentencepiece_merges, tokenizer_config_from_gguf

logger = logging.getLogger(__name__)

GGUF_CACHE_VERSION = 3  # 3: tokenizer_config.json (chat template) beside tokenizer.json; Llama/Qwen rows
MANIFEST_FILE = "manifest.json"
CACHE_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
NATIVE_DIR = "native"  # the cache's block-format weights (uint8 blocks + ggml types in the safetensors metadata)
# GGML types this converter accepts; the names are gguf.GGMLQuantizationType members
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


def _import_gguf():
    try:
        import gguf  # noqa: PLC0415  (optional dependency, only needed to build a cache)
    except ImportError as error:
        raise ImportError('reading GGUF files needs the gguf package: pip install "specswap[gemma]"') from error
    return gguf


# ---------------------------------------------------------------------------------------------- reading


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped); a missing or malformed file is a CheckpointError."""
    gguf = _import_gguf()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as error:  # the reader raises ValueError/struct errors/IndexError on foreign bytes
        raise CheckpointError(f"{path}: not a readable GGUF file ({error})") from error


_MISSING = object()


def gguf_field(reader, key: str, default: Any = _MISSING) -> Any:
    """One metadata value as a Python str/int/float/bool/list."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise CheckpointError(f"{reader.data.filename}: GGUF metadata has no {key!r}")
        return default
    return field.contents()


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one ``general.architecture`` maps onto a runtime model."""

    config_from_gguf: Callable[[Any, str], dict[str, Any]]     # reader, source -> config.json dict
    parameter_name: Callable[[str], str | None]                # GGUF tensor name -> parameter name
    # (parameter name, fp32 tensor, config.json dict) -> tensor
    tensor_transform: Callable[[str, torch.Tensor, dict[str, Any]], torch.Tensor]
    # reader -> tokenizers.Tokenizer, or None for a file without tokenizer metadata; the one call site a GGUF
    # tokenizer builder plugs into (``gguf_tokenizer`` below)
    tokenizer_from_gguf: Callable[[Any], Any]


def gguf_architecture(reader, source: str) -> tuple[str, GGUFArchitecture]:
    """The file's architecture name and its converter; an architecture without one is refused by name."""
    name = gguf_field(reader, "general.architecture")
    if name not in GGUF_ARCHITECTURES:
        raise CheckpointError(f"{source}: GGUF architecture {name!r} is not supported; "
                              f"supported: {sorted(GGUF_ARCHITECTURES)}")
    return name, GGUF_ARCHITECTURES[name]


# ------------------------------------------------------------------------------------------- Gemma 3


def gemma3_config_from_gguf(reader, source: str) -> dict[str, Any]:
    """A Gemma 3 text config.json from the file's metadata.

    GGUF leaves out what llama.cpp hard-codes for Gemma 3 (sliding-window pattern 6, local rotary base 10000,
    query_pre_attn_scalar = head_dim); those come from transformers' Gemma3TextConfig defaults, as in its loader.
    """
    from .gemma3 import DEFAULT_LOCAL_ROPE_THETA, DEFAULT_SLIDING_WINDOW_PATTERN, Gemma3Config  # noqa: PLC0415

    arch = "gemma3"
    tokens = reader.fields["tokenizer.ggml.tokens"]
    num_layers = int(gguf_field(reader, f"{arch}.block_count"))
    head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", 256))
    value_dim = int(gguf_field(reader, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise CheckpointError(f"{source}: key_length {head_dim} != value_length {value_dim} is not supported")
    # an int period (every n-th layer global) or, in newer files, one bool per layer (True = sliding)
    pattern = gguf_field(reader, f"{arch}.attention.sliding_window_pattern", DEFAULT_SLIDING_WINDOW_PATTERN)
    vocab = gguf_field(reader, "tokenizer.ggml.tokens")
    eos_ids = [int(gguf_field(reader, "tokenizer.ggml.eos_token_id", 1))]
    if "<end_of_turn>" in vocab:  # the reference generation_config stops on it too
        eos_ids.append(vocab.index("<end_of_turn>"))
    raw = {
        "model_type": "gemma3_text",
        "vocab_size": len(tokens.data),
        "hidden_size": int(gguf_field(reader, f"{arch}.embedding_length")),
        "intermediate_size": int(gguf_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": num_layers,
        "num_attention_heads": int(gguf_field(reader, f"{arch}.attention.head_count")),
        "num_key_value_heads": int(gguf_field(reader, f"{arch}.attention.head_count_kv")),
        "head_dim": head_dim,
        "rms_norm_eps": float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "sliding_window": int(gguf_field(reader, f"{arch}.attention.sliding_window")),
        **({"layer_types": ["sliding_attention" if sliding else "full_attention" for sliding in pattern]}
           if isinstance(pattern, list) else {"sliding_window_pattern": int(pattern)}),
        "rope_theta": float(gguf_field(reader, f"{arch}.rope.freq_base")),
        "rope_local_base_freq": float(gguf_field(reader, f"{arch}.rope.freq_base_swa", DEFAULT_LOCAL_ROPE_THETA)),
        # llama.cpp's rule for the released Gemma 3 sizes below 27B (transformers' loader assumes 256)
        "query_pre_attn_scalar": _query_pre_attn_scalar(reader, arch, head_dim),
        "final_logit_softcapping": gguf_field(reader, f"{arch}.final_logit_softcapping", None),
        "max_position_embeddings": int(gguf_field(reader, f"{arch}.context_length")),
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "bos_token_id": int(gguf_field(reader, "tokenizer.ggml.bos_token_id", 2)),
        "eos_token_id": eos_ids,
        "pad_token_id": int(gguf_field(reader, "tokenizer.ggml.padding_token_id", 0)),
    }
    if f"{arch}.rope.scaling.type" in reader.fields:
        raw["rope_scaling"] = {"rope_type": gguf_field(reader, f"{arch}.rope.scaling.type"),
                               "factor": gguf_field(reader, f"{arch}.rope.scaling.factor", 1.0)}
    return Gemma3Config.from_dict(raw, source).to_hf_dict()


def _query_pre_attn_scalar(reader, arch: str, head_dim: int) -> float:
    scale = gguf_field(reader, f"{arch}.attention.scale", None)  # 1 / sqrt(query_pre_attn_scalar) when written
    if scale is None:
        return head_dim
    scalar = 1.0 / float(scale) ** 2
    return round(scalar) if abs(scalar - round(scalar)) < 1e-3 else scalar


# llama.cpp tensor names -> Hugging Face parameter names, shared by every architecture here
TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_COMMON_BLOCK_NAMES = {  # blk.{i}.<gguf> -> model.layers.{i}.<hf>
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GEMMA3_TOP_LEVEL_NAMES = TOP_LEVEL_NAMES
GEMMA3_BLOCK_NAMES = {**_COMMON_BLOCK_NAMES,  # Gemma 3 norms both sides of attention and of the MLP
                      "post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"}


def gemma3_parameter_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name -> Hugging Face parameter name; None for a tensor this model has no place for."""
    if gguf_name in GEMMA3_TOP_LEVEL_NAMES:
        return GEMMA3_TOP_LEVEL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in GEMMA3_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{GEMMA3_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return None


def gemma3_tensor_transform(name: str, tensor: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    # llama.cpp folds Gemma's +1 into every norm weight (incl. q/k norms); the model adds it back
    return tensor - 1 if name.endswith("norm.weight") else tensor


# ------------------------------------------------------------------------------- Llama, Qwen 2, Qwen 3


def llama_family_config_from_gguf(arch: str, model_type: str) -> Callable[[Any, str], dict[str, Any]]:
    """The config reader of a Llama-block architecture: a config.json dict for ``model_type`` from the file's
    ``<arch>.*`` metadata (the keys llama.cpp writes; a missing required key is named)."""
    def read(reader, source: str) -> dict[str, Any]:
        from .checkpoint import MODEL_ARCHITECTURES  # noqa: PLC0415

        num_heads = int(gguf_field(reader, f"{arch}.attention.head_count"))
        hidden = int(gguf_field(reader, f"{arch}.embedding_length"))
        head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", hidden // num_heads))
        value_dim = int(gguf_field(reader, f"{arch}.attention.value_length", head_dim))
        if value_dim != head_dim:
            raise CheckpointError(f"{source}: key_length {head_dim} != value_length {value_dim} is not supported")
        embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if embedding is None:
            raise CheckpointError(f"{source}: GGUF has no 'token_embd.weight' tensor")
        eos = gguf_field(reader, "tokenizer.ggml.eos_token_id", None)
        bos = gguf_field(reader, "tokenizer.ggml.bos_token_id", None)
        raw = {
            "model_type": model_type,
            "vocab_size": int(embedding.shape.tolist()[1]),
            "hidden_size": hidden,
            "intermediate_size": int(gguf_field(reader, f"{arch}.feed_forward_length")),
            "num_hidden_layers": int(gguf_field(reader, f"{arch}.block_count")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(gguf_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
            "head_dim": head_dim,
            "rms_norm_eps": float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(gguf_field(reader, f"{arch}.context_length", 2048)),
            "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
            "attention_bias": any(t.name.endswith("attn_output.bias") for t in reader.tensors),
            "bos_token_id": None if bos is None else int(bos),
            "eos_token_id": None if eos is None else int(eos),
        }
        if f"{arch}.rope.scaling.type" in reader.fields:
            raise CheckpointError(f"{source}: rope scaling {gguf_field(reader, f'{arch}.rope.scaling.type')!r} in a "
                                  f"GGUF file is not supported; valid: none")
        window = gguf_field(reader, f"{arch}.attention.sliding_window", None)
        if window and model_type == "llama":
            # a Llama-architecture file with an attention window is a Mistral (llama.cpp writes those as "llama")
            raw.update(model_type="mistral", sliding_window=int(window))
        elif window:
            raise CheckpointError(f"{source}: {arch}.attention.sliding_window is not supported for {arch}; valid: "
                                  "none")
        architecture = MODEL_ARCHITECTURES[raw["model_type"]]
        return architecture.config_from_dict(raw, source).to_hf_dict()
    return read


LLAMA_TOP_LEVEL_NAMES = TOP_LEVEL_NAMES
LLAMA_BLOCK_NAMES = {**_COMMON_BLOCK_NAMES, "ffn_norm": "post_attention_layernorm"}


def llama_parameter_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name -> Hugging Face parameter name (weights and biases); None when it has no place."""
    if gguf_name in LLAMA_TOP_LEVEL_NAMES:
        return LLAMA_TOP_LEVEL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LLAMA_BLOCK_NAMES
            and parts[3] in ("weight", "bias")):
        return f"model.layers.{parts[1]}.{LLAMA_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_rotary(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation for Llama files (its rotary pairs adjacent elements, Hugging Face's
    pairs the two halves of a head); transformers' GGUF loader does the same."""
    head_rows = tensor.shape[0] // num_heads // 2
    return tensor.reshape(num_heads, head_rows, 2, *tensor.shape[1:]).swapaxes(1, 2).reshape(tensor.shape)


def llama_tensor_transform(name: str, tensor: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
        return unpermute_rotary(tensor, config["num_attention_heads"])
    if name.endswith("self_attn.k_proj.weight") or name.endswith("self_attn.k_proj.bias"):
        return unpermute_rotary(tensor, config["num_key_value_heads"])
    return tensor


def neox_tensor_transform(name: str, tensor: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    # Qwen files use NEOX rotary (the two halves of a head), as Hugging Face does: nothing to undo
    return tensor


def gguf_tokenizer(reader):
    """The tokenizer reader of every GGUF row (``gguf_tokenizer.build_gguf_tokenizer``: SentencePiece-style or
    GPT-2 BPE from the metadata); None for a file without tokenizer metadata (token ids only)."""
    if "tokenizer.ggml.model" not in reader.fields:
        return None
    return build_gguf_tokenizer(reader)


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "gemma3": GGUFArchitecture(gemma3_config_from_gguf, gemma3_parameter_name, gemma3_tensor_transform,
                               gguf_tokenizer),
    # llama.cpp writes Mistral files as "llama"
    "llama": GGUFArchitecture(llama_family_config_from_gguf("llama", "llama"), llama_parameter_name,
                              llama_tensor_transform, gguf_tokenizer),
    "qwen2": GGUFArchitecture(llama_family_config_from_gguf("qwen2", "qwen2"), llama_parameter_name,
                              neox_tensor_transform, gguf_tokenizer),
    "qwen3": GGUFArchitecture(llama_family_config_from_gguf("qwen3", "qwen3"), llama_parameter_name,
                              neox_tensor_transform, gguf_tokenizer),
}


# --------------------------------------------------------------------------------------- dequantizing


def dequantize_tensor(tensor) -> torch.Tensor:
    """One GGUF tensor as fp32 in PyTorch layout ([out, in] for a weight: ggml lists dims innermost first)."""
    gguf = _import_gguf()
    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise CheckpointError(f"GGUF tensor {tensor.name!r} has type {kind}, which is not supported; "
                              f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}")
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    if not values.flags.writeable:  # F32 tensors come back as views of the read-only memory map
        values = values.copy()
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return torch.from_numpy(values.reshape(shape)).float()


def check_tensor_types(reader, source: str) -> None:
    """Refuse a file holding a tensor type this runtime cannot read before any conversion starts."""
    bad = sorted({t.tensor_type.name for t in reader.tensors} - set(SUPPORTED_TENSOR_TYPES))
    if bad:
        examples = [t.name for t in reader.tensors if t.tensor_type.name in bad][:3]
        raise CheckpointError(f"{source}: GGUF tensor types {bad} (e.g. {examples}) are not supported; supported: "
                              f"{', '.join(SUPPORTED_TENSOR_TYPES)}")


def read_gguf_state_dict(reader, architecture: GGUFArchitecture, source: str, config: dict[str, Any],
                         progress: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to fp32 and renamed to the model's parameter names."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    state: dict[str, torch.Tensor] = {}
    unknown = [t.name for t in reader.tensors if architecture.parameter_name(t.name) is None]
    if unknown:
        raise CheckpointError(f"{source}: {len(unknown)} GGUF tensors have no place in the model, e.g. {unknown[:5]}")
    total = sum(int(t.n_elements) for t in reader.tensors)
    with tqdm(total=total, unit="param", unit_scale=True, desc="dequantizing GGUF", disable=not progress) as bar:
        for tensor in reader.tensors:
            name = architecture.parameter_name(tensor.name)
            state[name] = architecture.tensor_transform(name, dequantize_tensor(tensor), config)
            bar.update(int(tensor.n_elements))
    return state


# ------------------------------------------------------------------------------ native (quantized) weights


def read_gguf_native_state(reader, architecture: GGUFArchitecture, model_linears: set[str], config: dict[str, Any],
                           progress: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The file's tensors for a model that keeps its matrices quantized: the bytes of every block-format weight
    matrix (a linear's weight in ``model_linears``, or the token embedding) as uint8 [out, row_bytes] under its
    parameter name, everything else dequantized to fp32. Returns (state, {name: ggml type name of each block
    tensor})."""
    import numpy as np  # noqa: PLC0415
    from tqdm.auto import tqdm  # noqa: PLC0415

    from .quantized import GGML_TYPES  # noqa: PLC0415

    state: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    total = sum(int(t.n_elements) for t in reader.tensors)
    with tqdm(total=total, unit="param", unit_scale=True, desc="reading GGUF blocks", disable=not progress) as bar:
        for tensor in reader.tensors:
            name = architecture.parameter_name(tensor.name)
            kind = tensor.tensor_type.name
            module = name.removesuffix(".weight")
            if (len(tensor.shape) == 2 and kind in GGML_TYPES and kind != "F32"
                    and (module in model_linears or name == "model.embed_tokens.weight")):
                out_features = int(tensor.shape.tolist()[1])
                data = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(out_features, -1)
                # a row permutation (Llama's q/k) moves whole block rows alike: the transform applies to the bytes
                state[name] = architecture.tensor_transform(name, torch.from_numpy(data.copy()), config)
                kinds[name] = kind
            else:
                state[name] = architecture.tensor_transform(name, dequantize_tensor(tensor), config)
            bar.update(int(tensor.n_elements))
    return state, kinds


# ------------------------------------------------------------------------------------------ the cache


def file_sha256(path: str | Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def cache_problem(cache_dir: str | Path, gguf_sha256: str, gguf_size: int | None = None) -> str | None:
    """Why the cache at ``cache_dir`` cannot be used for this GGUF, or None when it can.

    Cheap by design (start-up must stay fast): manifest fields, file sizes and safetensors headers are checked,
    tensor bytes are not read.
    """
    from safetensors import safe_open  # noqa: PLC0415

    cache_dir = Path(cache_dir)
    manifest_file = cache_dir / MANIFEST_FILE
    if not manifest_file.is_file():
        return f"no {MANIFEST_FILE} (not built yet, or a build was interrupted)"
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        return f"{manifest_file} is unreadable ({error})"
    if manifest.get("cache_version") != GGUF_CACHE_VERSION:
        return f"built by cache version {manifest.get('cache_version')}, this specswap writes {GGUF_CACHE_VERSION}"
    if manifest.get("gguf_sha256") != gguf_sha256:
        return f"built from GGUF sha256 {manifest.get('gguf_sha256')}, not {gguf_sha256}"
    if gguf_size is not None and manifest.get("gguf_size") != gguf_size:
        return f"built from a GGUF of {manifest.get('gguf_size')} bytes, not {gguf_size}"
    files = manifest.get("files") or {}
    missing_weights = [d for d in (*manifest.get("dtypes", []), NATIVE_DIR) if f"{d}/model.safetensors" not in files]
    if not files or missing_weights:
        return f"{manifest_file} lists no weights for {missing_weights or 'any dtype'}"
    for relative, size in files.items():
        file = cache_dir / relative
        if not file.is_file():
            return f"{file} is missing"
        if file.stat().st_size != size:
            return f"{file} has {file.stat().st_size} bytes, expected {size} (truncated or replaced)"
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt") as handle:
                    handle.keys()
            except Exception as error:  # safetensors raises several types for a damaged header
                return f"{file} is not readable safetensors ({error})"
    return None


def build_gguf_cache(gguf_path: str | Path, cache_dir: str | Path, gguf_sha256: str | None = None,
                     dtypes: tuple[str, ...] = tuple(CACHE_DTYPES), progress: bool = True,
                     extra_manifest: dict[str, Any] | None = None) -> Path:
    """Dequantize ``gguf_path`` once into ``cache_dir`` (layout in the module docstring); returns ``cache_dir``.

    Built in a sibling temporary directory and moved into place, manifest last, so an interrupted build never
    looks complete.
    """
    from safetensors.torch import save_file  # noqa: PLC0415

    gguf_path, cache_dir = Path(gguf_path), Path(cache_dir)
    bad = sorted(set(dtypes) - set(CACHE_DTYPES))
    if bad:
        raise ValueError(f"cache dtypes {bad} are not supported; valid: {sorted(CACHE_DTYPES)}")
    start = time.perf_counter()
    reader = open_gguf(gguf_path)
    source = str(gguf_path)
    arch_name, architecture = gguf_architecture(reader, source)
    check_tensor_types(reader, source)
    gguf_sha256 = gguf_sha256 or file_sha256(gguf_path)
    config = architecture.config_from_gguf(reader, source)
    tokenizer = architecture.tokenizer_from_gguf(reader)
    tokenizer_config = tokenizer_config_from_gguf(reader) if tokenizer is not None else None
    state = read_gguf_state_dict(reader, architecture, source, config, progress)
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = cache_dir.parent / f".{cache_dir.name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    tokenizer_file = staging / "tokenizer.json"
    tokenizer_config_file = staging / "tokenizer_config.json"
    if tokenizer is not None:
        tokenizer.save(str(tokenizer_file))
        # special-token strings, add_bos_token and the chat template, as load_tokenizer and AutoTokenizer read them
        tokenizer_config_file.write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **{
            key: value for key, value in tokenizer_config.items() if value is not None}}, indent=2,
            ensure_ascii=False) + "\n")
    from tqdm.auto import tqdm  # noqa: PLC0415
    for dtype_name in tqdm(dtypes, desc="writing safetensors", disable=not progress):
        directory = staging / dtype_name
        directory.mkdir()
        dtype_config = dict(config, dtype=dtype_name)
        (directory / "config.json").write_text(json.dumps(dtype_config, indent=2) + "\n")
        weights = {name: t.to(CACHE_DTYPES[dtype_name]).contiguous() for name, t in state.items()}
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt", "source": gguf_path.name})
        if tokenizer is not None:
            _link_or_copy(tokenizer_file, directory / "tokenizer.json")
            _link_or_copy(tokenizer_config_file, directory / "tokenizer_config.json")
    native_state, kinds = read_gguf_native_state(reader, architecture, _linear_names(config, source), config,
                                                  progress)
    if config.get("tie_word_embeddings"):
        native_state.pop("lm_head.weight", None)
    directory = staging / NATIVE_DIR
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(dict(config, weights="native"), indent=2) + "\n")
    save_file({name: t.contiguous() for name, t in native_state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt", "source": gguf_path.name, "ggml_types": json.dumps(kinds)})
    if tokenizer is not None:
        _link_or_copy(tokenizer_file, directory / "tokenizer.json")
        _link_or_copy(tokenizer_config_file, directory / "tokenizer_config.json")
        tokenizer_file.unlink()
        tokenizer_config_file.unlink()
    files = {str(p.relative_to(staging)): p.stat().st_size for p in sorted(staging.rglob("*")) if p.is_file()}
    manifest = {
        "cache_version": GGUF_CACHE_VERSION,
        "gguf_file": gguf_path.name,
        "gguf_sha256": gguf_sha256,
        "gguf_size": gguf_path.stat().st_size,
        "architecture": arch_name,
        "dtypes": list(dtypes),
        "files": files,
        "build_seconds": round(time.perf_counter() - start, 1),
        **(extra_manifest or {}),
    }
    (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.replace(staging, cache_dir)
    return cache_dir


def _linear_names(config: dict[str, Any], source: str) -> set[str]:
    """Names of the bias-free nn.Linear modules of the model ``config`` describes (built on the meta device)."""
    from .checkpoint import MODEL_ARCHITECTURES  # noqa: PLC0415

    architecture = MODEL_ARCHITECTURES[config["model_type"]]
    with torch.device("meta"):
        model = architecture.model_class(architecture.config_from_dict(config, source))
    # a linear with a bias (Qwen 2's q/k/v) stays dense: QuantizedLinear computes x @ W^T only
    return {name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module.bias is None}


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def ensure_gguf_cache(gguf_path: str | Path, cache_dir: str | Path, gguf_sha256: str | None = None,
                      progress: bool = True, extra_manifest: dict[str, Any] | None = None) -> Path:
    """``cache_dir`` built from ``gguf_path``, reusing it when it is current and whole, else (re)building it.

    ``gguf_sha256`` (when the caller already knows it, e.g. from the package that ships the file) saves hashing.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path}: GGUF file does not exist")
    size = gguf_path.stat().st_size
    if gguf_sha256 is None:
        gguf_sha256 = file_sha256(gguf_path)
    problem = cache_problem(cache_dir, gguf_sha256, size)
    if problem is None:
        return Path(cache_dir)
    if (Path(cache_dir) / MANIFEST_FILE).is_file():
        logger.warning("specswap: rebuilding the weight cache %s: %s", cache_dir, problem)
    else:
        logger.warning("specswap: converting %s once into %s (later starts load the cache)", gguf_path.name,
                       cache_dir)
    return build_gguf_cache(gguf_path, cache_dir, gguf_sha256, progress=progress, extra_manifest=extra_manifest)


__all__ = [
    "CACHE_DTYPES", "GGUF_ARCHITECTURES", "GGUF_CACHE_VERSION", "GGUFArchitecture", "build_gguf_cache",
    "cache_problem", "dequantize_tensor", "ensure_gguf_cache", "file_sha256", "gemma3_config_from_gguf",
    "gemma3_parameter_name", "gguf_architecture", "gguf_field", "read_gguf_native_state", "open_gguf",
    "read_gguf_state_dict", "sentencepiece_merges",
]
