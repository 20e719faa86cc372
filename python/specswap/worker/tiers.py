"""A tier's buffers and how its stages run.

A tier k (speculative_num_steps) drafts k tokens and verifies k + 1. Its
buffers are built once, at start-up, and shared with the SpecRuntimeState the
controller keeps for it. ``Forwards`` is the tier's execution mode, chosen
once when the tier is built: each stage either calls its model directly
(``EagerForward``) or replays that stage's graphs (``specswap.graphs.StageGraphs``);
both take the same arguments, so the round itself never asks which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:  # the models arrive as objects; the worker imports none of them
    from specswap.models import ModelOutput


class EagerForward:
    """A model forward called directly, with StageGraphs' signature: (input_ids [B, T], positions [B, T],
    slots [B], key_length, features [B, T, H] for an EAGLE head, logits_at [B]: the logits at that position of
    each row only, [B, 1, V]) -> ModelOutput. ``tree_mask`` ([T, T], a tree tier's verify): passed to the target
    forward on every call."""

    def __init__(self, model: torch.nn.Module, cache, with_features: bool, tree_mask: torch.Tensor | None = None):
        self.model, self.cache, self.with_features = model, cache, with_features
        self.options = {} if tree_mask is None else {"tree_mask": tree_mask}

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, key_length: int,
                 features: torch.Tensor | None = None, logits_at: torch.Tensor | None = None) -> ModelOutput:
        options = self.options if logits_at is None else {**self.options, "logits_at": logits_at}
        if self.with_features:
            return self.model(input_ids, features, positions, self.cache, slots, key_length=key_length, **options)
        return self.model(input_ids, positions, self.cache, slots, key_length=key_length, **options)

    def memory_bytes(self) -> int:
        return 0  # the model's weights and cache are shared, nothing is held per stage


@dataclass
class Forwards:
    """How one tier's stages run; every entry has EagerForward's signature."""

    verify: Callable                                         # the target over [x_{m-1}, d_1..d_k]
    draft_steps: dict[int, Callable] = field(default_factory=dict)  # the draft by tokens per request (1; 2)
    draft_extend: Callable | None = None                     # an EAGLE head over the verify's k + 1 tokens, its
                                                             # logits at each request's accepted length only


@dataclass
class DraftStage:
    """Per-tier drafting buffers. The vocabulary-sized ones are views of one buffer sized for the largest tier
    (only one tier runs at a time), so tiers cost no extra memory per vocab row."""

    draft_tokens: torch.Tensor   # [max_batch, k] int64, target ids
    draft_probs: torch.Tensor    # [max_batch, k, V] float32, in target vocabulary (0 outside a token_map)
    draft_noise: torch.Tensor    # [max_batch, k, Vd] float32, Exp(1) draws (1.0 for greedy rows)


@dataclass
class VerifyStage:
    """Per-tier verify buffers."""

    input_ids: torch.Tensor        # [max_batch, k+1] int64: [x_{m-1}, d_1..d_k]
    offsets: torch.Tensor          # [k+1] int64: each verified token's position past m-1 (a chain: 0..k; a
                                   # tree: its depth)
    uniforms: torch.Tensor         # [max_batch, k] float32
    residual_uniforms: torch.Tensor  # [max_batch] float32: the draw where a chain stops


@dataclass
class DraftExtendStage:
    """Per-tier draft-extend buffers."""

    input_ids: torch.Tensor  # [max_batch, k+1] int64: [d_1..d_a, b, stale...]


@dataclass
class TierState:
    """Everything one tier needs: its buffers, its round (on the forwards chosen for it) and, in graph mode for
    small targets, its whole greedy round captured as one graph."""

    speculative_num_steps: int
    speculative_num_draft_tokens: int
    draft: DraftStage
    verify: VerifyStage
    draft_extend: DraftExtendStage
    layout: Any = None           # worker.layout.ChainLayout or TreeLayout: how the verified tokens relate
    round: Any = None            # worker.round.Round over this tier's forwards
    round_graph: Any = None      # specswap.graphs.RoundGraphs of the greedy round, or None

    def buffer_bytes(self) -> int:
        tensors = (self.draft.draft_tokens, self.verify.input_ids, self.verify.uniforms, self.draft_extend.input_ids)
        return sum(t.numel() * t.element_size() for t in tensors)


class TierBuffers:
    """The vocabulary-sized buffers every tier views, and the per-tier ones, built on demand."""

    def __init__(self, max_batch_size: int, max_steps: int, vocab_size: int, draft_vocab_size: int,
                 device: torch.device):
        self.max_batch_size, self.device = max_batch_size, device
        self.draft_probs = torch.zeros(max_batch_size, max_steps, vocab_size, device=device)          # [S, k_max, V]
        self.draft_noise = torch.ones(max_batch_size, max_steps, draft_vocab_size, device=device)     # [S, k_max, Vd]

    def build(self, steps: int, layout) -> TierState:
        """Tier ``steps``'s buffers; ``layout`` (worker.layout) gives the verified tokens' offsets."""
        batch, device = self.max_batch_size, self.device
        draft = DraftStage(draft_tokens=torch.zeros(batch, steps, dtype=torch.long, device=device),
                           draft_probs=self.draft_probs[:, :steps], draft_noise=self.draft_noise[:, :steps])
        verify = VerifyStage(input_ids=torch.zeros(batch, steps + 1, dtype=torch.long, device=device),
                             offsets=layout.offsets,
                             uniforms=torch.zeros(batch, steps, device=device),
                             residual_uniforms=torch.zeros(batch, device=device))
        extend = DraftExtendStage(input_ids=torch.zeros(batch, steps + 1, dtype=torch.long, device=device))
        return TierState(steps, steps + 1, draft, verify, extend, layout)
