"""Checkpoint tensors in and out of modules, shared by every loader (``checkpoint``, ``eagle3``): the checkpoint
directory, its tensors (``model.safetensors``, a sharded safetensors index, or ``pytorch_model.bin`` and its index
read with ``torch.load(weights_only=True)``), and assigning checked tensors to a module built on the meta device.
It imports no loader, so every loader imports it and none imports another's internals."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .model_config import CheckpointError

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
BIN_WEIGHTS_FILE = "pytorch_model.bin"
BIN_WEIGHTS_INDEX_FILE = "pytorch_model.bin.index.json"


def checkpoint_dir(path: str | Path) -> Path:
    """``path`` as a checkpoint directory; a missing one is named."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: checkpoint directory does not exist")
    return directory


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file), device="cpu")
    except Exception as error:  # safetensors raises several types for truncated or foreign files
        raise CheckpointError(f"{file}: cannot read safetensors weights ({error})") from error


def _load_bin(file: Path) -> dict[str, torch.Tensor]:
    """A PyTorch pickle of tensors, read with ``weights_only=True``: tensors and plain containers only, so a
    file carrying code is refused rather than run."""
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling raises several types for foreign or unsafe files
        raise CheckpointError(f"{file}: cannot read PyTorch weights with weights_only=True ({error})") from error
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointError(f"{file}: not a state dict (a mapping of names to tensors)")
    return dict(state)


def _read_index(directory: Path, index_file: Path, load) -> dict[str, torch.Tensor]:
    try:
        weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as error:
        raise CheckpointError(f"{index_file}: not a weights index with a 'weight_map' ({error})") from error
    weights: dict[str, torch.Tensor] = {}
    for shard_name in sorted(set(weight_map.values())):
        shard = directory / shard_name
        if not shard.is_file():
            raise CheckpointError(f"{index_file}: names shard {shard_name!r}, which is missing from {directory}")
        weights.update(load(shard))
    absent = sorted(set(weight_map) - set(weights))
    if absent:
        raise CheckpointError(f"{index_file}: {len(absent)} indexed tensors are absent from their shards, "
                              f"e.g. {absent[:5]}")
    return weights


def weights_file(directory: str | Path) -> Path:
    """The file (or index) ``read_weights`` reads in ``directory``, for messages; safetensors first."""
    directory = Path(directory)
    for name in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE, BIN_WEIGHTS_FILE, BIN_WEIGHTS_INDEX_FILE):
        if (directory / name).is_file():
            return directory / name
    return directory / WEIGHTS_FILE


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: model.safetensors, the shards its index names, else
    pytorch_model.bin or the shards of its index (``torch.load(weights_only=True)``)."""
    directory = checkpoint_dir(directory)
    file = weights_file(directory)
    if file.name == WEIGHTS_FILE and file.is_file():
        return _load_safetensors(file)
    if file.name == WEIGHTS_INDEX_FILE:
        return _read_index(directory, file, _load_safetensors)
    if file.name == BIN_WEIGHTS_FILE:
        return _load_bin(file)
    if file.name == BIN_WEIGHTS_INDEX_FILE:
        return _read_index(directory, file, _load_bin)
    raise CheckpointError(f"{directory}: missing weights; expected {WEIGHTS_FILE}, {WEIGHTS_INDEX_FILE}, "
                          f"{BIN_WEIGHTS_FILE} or {BIN_WEIGHTS_INDEX_FILE}")


def assign_weights(model: nn.Module, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                   device: torch.device | str, source: str) -> None:
    """Assign checked tensors to ``model`` (built on the meta device): floating ones in ``dtype``, all on
    ``device``; then ``model.finish_loading(device)``. A parameter or buffer left on meta is named."""
    converted = {name: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
                 for name, t in weights.items()}
    model.load_state_dict(converted, strict=False, assign=True)
    model.finish_loading(device)
    still_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if still_meta:
        raise CheckpointError(f"{source}: no weights loaded for {still_meta[:5]}")
