"""The one loader: a model name, path or built module in; target, draft and tokenizer out.

Every caller (``Engine``, ``specswap serve``, ``specswap bench``, ``bench/bench_engine.py``) comes here for:

- which checkpoint a name means (``resolve_checkpoint``): a checkpoint directory, a GGUF file, a registry model
  shipped as a GGUF in an installed package (``specswap.zoo.registry``), or a zoo name;
- which dtype and weights (``resolve_dtype``, ``resolve_weights``): native GGUF blocks, bf16 or fp32;
- which draft goes with a target (``default_draft_name``: ``<model>-eagle`` / ``<model>-draft``), and whether an
  EAGLE head's linears are quantized (``resolve_draft_quantization``).

``load_models`` returns built modules (``LoadedModels``) that several engines can share without copying weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specswap.algorithms import algorithm
from specswap.capability import cpu_capability, native_kernels_available, native_kernels_problem
from specswap.zoo.registry import REGISTRY_MODELS, is_gguf_file, resolve_checkpoint  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

__all__ = ["DRAFT_QUANTIZATION", "DTYPES", "WEIGHTS", "LoadedModels", "default_draft_name", "gguf_backed",
           "load_draft", "load_models", "prepare_built", "resolve_checkpoint", "resolve_draft_quantization",
           "resolve_dtype", "resolve_weights"]

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
WEIGHTS = ("auto", "native", "bf16", "fp32")
# speculative_algorithm None: the model's own head where it has one, else prompt lookup
DEFAULT_WITH_HEAD, DEFAULT_WITHOUT_HEAD = "EAGLE", "NGRAM"


@dataclass
class LoadedModels:
    """Built modules shared by every engine of a process; ``draft`` is None for NGRAM / no speculation."""

    name: str
    target: Any                         # a built causal LM (torch.nn.Module)
    draft: Any                          # a built EAGLE head / draft model, or None
    tokenizer: Any
    speculative_algorithm: str | None   # what the draft supports: "EAGLE", "STANDALONE", "NGRAM" or None
    dtype: Any                          # torch.dtype (of activations, for native weights)
    device: str
    weights: str = "fp32"               # "native" (the GGUF's blocks on ggml), "bf16" or "fp32"


# ---------------------------------------------------------------------------------------- dtype, weights


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """"auto": bf16 on accelerators and on CPUs with native bf16 (``cpu_capability().native_bf16``: avx512_bf16 or
    AMX; elsewhere bf16 matmuls are emulated by converting to fp32), else fp32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; valid: 'auto', {', '.join(map(repr, DTYPES))}")
        return dtype
    if dtype == "auto":
        if torch.device(device).type != "cpu":
            return torch.bfloat16
        return torch.bfloat16 if cpu_capability().native_bf16 else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; valid: 'auto', {', '.join(map(repr, DTYPES))}")
    return DTYPES[dtype]


def gguf_backed(model: Any) -> bool:
    """Whether ``model`` names weights that come from a GGUF file (so native block weights are possible)."""
    return str(model) in REGISTRY_MODELS or is_gguf_file(model)


_warned_without_native_kernels = False


def _warn_once_without_native_kernels(model: Any) -> None:
    """One warning a process: a GGUF model that "auto" would run natively loads dequantized instead."""
    global _warned_without_native_kernels
    if not _warned_without_native_kernels:
        _warned_without_native_kernels = True
        logger.warning("specswap: %s loads dequantized (weights='auto' without native kernels: several times "
                       "slower to decode, results/README.md): %s", model, native_kernels_problem())


def resolve_weights(weights: str, model: Any, dtype: str | torch.dtype,
                    device: str | torch.device) -> tuple[str, torch.dtype]:
    """(weights, activation dtype) for a model name. "native" keeps a GGUF model's weights in the file's block
    formats (ggml kernels, CPU; activations fp32 unless ``dtype`` says otherwise); "bf16" / "fp32" load them
    dequantized. "auto": native for GGUF models on CPU when ggml is installed, else the weights follow ``dtype``."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} is not supported; valid: {WEIGHTS}")
    from_gguf = gguf_backed(model)
    on_cpu = torch.device(device).type == "cpu"
    if weights == "auto":
        if from_gguf and on_cpu and native_kernels_available():
            weights = "native"
        else:
            if from_gguf and on_cpu:  # "auto" would have run it natively here
                _warn_once_without_native_kernels(model)
            torch_dtype = resolve_dtype(dtype, device)
            return ("bf16" if torch_dtype == torch.bfloat16 else "fp32"), torch_dtype
    if weights == "native":
        if not from_gguf:
            raise ValueError(f"weights='native' needs a GGUF model (a .gguf file or {', '.join(REGISTRY_MODELS)}); "
                             f"{str(model)!r} has dense weights: use weights='auto', 'bf16' or 'fp32'")
        if not on_cpu:
            raise ValueError(f"weights='native' runs on the CPU only; on {device} use weights='bf16' or 'fp32'")
        return "native", torch.float32 if dtype == "auto" else resolve_dtype(dtype, device)
    torch_dtype = DTYPES["bfloat16" if weights == "bf16" else "float32"]
    if dtype != "auto" and resolve_dtype(dtype, device) != torch_dtype:
        raise ValueError(f"weights={weights!r} conflicts with dtype={dtype!r}; give one of them")
    return weights, torch_dtype


DRAFT_QUANTIZATION = ("auto", "none", "int8", "q8_0")


def resolve_draft_quantization(choice: str, name: str | None, dtype: torch.dtype,
                               device: torch.device | str, native_target: bool = False) -> str | None:
    """None, "int8" or "q8_0" for a draft (``load_eagle_head(quantization=...)``). "auto": for a target with
    native (block-format) weights, "q8_0" (the head's linears as ggml blocks beside the target's); for a bf16
    target on a CPU with AVX2, "int8", where a draft step is bound by reading weights and the int8 head accepted
    as many tokens as the bf16 one (docs/gemma.md); none otherwise. torch's int8 kernel is vectorized only for
    bf16 activations and only with AVX2 or AVX-512 (``cpu_capability().avx2``); elsewhere it is a scalar loop."""
    if choice not in DRAFT_QUANTIZATION:
        raise ValueError(f"draft quantization {choice!r} is not supported; valid: {DRAFT_QUANTIZATION}")
    quantizable = algorithm(name).quantizable_draft
    if choice in ("int8", "q8_0") and not quantizable:
        raise ValueError(f"draft quantization {choice!r} applies to EAGLE heads; speculative_algorithm is {name!r}")
    if choice == "int8" and native_target:
        raise ValueError("draft quantization 'int8' needs a target with bf16/fp32 weights; with native weights "
                         "use 'q8_0' or 'none'")
    if choice == "auto":
        if not quantizable:
            return None
        if native_target:
            return "q8_0"
        cpu_bf16 = dtype == torch.bfloat16 and torch.device(device).type == "cpu"
        return "int8" if cpu_bf16 and cpu_capability().avx2 else None
    return None if choice == "none" else choice


# ------------------------------------------------------------------------------------------ checkpoints


def default_draft_name(model: Any, name: str) -> str:
    """The zoo's draft for ``model`` under algorithm ``name``: ``<model>-<its draft_suffix>`` (``<model>-eagle``,
    ``<model>-draft``). A path has no default draft: the caller must name one."""
    if Path(str(model)).is_dir() or is_gguf_file(model):
        raise ValueError(f"speculative_algorithm {name!r} with a model path ({model}) needs a draft "
                         f"checkpoint (draft= / --draft-model); only zoo and registry models come with a default "
                         f"draft")
    return f"{model}-{algorithm(name).draft_suffix}"


def _draft_directory(model: Any, draft: Any, algorithm: str) -> Path:
    if draft is not None:
        return resolve_checkpoint(draft)
    name = default_draft_name(model, algorithm)
    try:
        return resolve_checkpoint(name)
    except ValueError as error:
        raise ValueError(f"model {str(model)!r} has no {algorithm} draft ({error}); pass --draft-model, or use "
                         f"--speculative-algorithm NGRAM (prompt lookup, needs no draft)") from error


# ---------------------------------------------------------------------------------------------- loading


def load_draft(model: Any, draft: Any, name: str, target: Any, quantization: str | None = None) -> Any:
    """The built draft for ``algorithm`` over the built ``target``: ``draft`` (a checkpoint) or the model's default
    (``default_draft_name``); None for NGRAM / no speculation. ``quantization``: the EAGLE head's, resolved."""
    from specswap.models import load_draft as load_draft_of_kind
    spec = algorithm(name)
    if not spec.needs_draft:
        return None
    return load_draft_of_kind(spec.draft_suffix, _draft_directory(model, draft, name), target,
                              quantization=quantization)


def load_models(model: Any, draft: Any = None, speculative_algorithm: str | None = "EAGLE",
                dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu",
                draft_quantization: str = "auto", weights: str = "auto", tokenizer: Any = None) -> LoadedModels:
    """Load the target (and its draft) once. ``speculative_algorithm=None`` picks EAGLE when the model has a head,
    else NGRAM; "NONE" loads no draft. ``weights``: "auto" | "native" | "bf16" | "fp32" (``resolve_weights``);
    ``draft_quantization``: "auto" | "none" | "int8" | "q8_0" (``resolve_draft_quantization``). ``tokenizer``
    replaces the checkpoint's."""
    from specswap.models import load_model
    from specswap.models.checkpoint import load_checkpoint_tokenizer

    weights, torch_dtype = resolve_weights(weights, model, dtype, device)
    name = speculative_algorithm
    if name is None:  # the model's head where it has one, else prompt lookup
        try:
            _draft_directory(model, draft, DEFAULT_WITH_HEAD)
            name = DEFAULT_WITH_HEAD
        except ValueError:
            name = DEFAULT_WITHOUT_HEAD
    spec = algorithm(name)
    quantization = resolve_draft_quantization(draft_quantization, name, torch_dtype, device,
                                              native_target=weights == "native")
    if spec.needs_draft and draft is None:
        default_draft_name(model, name)  # a path without a draft is refused before any weights load
    try:
        target_dir = resolve_checkpoint(model, "native" if weights == "native" else torch_dtype)
    except ImportError as error:
        raise ValueError(f"model {str(model)!r} is not available: {error}. For a quick start without it, pass "
                         f"--model tiny") from error
    target = load_model(target_dir, dtype=torch_dtype, device=device)
    drafter = load_draft(model, draft, name, target, quantization)
    # a GGUF without tokenizer metadata converts to a directory without tokenizer.json: token ids only
    if tokenizer is None and not (gguf_backed(model) and not (target_dir / "tokenizer.json").is_file()):
        tokenizer = load_checkpoint_tokenizer(target_dir)
    return LoadedModels(str(model), target, drafter, tokenizer, spec.name, torch_dtype, str(device), weights)


def prepare_built(model: torch.nn.Module, draft: Any, name: str | None, weights: str,
                  draft_quantization: str) -> tuple[Any, str]:
    """(draft, weights) for a target the caller built: its weights are read off the module, and a built head is
    quantized (in place) only when asked by name; "auto" leaves the caller's module be."""
    from specswap.models.quantized import QuantizedLinear
    built_weights = ("native" if isinstance(model.lm_head, QuantizedLinear)
                     else "bf16" if model.dtype == torch.bfloat16 else "fp32")
    if weights not in ("auto", built_weights):
        raise ValueError(f"weights={weights!r} cannot apply to a built model (its weights are {built_weights})")
    if algorithm(name).needs_draft and not isinstance(draft, torch.nn.Module):
        raise ValueError(f"with a built target model, speculative_algorithm {name!r} needs a built "
                         f"draft model; got draft={draft!r}")
    choice = None if draft_quantization == "auto" else resolve_draft_quantization(
        draft_quantization, name, model.dtype, model.device, native_target=built_weights == "native")
    if choice == "int8":
        draft.quantize_int8()
    elif choice == "q8_0":
        draft.quantize_q8_0()
    return draft, built_weights
