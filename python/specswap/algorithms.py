"""The speculative algorithms by name: what each drafter needs, in one place.

Every caller that must know something about an algorithm (the loader: whether a draft model loads and its
default name; the engine: whether the tokenizer's digit tokens go to the drafter; the worker: which drafter to
build; the flags: which names are valid) asks ``algorithm(name)`` here; nothing else compares algorithm names.
A new drafter plugs in with one entry: its Drafter class (``worker.drafter``), built from a ``DrafterContext``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Algorithm", "ALGORITHMS", "HYBRID_DRAFTERS", "NAMES", "SUFFIX_OPTIONS", "algorithm"]

# SUFFIX's Engine keywords (flags --suffix-decoding-...), named after vLLM's speculative_config fields
SUFFIX_OPTIONS = ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                  "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")


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
    options: tuple[str, ...] = ()  # the Engine keywords its drafter takes (``DrafterContext.options``)
    parts: tuple[str, str] | None = None  # a hybrid ("EAGLE+SUFFIX"): its model drafter's algorithm, the second's

    def hybrid(self, second: str | None) -> "Algorithm":
        """This model drafter with ``second`` (``hybrid_drafter``: "SUFFIX") drafting beside it, the better draft
        verified per request (``worker.hybrid``); None: this algorithm alone. ValueError naming the misfit."""
        if second is None:
            return self
        key = second.upper() if isinstance(second, str) else second
        if key not in HYBRID_DRAFTERS:
            raise ValueError(f"hybrid_drafter {second!r} is not supported; valid: {', '.join(HYBRID_DRAFTERS)}")
        if not self.needs_draft or self.parts is not None:
            raise ValueError(f"hybrid_drafter {key} drafts beside a draft model or head (speculative_algorithm "
                             f"{', '.join(HYBRID_MODELS)}); got speculative_algorithm {self.flag}")
        return ALGORITHMS[f"{self.name}+{key}"]

    def tp_draft(self, placement: str | None) -> str | None:
        """``placement`` checked against this algorithm's (None: its default; None without speculation)."""
        if placement is None:
            return self.tp_drafts[0] if self.tp_drafts else None
        if placement not in self.tp_drafts:
            raise ValueError(f"tp_draft {placement!r} does not apply to speculative_algorithm {self.flag}; valid: "
                             f"{', '.join(self.tp_drafts) or 'none (no drafts)'}")
        return placement

    def drafter_options(self, **given: Any) -> dict[str, Any]:
        """The keywords of ``given`` that are set (not None: the drafter's default), each checked to be one of
        this algorithm's ``options``: a drafter's setting is never silently ignored."""
        chosen = {key: value for key, value in given.items() if value is not None}
        foreign = sorted(set(chosen) - set(self.options))
        if foreign:
            takers = sorted({entry.flag for entry in ALGORITHMS.values()
                             if set(foreign) & set(entry.options) and entry.parts is None})
            raise ValueError(f"{', '.join(foreign)} apply to speculative_algorithm {' or '.join(takers) or 'none'}; "
                             f"got {self.flag}")
        return chosen

    @property
    def needs_draft(self) -> bool:
        return self.draft_model is not None

    @property
    def flag(self) -> str:
        """The name on the command line (``--speculative-algorithm``)."""
        return self.name or "NONE"

    def drafter_class(self) -> type:
        module, _, name = self.drafter.partition(":")
        drafter = getattr(importlib.import_module(module), name)
        return drafter if self.parts is None else drafter.over(*(ALGORITHMS[part] for part in self.parts))


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
    # suffix decoding over arctic-inference's suffix trees: the request's own and the recent outputs' (worker.suffix)
    Algorithm("SUFFIX", None, None, quantizable_draft=False, number_tokens=True,
              drafter="specswap.worker.suffix:SuffixDrafter", tp_drafts=("leader", "replicate"), options=SUFFIX_OPTIONS),
    Algorithm(None, None, None, quantizable_draft=False, number_tokens=False,
              drafter="specswap.worker.drafter:Drafter"),
)}
NAMES: tuple[str, ...] = tuple(entry.flag for entry in ALGORITHMS.values())  # EAGLE ... NGRAM SUFFIX NONE
# hybrids (``Algorithm.hybrid``; not flag names: --speculative-hybrid-drafter names the second): a model drafter and
# SUFFIX, one process or data parallelism (no tp_draft), SUFFIX's keywords
HYBRID_DRAFTERS = ("SUFFIX",)
HYBRID_MODELS = ("EAGLE", "EAGLE3", "STANDALONE")
for _model in HYBRID_MODELS:
    for _second in HYBRID_DRAFTERS:
        ALGORITHMS[f"{_model}+{_second}"] = replace(
            ALGORITHMS[_model], name=f"{_model}+{_second}", drafter="specswap.worker.hybrid:HybridDrafter",
            tp_drafts=(), options=ALGORITHMS[_second].options, parts=(_model, _second))


def algorithm(name: str | None) -> Algorithm:
    """The algorithm ``name`` names (None or "NONE": no speculation); ValueError lists the valid names."""
    key = None if name in (None, "NONE") else name
    if key not in ALGORITHMS:
        raise ValueError(f"speculative_algorithm {name!r} is not supported; valid: {', '.join(NAMES)} (or None)")
    return ALGORITHMS[key]
