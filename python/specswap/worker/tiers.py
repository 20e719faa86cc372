"""A tier's buffers and how its stages run.

A tier k (speculative_num_steps) drafts k tokens and verifies its layout's
``num_draft_tokens`` (a chain: k + 1). Its stages are built once, at start-up,
and the worker's C++ state pool holds them with the round that runs them. ``Forwards`` is the tier's execution mode, chosen
once when the tier is built: each stage either calls its model directly
(``EagerForward``) or replays that stage's graphs (``specswap.graphs.StageGraphs``);
both take the same arguments, so the round itself never asks which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from specswap._core import tier_key
from specswap.tier import Tier

if TYPE_CHECKING:  # the models arrive as objects; the worker imports none of them
    from specswap.models import ModelOutput


class EagerForward:
    """A model forward called directly, with StageGraphs' signature: (input_ids [B, T], positions [B, T],
    slots [B], key_length, features [B, T, H] for an EAGLE head, logits_at [B]: the logits at that position of
    each row only, [B, 1, V], tree_mask: a tree tier's [B, T, T] verify mask, or a tree drafter's (mask [B, T,
    R], base [B, 1]) region, models.layers.TreeRegion) -> ModelOutput."""

    def __init__(self, model: torch.nn.Module, cache, with_features: bool):
        self.model, self.cache, self.with_features = model, cache, with_features

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, key_length: int,
                 features: torch.Tensor | None = None, logits_at: torch.Tensor | None = None,
                 tree_mask=None) -> ModelOutput:
        options = {}
        if logits_at is not None:
            options["logits_at"] = logits_at
        if tree_mask is not None:
            options["tree_mask"] = tree_mask
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
    # a tree drafter's frontier steps by (topk, depth): topk tokens per request over a region of topk * depth
    # nodes (eager: one forward for every shape, under key None)
    tree_steps: dict[tuple[int, int] | None, Callable] = field(default_factory=dict)
    draft_extend: Callable | None = None                     # an EAGLE head over the verify's k + 1 tokens, its
                                                             # logits at each request's accepted length only


@dataclass
class DraftStage:
    """Per-tier drafting buffers. The vocabulary-sized ones are views of one buffer sized for the largest tier
    (only one tier runs at a time), so tiers cost no extra memory per vocab row."""

    draft_tokens: torch.Tensor   # [max_batch, k] int64, target ids (a tree tier: its nodes, [max_batch, T - 1])
    draft_probs: torch.Tensor    # [max_batch, k, V] float32, in target vocabulary (0 outside a token_map)
    draft_noise: torch.Tensor    # [max_batch, k, Vd] float32, Exp(1) draws (1.0 for greedy rows)


@dataclass
class VerifyStage:
    """Per-tier verify buffers, and how the verified tokens relate (``worker.layout``: a chain or a tree)."""

    input_ids: torch.Tensor        # [max_batch, T] int64: [x_{m-1}, d_1..d_{T-1}]
    offsets: torch.Tensor          # [T] int64: each verified token's position past m-1 (a chain: 0..k; a
                                   # tree: its depth)
    uniforms: torch.Tensor         # [max_batch, k] float32 (a tree tier: one per node, the tries down its tree)
    residual_uniforms: torch.Tensor  # [max_batch] float32: the draw where a chain stops
    layout: Any = None             # worker.layout.ChainLayout or TreeLayout


@dataclass
class DraftExtendStage:
    """Per-tier draft-extend buffers."""

    input_ids: torch.Tensor  # [max_batch, k+1] int64: [d_1..d_a, b, stale...] (the accepted path is a chain)


@dataclass
class TierStages:
    """One tier's stages, what its drafter and round driver read: its shape and buffers. The C++ state pool
    holds them (``SpecRuntimeState``), with the round that runs them (``TierRound``)."""

    speculative_num_steps: int         # draft depth (a chain: its drafts)
    speculative_num_draft_tokens: int  # verified tokens: x_{m-1} and the draft nodes (the layout's width)
    draft: DraftStage
    verify: VerifyStage
    draft_extend: DraftExtendStage
    speculative_eagle_topk: int = 1    # children per expanded node (1: a chain, or a drafter's fixed tree)
    key: int = -1                      # its key in the state pool and the policy (_core.tier_key: a chain's steps)
    tier: Tier = field(init=False)     # the shape as one value (``RoundResult.tier`` and ``.ran``), made once

    def __post_init__(self):
        self.tier = Tier(self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens), as SGLang names a tier."""
        return self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens

    @property
    def writes_past(self) -> int:
        """How far past m - 1 the round writes a cache: a chain's k drafts, a tree's nodes in the target's
        cache, the frontier nodes (topk per depth) a tree drafter stores in its own."""
        trees = self.speculative_num_steps * self.speculative_eagle_topk if self.speculative_eagle_topk > 1 else 0
        return max(self.speculative_num_steps, self.speculative_num_draft_tokens - 1, trees)

    def buffer_bytes(self) -> int:
        tensors = (self.draft.draft_tokens, self.verify.input_ids, self.verify.uniforms, self.draft_extend.input_ids)
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class TierRound:
    """What runs a tier's round: the driver over its stages (``worker.round.Round``, on the forwards chosen for
    the tier: eager or stage graphs) and, in graph mode for small targets, its whole greedy round captured as
    one graph (``specswap.graphs.RoundGraphs``) per drafter of ``Drafter.round_graph_drafters``."""

    stages: TierStages
    run: Any                # worker.round.Round
    graphs: tuple = ()      # specswap.graphs.RoundGraphs, one per round_graph_drafters() (none: stage path only)

    def memory_bytes(self) -> int:
        """Bytes its buffers and graph runners hold beyond the shared weights and caches."""
        forwards = self.run.forwards
        graphs = (forwards.verify, forwards.draft_extend, *self.graphs)
        return self.stages.buffer_bytes() + sum(g.memory_bytes() for g in graphs if g is not None)


class TierBuffers:
    """The vocabulary-sized buffers every tier views, and the per-tier ones, built on demand.

    The shared ones are flat, and tier k views their first S * k rows as its own contiguous [S, k, V]: a batch's
    rows [:B] are then contiguous too, where a [:, :k] slice of one [S, k_max, V] buffer was not, and the
    sampled accept (``accept_from_logits``) copied it every round (2 MB a round at batch 2 on Gemma's 262k
    vocabulary: adaptive EAGLE pinned at tier 1 ran 1.8% slower than static 1 in sampled prose). Tiers alias:
    only one runs a round, and a round writes every cell it reads (columns outside a token_map stay 0 in all)."""

    def __init__(self, max_batch_size: int, max_steps: int, vocab_size: int, draft_vocab_size: int,
                 device: torch.device):
        self.max_batch_size, self.device = max_batch_size, device
        self.vocab_size, self.draft_vocab_size = vocab_size, draft_vocab_size
        self.draft_probs = torch.zeros(max_batch_size * max_steps * vocab_size, device=device)        # S * k_max * V
        self.draft_noise = torch.ones(max_batch_size * max_steps * draft_vocab_size, device=device)   # S * k_max * Vd

    def _view(self, flat: torch.Tensor, steps: int, width: int) -> torch.Tensor:
        return flat[:self.max_batch_size * steps * width].view(self.max_batch_size, steps, width)

    def build(self, steps: int, layout, topk: int = 1) -> TierStages:
        """Tier ``steps``'s buffers; ``layout`` (worker.layout) gives the verified tokens' count and offsets."""
        batch, device, width = self.max_batch_size, self.device, layout.num_draft_tokens
        draft = DraftStage(draft_tokens=torch.zeros(batch, width - 1, dtype=torch.long, device=device),
                           draft_probs=self._view(self.draft_probs, steps, self.vocab_size),
                           draft_noise=self._view(self.draft_noise, steps, self.draft_vocab_size))
        verify = VerifyStage(input_ids=torch.zeros(batch, width, dtype=torch.long, device=device),
                             offsets=layout.offsets_for(batch), uniforms=torch.zeros(batch, width - 1, device=device),
                             residual_uniforms=torch.zeros(batch, device=device), layout=layout)
        extend = DraftExtendStage(input_ids=torch.zeros(batch, steps + 1, dtype=torch.long, device=device))
        key = tier_key(steps, topk, width)
        return TierStages(steps, width, draft, verify, extend, topk, key)
