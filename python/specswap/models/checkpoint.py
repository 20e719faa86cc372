"""Load and save checkpoints: ``config.json`` + weights (``weights_io``: safetensors, shards, pytorch_model.bin) with
Hugging Face names.

``load_model`` dispatches on ``model_type`` through ``MODEL_ARCHITECTURES``, the Hugging Face half of the architecture
table: model_type -> config reader, model class, tensor-name map (checkpoint name -> parameter name, None to
drop) and tokenizer reader. Its GGUF half is ``gguf.GGUF_ARCHITECTURES`` (general.architecture -> the same
columns for a GGUF file, each naming the model_type here it becomes). A new family adds a row (and a model file
reusing the shared layers, or a config reader over an existing class), never an edit to the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file
from torch import nn

from .model_config import CheckpointError, EagleConfig, LlamaConfig, read_config_json
from .eagle import EagleHead
from .eagle3 import load_eagle3_head
from .gemma3 import Gemma3Config, Gemma3ForCausalLM
from .llama import LlamaForCausalLM
from .weights_io import WEIGHTS_FILE, assign_weights, checkpoint_dir, read_weights

# keys some older checkpoints carry that this runtime recomputes
IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq",)
TOKEN_MAP_KEY = "token_map"


def same_name(name: str) -> str | None:
    return name


def hf_tokenizer(directory: Path):
    """The tokenizer of a Hugging Face directory: its tokenizer.json (a missing file is named)."""
    from .tokenizer import load_tokenizer  # noqa: PLC0415
    return load_tokenizer(directory)


@dataclass(frozen=True)
class Architecture:
    config_from_dict: Callable[[dict[str, Any], str], Any]      # config.json dict, source -> model config
    model_class: type[nn.Module]
    tensor_name: Callable[[str], str | None] = same_name        # checkpoint tensor name -> parameter name / None
    tokenizer_reader: Callable[[Path], Any] = hf_tokenizer      # checkpoint directory -> Tokenizer


def gemma3_multimodal_config(raw: dict[str, Any], source: str) -> Gemma3Config:
    """A Gemma 3 image-text config.json (model_type "gemma3"): its text model is ``text_config``."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{source}: model_type 'gemma3' needs a 'text_config' object (the text decoder)")
    return Gemma3Config.from_dict({**text, "model_type": "gemma3_text"}, source)


GEMMA3_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")  # transformers >= 4.52 / older


def gemma3_multimodal_tensor_name(name: str) -> str | None:
    """The text decoder's tensors of a Gemma 3 image-text checkpoint under text-model names; the vision tower
    and projector are dropped."""
    for prefix in GEMMA3_TEXT_PREFIXES:
        if name.startswith(prefix):
            return "model." + name.removeprefix(prefix)
    if name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "lm_head.weight"
    return None


MODEL_ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(LlamaConfig.from_dict, LlamaForCausalLM),
    "mistral": Architecture(LlamaConfig.from_mistral_dict, LlamaForCausalLM),
    "qwen2": Architecture(LlamaConfig.from_qwen2_dict, LlamaForCausalLM),
    "qwen3": Architecture(LlamaConfig.from_qwen3_dict, LlamaForCausalLM),
    "gemma3_text": Architecture(Gemma3Config.from_dict, Gemma3ForCausalLM),
    "gemma3": Architecture(gemma3_multimodal_config, Gemma3ForCausalLM, gemma3_multimodal_tensor_name),
}


def register_architecture(model_type: str, config_from_dict: Callable[[dict[str, Any], str], Any],
                          model_class: type[nn.Module], tensor_name: Callable[[str], str | None] = same_name,
                          tokenizer_reader: Callable[[Path], Any] = hf_tokenizer) -> None:
    """Make ``load_model`` build ``model_class`` for checkpoints whose config.json says ``model_type``."""
    MODEL_ARCHITECTURES[model_type] = Architecture(config_from_dict, model_class, tensor_name, tokenizer_reader)


def architecture_of(directory: str | Path) -> Architecture:
    """The table row for a checkpoint directory's config.json; an unknown model_type is refused by name."""
    directory = checkpoint_dir(directory)
    model_type = read_config_json(directory).get("model_type")
    if model_type not in MODEL_ARCHITECTURES:
        raise CheckpointError(f"{directory / 'config.json'}: model_type {model_type!r} is not supported; "
                              f"supported: {sorted(MODEL_ARCHITECTURES)}")
    return MODEL_ARCHITECTURES[model_type]


def load_checkpoint_tokenizer(directory: str | Path):
    """The tokenizer of a checkpoint directory, read by its architecture's tokenizer reader."""
    return architecture_of(directory).tokenizer_reader(Path(directory))


def _match_state_dict(model: nn.Module, weights: dict[str, torch.Tensor], source: str,
                      optional: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Check names and shapes against the model; return the tensors to load."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    given = {name: t for name, t in weights.items() if not name.endswith(IGNORED_KEY_SUFFIXES)}
    missing = sorted(set(expected) - set(given) - optional)
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing keys, e.g. {missing[:5]}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected keys, e.g. {unexpected[:5]}")
        raise CheckpointError(f"{source}: weights do not match the config: {'; '.join(problems)}")
    wrong_shapes = [f"{name}: checkpoint {tuple(t.shape)} vs config {expected[name]}"
                    for name, t in given.items() if tuple(t.shape) != expected[name]]
    if wrong_shapes:
        raise CheckpointError(f"{source}: shape mismatch for {len(wrong_shapes)} tensors, e.g. {wrong_shapes[:3]}")
    return {name: t for name, t in given.items() if name not in optional}


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """Build the model named by ``config.json``'s model_type and load its weights."""
    directory = checkpoint_dir(path)
    source = str(directory / "config.json")
    raw = read_config_json(directory)
    model_type = raw.get("model_type")
    if model_type not in MODEL_ARCHITECTURES:
        raise CheckpointError(f"{source}: model_type {model_type!r} is not supported; "
                              f"supported: {sorted(MODEL_ARCHITECTURES)}")
    architecture = MODEL_ARCHITECTURES[model_type]
    config = architecture.config_from_dict(raw, source)
    with torch.device("meta"):
        model = architecture.model_class(config)
    if raw.get("weights") == "native":
        return _load_native(model, directory, dtype, device)
    # a tied lm_head is the embedding; checkpoints usually omit it
    optional = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    renamed = {architecture.tensor_name(name): t for name, t in read_weights(directory).items()}
    renamed.pop(None, None)
    weights = _match_state_dict(model, renamed, str(directory / WEIGHTS_FILE), optional)
    assign_weights(model, weights, dtype, device, str(directory))
    return model.eval()


def _load_native(model: nn.Module, directory: Path, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """A model whose block-format matrices (safetensors metadata "ggml_types": {name: type}) stay quantized as
    ``QuantizedLinear`` / ``QuantizedEmbedding``; the rest loads in ``dtype``, the activation dtype."""
    from safetensors import safe_open  # noqa: PLC0415

    from .quantized import QuantizedEmbedding, QuantizedLinear  # noqa: PLC0415

    file = directory / WEIGHTS_FILE
    if torch.device(device).type != "cpu":
        raise ValueError(f"{directory}: native (block-format) weights run on the CPU only, not {device}; "
                         "load weights='bf16' or 'fp32' there")
    try:
        with safe_open(str(file), framework="pt") as handle:
            kinds: dict[str, str] = json.loads((handle.metadata() or {})["ggml_types"])
    except Exception as error:
        raise CheckpointError(f"{file}: native weights need safetensors metadata 'ggml_types' ({error})") from error
    weights = read_weights(directory)
    for name, kind in kinds.items():
        if name not in weights:
            raise CheckpointError(f"{file}: 'ggml_types' names {name!r}, which the file does not hold")
        module_name = name.removesuffix(".weight")
        if name == "model.embed_tokens.weight":
            embedding = model.model.embed_tokens
            table = QuantizedLinear(weights.pop(name), kind, embedding.embedding_dim)
            model.model.embed_tokens = QuantizedEmbedding(table, dtype, getattr(embedding, "embed_scale", None))
            if getattr(model.config, "tie_word_embeddings", False):
                model.lm_head = table
            continue
        linear = model.get_submodule(module_name)
        if not isinstance(linear, nn.Linear) or linear.bias is not None:
            raise CheckpointError(f"{file}: {name!r} is a block-format weight but {module_name!r} is not a bias-free "
                                  "linear")
        parent, _, child = module_name.rpartition(".")
        setattr(model.get_submodule(parent), child, QuantizedLinear(weights.pop(name), kind, linear.in_features))
    optional = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    dense = {name: t for name, t in weights.items()}
    expected = {name for name, _ in model.named_parameters()}
    unexpected = sorted(set(dense) - expected - optional)
    if unexpected:
        raise CheckpointError(f"{file}: {len(unexpected)} unexpected tensors, e.g. {unexpected[:5]}")
    model.activation_dtype = dtype
    assign_weights(model, dense, dtype, device, str(directory))
    from .layers import Attention  # noqa: PLC0415
    for module in model.modules():
        if isinstance(module, Attention):
            module.batch_invariant = True
    return model.eval()


def load_eagle_head(path: str | Path, target: LlamaForCausalLM, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None, quantization: str | None = None) -> EagleHead:
    """Load an EAGLE head that shares ``target``'s embedding and LM head; dtype/device default to the target's.
    ``quantization="int8"`` makes the head's linears and LM head rows weight-only int8 after loading
    (``EagleHead.quantize_int8``); ``"q8_0"`` makes its linears ggml Q8_0 blocks (``quantize_q8_0``; for targets
    with native weights, whose LM head rows are blocks already); None keeps the checkpoint's weights in ``dtype``."""
    if quantization not in (None, "int8", "q8_0"):
        raise ValueError(f"quantization must be None, 'int8' or 'q8_0'; got {quantization!r}")
    directory = checkpoint_dir(path)
    source = str(directory / "config.json")
    config = EagleConfig.from_dict(read_config_json(directory), source)
    if config.hidden_size != target.config.hidden_size:
        raise CheckpointError(f"{source}: draft hidden_size {config.hidden_size} does not match the target's "
                              f"hidden_size {target.config.hidden_size}")
    if config.target_vocab_size != target.config.vocab_size:
        raise CheckpointError(f"{source}: draft target_vocab_size {config.target_vocab_size} does not match the "
                              f"target's vocab_size {target.config.vocab_size}")
    dtype = dtype or target.dtype
    device = device or target.device
    weights = read_weights(directory)
    weights_source = str(directory / WEIGHTS_FILE)
    token_map = weights.pop(TOKEN_MAP_KEY, None)
    if token_map is None and config.draft_vocab_size != config.target_vocab_size:
        raise CheckpointError(f"{weights_source}: draft_vocab_size {config.draft_vocab_size} is smaller than the "
                              f"target vocabulary {config.target_vocab_size} but no '{TOKEN_MAP_KEY}' tensor is stored")
    if token_map is not None and token_map.numel() != config.draft_vocab_size:
        raise CheckpointError(f"{weights_source}: {TOKEN_MAP_KEY} has {token_map.numel()} entries but config "
                              f"draft_vocab_size is {config.draft_vocab_size}")
    with torch.device("meta"):
        head = EagleHead(config, target.embed_tokens, target.lm_head)
    weights = _match_state_dict(head, weights, weights_source)
    assign_weights(head, weights, dtype, device, str(directory))
    try:
        head.set_token_map(token_map, source=weights_source)
    except ValueError as error:
        raise CheckpointError(str(error)) from error
    if quantization == "int8":
        head.quantize_int8()
    elif quantization == "q8_0":
        head.quantize_q8_0()
    return head.eval()


def load_draft_model(path: str | Path, target: LlamaForCausalLM, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> LlamaForCausalLM:
    """Load a standalone draft model and check that it speaks the target's vocabulary."""
    draft = load_model(path, dtype=dtype or target.dtype, device=device or target.device)
    if draft.config.vocab_size != target.config.vocab_size:
        raise CheckpointError(f"{Path(path) / 'config.json'}: draft vocab_size {draft.config.vocab_size} does not "
                              f"match the target's vocab_size {target.config.vocab_size}")
    return draft


DRAFT_KINDS = ("eagle", "eagle3", "draft")


def load_draft(kind: str, path: str | Path, target: LlamaForCausalLM, quantization: str | None = None) -> nn.Module:
    """A draft of ``kind`` over the built ``target``: "eagle" (an EAGLE head; ``quantization`` None, "int8" or
    "q8_0"), "eagle3" (an EAGLE-3 head, ``models.eagle3``; the same quantization) or "draft" (a standalone draft model)."""
    if kind == "eagle":
        return load_eagle_head(path, target, quantization=quantization)
    if kind == "eagle3":  # an EAGLE-3 head in SpecForge's or vLLM's speculators layout (models.eagle3)
        return load_eagle3_head(path, target, quantization=quantization)
    if kind == "draft":
        if quantization is not None:
            raise ValueError(f"draft quantization {quantization!r} applies to EAGLE heads, not draft models")
        return load_draft_model(path, target)
    raise ValueError(f"draft kind {kind!r} is not one of {DRAFT_KINDS}")


def _contiguous_cpu(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    return {name: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach().cpu().contiguous()
            for name, t in state.items()}


def save_model(model: LlamaForCausalLM, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors that both this runtime and transformers load."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    config = model.config.to_hf_dict()
    if dtype is not None:
        config["dtype"] = str(dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(_contiguous_cpu(state, dtype), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})


def save_eagle_head(head: EagleHead, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write the head's own weights (not the shared embedding / LM head) and its token_map, if any."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = dict(head.state_dict())
    if head.token_map is not None:
        state[TOKEN_MAP_KEY] = head.token_map
    config = replace(head.config, draft_vocab_size=head.draft_vocab_size)
    (directory / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    save_file(_contiguous_cpu(state, dtype), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
