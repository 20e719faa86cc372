"""The start-up check that every rank runs the same configuration.

Each rank describes what must agree (``engine_fingerprint``: candidate tiers, the start-up tier, the algorithm,
the target's and draft's shapes, dtype, weights kind, a checksum of the weights' leading values, batch and
sequence limits, the layout) and ``check_same_config`` all-gathers the descriptions once: a field that differs
raises ``ConfigMismatch`` naming it and which ranks hold which value, before any request runs.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

__all__ = ["ConfigMismatch", "check_same_config", "describe_model", "engine_fingerprint"]


class ConfigMismatch(RuntimeError):
    """Ranks started with different configurations; ``field`` names the first that differs."""

    def __init__(self, message: str, field: str, values: dict[str, list[int]]):
        super().__init__(message)
        self.field = field
        self.values = values


def _weights_digest(model: torch.nn.Module, limit: int = 64) -> str:
    """A digest of every parameter's and buffer's name, shape, dtype and first ``limit`` values (cheap: it reads
    a few values per tensor, so two checkpoints of one architecture differ here)."""
    digest = hashlib.sha256()
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor is None or tensor.device.type == "meta":
            continue
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        head = tensor.detach().reshape(-1)[:limit].cpu()
        digest.update(head.view(torch.uint8).numpy().tobytes() if head.dtype != torch.uint8 else head.numpy().tobytes())
    return digest.hexdigest()[:16]


def describe_model(model: Any) -> dict[str, Any]:
    """What identifies a model across ranks: its class, config, dtype and weights digest (None: no model)."""
    if model is None:
        return {"class": None}
    config = getattr(model, "config", None)
    return {"class": type(model).__name__, "config": repr(config), "dtype": str(getattr(model, "dtype", None)),
            "weights": _weights_digest(model)}


def engine_fingerprint(*, candidate_tiers, start_tier: int, algorithm: str | None, target: Any, draft: Any,
                       weights: str, max_batch_size: int, max_seq_len: int, adaptive_config: Any,
                       tp_size: int, dp_size: int, graphs: bool, tp_draft: str | None = None) -> dict[str, Any]:
    """The fields every rank must agree on, as plain values (``check_same_config`` compares them one by one)."""
    target_desc, draft_desc = describe_model(target), describe_model(draft)
    return {
        "candidate_tiers": list(candidate_tiers),
        "start_tier": start_tier,
        "algorithm": algorithm,
        "adaptive_policy": repr(adaptive_config),
        "target_class": target_desc["class"],
        "target_shapes": target_desc.get("config"),
        "dtype": target_desc.get("dtype"),
        "weights_kind": weights,
        "target_weights": target_desc.get("weights"),
        "draft": {key: draft_desc.get(key) for key in ("class", "config", "dtype")},
        "draft_weights": draft_desc.get("weights"),
        "max_batch_size": max_batch_size,
        "max_seq_len": max_seq_len,
        "layout": f"tp={tp_size} dp={dp_size}",
        "tp_draft": tp_draft,
        "graphs": graphs,
    }


def check_same_config(group, fields: dict[str, Any]) -> None:
    """All-gather ``fields`` over every rank (one collective); raise ``ConfigMismatch`` on the first field whose
    value differs, naming the ranks that hold each value."""
    everyone = group.all_gather_object(fields, group="world")
    for name in fields:
        holders: dict[str, list[int]] = {}
        for rank, theirs in enumerate(everyone):
            holders.setdefault(repr(theirs.get(name, "<missing>")), []).append(rank)
        if len(holders) > 1:
            detail = "; ".join(f"ranks {ranks} have {value if len(value) < 200 else value[:200] + '...'}"
                               for value, ranks in holders.items())
            raise ConfigMismatch(f"rank {group.rank}: ranks started with different {name}: {detail}", name, holders)
    extra = sorted({key for theirs in everyone for key in theirs} - set(fields))
    if extra:
        raise ConfigMismatch(f"rank {group.rank}: other ranks describe fields {extra} this one does not (different "
                             f"specswap versions?)", extra[0], {})
