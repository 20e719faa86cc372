"""A tier as one value: its shape as SGLang's three flags name it, the pool key it is stored under, and what it
drafts a round. The mirror of C++ ``TierShape`` (``csrc/core/tier_key.h``); the packed key is for the pool and
tables, never a figure to report or multiply."""

from __future__ import annotations

from dataclasses import dataclass

from specswap._core import tier_key, tier_shape


@dataclass(frozen=True)
class Tier:
    """``steps``: draft depth (0: no speculation); ``topk``: children each expanded node keeps (1: a chain);
    ``draft_tokens``: tokens verified a round per request, the root (x_{m-1}) included."""

    steps: int
    topk: int = 1
    draft_tokens: int | None = None

    def __post_init__(self):
        if self.draft_tokens is None:
            object.__setattr__(self, "draft_tokens", self.steps + 1)

    @classmethod
    def from_key(cls, key: int) -> Tier:
        steps, topk, tokens = tier_shape(int(key))
        return cls(steps, topk, tokens)

    @property
    def key(self) -> int:
        """The pool's key: a chain's steps, a tree's encoded shape (``_core.tier_key``)."""
        return tier_key(self.steps, self.topk, self.draft_tokens)

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def drafts(self) -> int:
        """Draft tokens verified a round per request (0 at tier 0)."""
        return self.draft_tokens - 1 if self.steps else 0

    @property
    def label(self) -> str:
        """A short name for tables and metric labels: "3" for a chain of 3 steps, "3x2x8" for a tree."""
        return f"{self.steps}x{self.topk}x{self.draft_tokens}" if self.is_tree else str(self.steps)

    def describe(self) -> str:
        """The tier in words, for logs."""
        if not self.steps:
            return "no drafts (tier 0: one token a round)"
        if self.is_tree:
            return (f"a tree of depth {self.steps}, top-{self.topk}, verifying {self.draft_tokens} tokens a round")
        return f"a chain of {self.steps} draft tokens ({self.draft_tokens} verified a round)"

    def as_dict(self) -> dict[str, int]:
        """SGLang's names for the shape."""
        return {"speculative_num_steps": self.steps, "speculative_eagle_topk": self.topk,
                "speculative_num_draft_tokens": self.draft_tokens}
