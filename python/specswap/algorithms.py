"""The speculative algorithms by name: what each drafter needs, in one place.

Every caller that must know something about an algorithm (the loader: whether a draft model loads and its
default name; the engine: whether the tokenizer's digit tokens go to the drafter; the worker: which drafter to
build; the flags: which names are valid) asks ``algorithm(name)`` here; nothing else compares algorithm names.
A new drafter plugs in with one entry: its Drafter class (``worker.drafter``), built from a ``DrafterContext``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Algorithm", "ALGORITHMS", "NAMES", "algorithm"]


@dataclass(frozen=True)
class Algorithm:
    """One speculative algorithm: its name as SGLang spells it, and what its drafter needs."""

    name: str | None            # None: no speculation (the flags' "NONE")
    draft_model: str | None     # what ``draft`` must be ("an EAGLE head", "a draft model"); None: no draft model
    draft_suffix: str | None    # a zoo or registry target's default draft is "<model>-<suffix>"
    quantizable_draft: bool     # its draft's linears may be quantized (draft_quantization int8 / q8_0)
    number_tokens: bool         # its drafter takes the tokenizer's digit tokens (counter extrapolation)
    drafter: str                # "module:Class" of its Drafter, imported when a worker builds one
    # where its drafts come from under tensor parallelism (``tp_draft``), the default first: "replicate" (every
    # rank drafts alike), "shard" (the draft split like the target), "leader" (the first rank drafts, broadcasts)
    tp_drafts: tuple[str, ...] = ()

    def tp_draft(self, placement: str | None) -> str | None:
        """``placement`` checked against this algorithm's (None: its default; None without speculation)."""
        if placement is None:
            return self.tp_drafts[0] if self.tp_drafts else None
        if placement not in self.tp_drafts:
            raise ValueError(f"tp_draft {placement!r} does not apply to speculative_algorithm {self.flag}; valid: "
                             f"{', '.join(self.tp_drafts) or 'none (no drafts)'}")
        return placement

    @property
    def needs_draft(self) -> bool:
        return self.draft_model is not None

    @property
    def flag(self) -> str:
        """The name on the command line (``--speculative-algorithm``)."""
        return self.name or "NONE"

    def drafter_class(self) -> type:
        module, _, name = self.drafter.partition(":")
        return getattr(importlib.import_module(module), name)


ALGORITHMS: dict[str | None, Algorithm] = {entry.name: entry for entry in (
    Algorithm("EAGLE", "an EAGLE head", "eagle", quantizable_draft=True, number_tokens=False,
              drafter="specswap.worker.eagle:EagleDrafter", tp_drafts=("replicate", "shard")),
    # an EAGLE-3 head (SpecForge / SGLang layout) over the target's auxiliary hidden states
    Algorithm("EAGLE3", "an EAGLE-3 head", "eagle3", quantizable_draft=True, number_tokens=False,
              drafter="specswap.worker.eagle3:Eagle3Drafter", tp_drafts=("replicate", "shard")),
    Algorithm("STANDALONE", "a draft model", "draft", quantizable_draft=False, number_tokens=False,
              drafter="specswap.worker.standalone:StandaloneDrafter", tp_drafts=("replicate", "shard")),
    Algorithm("NGRAM", None, None, quantizable_draft=False, number_tokens=True,
              drafter="specswap.worker.ngram:NgramDrafter", tp_drafts=("leader", "replicate")),
    Algorithm(None, None, None, quantizable_draft=False, number_tokens=False,
              drafter="specswap.worker.drafter:Drafter"),
)}
NAMES: tuple[str, ...] = tuple(entry.flag for entry in ALGORITHMS.values())  # EAGLE EAGLE3 STANDALONE NGRAM NONE


def algorithm(name: str | None) -> Algorithm:
    """The algorithm ``name`` names (None or "NONE": no speculation); ValueError lists the valid names."""
    key = None if name in (None, "NONE") else name
    if key not in ALGORITHMS:
        raise ValueError(f"speculative_algorithm {name!r} is not supported; valid: {', '.join(NAMES)} (or None)")
    return ALGORITHMS[key]
