"""Captured forwards for the worker's stages, on the C++ graph runners of ``specswap._C``.

A stage of a tier (draft, verify, draft-extend) runs one model forward with a
fixed number of tokens per request. ``StageGraphs`` captures that forward once
per (batch bucket, key-length bucket) at start-up into a ``GraphRunner`` with
persistent input/output buffers; at run time a call copies its inputs into the
smallest bucket that fits, pads the rest with a scratch cache row, and replays.

On the CPU a runner records the dispatcher-level operators of the forward and
replays them from C++ (same kernels, so the output is bit-identical to eager at
the same key length); on CUDA and Ascend NPU it is a device graph. Weights and
KV caches are shared by every runner (never copied), and capturing happens only
here: ``specswap._C.graph_capture_count()`` does not move after start-up.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import torch

from specswap._core import _C
from specswap.models import ModelOutput

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8)
SMALLEST_KEY_BUCKET = 64


def key_buckets(capacity: int, smallest: int = SMALLEST_KEY_BUCKET) -> tuple[int, ...]:
    """Key lengths graphs are captured for: powers of two from ``smallest``, ending at the cache capacity.

    Attention reads keys [0, key_length), so a short request replays a short graph.
    """
    buckets = []
    length = smallest
    while length < capacity:
        buckets.append(length)
        length *= 2
    buckets.append(capacity)
    return tuple(buckets)


def batch_buckets(max_batch_size: int, candidates: Sequence[int] = DEFAULT_BATCH_BUCKETS) -> tuple[int, ...]:
    """Batch buckets up to ``max_batch_size`` (which is always one)."""
    return tuple(sorted({b for b in candidates if b < max_batch_size} | {max_batch_size}))


class GraphContext:
    """What every StageGraphs of one worker shares: the pool, the buckets and the scratch cache row."""

    def __init__(self, device: torch.device, max_batch_size: int, cache_capacity: int,
                 batch_bucket_sizes: Sequence[int] = DEFAULT_BATCH_BUCKETS):
        self.pool = _C.GraphPool(torch.device(device))
        self.batch_buckets = batch_buckets(max_batch_size, batch_bucket_sizes)
        self.key_buckets = key_buckets(cache_capacity)
        self.scratch_slot = max_batch_size  # caches have one extra row that padded batch rows write into

    def share(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            self.pool.share(tensor)

    def share_model(self, model: torch.nn.Module, cache) -> None:
        """Mark weights and KV buffers as shared so no runner reports them as its own memory: parameters,
        buffers, and plain tensor attributes such as an EAGLE head's gathered draft LM-head rows."""
        attributes = [value for module in model.modules() for value in vars(module).values()
                      if isinstance(value, torch.Tensor)]
        self.share(*model.parameters(), *model.buffers(), *attributes, *cache.keys, *cache.values,
                   cache.key_positions)


class _BucketedGraphs:
    """Runners of one stage of one tier, one per (batch bucket, key bucket) with key bucket >= ``num_tokens``;
    a subclass captures one runner (``_capture_one``) and replays it."""

    def __init__(self, context: GraphContext, stage: str, speculative_num_steps: int, num_tokens: int):
        self.context = context
        self.stage = stage
        self.speculative_num_steps = speculative_num_steps
        self.num_tokens = num_tokens
        self.runners: dict[tuple[int, int], _C.GraphRunner] = {}
        # the runners' persistent buffers by name, looked up once here instead of on every replay
        self.buffers: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def capture(self) -> None:
        """Capture every (batch bucket, key bucket) once."""
        for batch in self.context.batch_buckets:
            for key_length in self.context.key_buckets:
                if key_length < self.num_tokens:
                    continue
                runner = self._capture_one(batch, key_length)
                self.runners[(batch, key_length)] = runner
                self.buffers[(batch, key_length)] = {name: runner.buffer(name) for name in runner.buffer_names()}

    def _capture_one(self, batch: int, key_length: int) -> _C.GraphRunner:
        raise NotImplementedError

    def runner_for(self, batch: int, key_length: int) -> tuple[int, int]:
        """The (batch bucket, key bucket) that serves ``batch`` requests reading ``key_length`` keys."""
        batches, keys = self.context.batch_buckets, self.context.key_buckets
        b = bisect.bisect_left(batches, batch)
        k = bisect.bisect_left(keys, max(key_length, self.num_tokens))
        if b == len(batches) or k == len(keys):
            raise ValueError(f"{self.stage} graphs cover batch <= {batches[-1]} and key_length <= {keys[-1]}; "
                             f"got batch {batch}, key_length {key_length}")
        return batches[b], keys[k]

    def memory_bytes(self) -> int:
        return sum(runner.memory_bytes() for runner in self.runners.values())


class StageGraphs(_BucketedGraphs):
    """One stage of one tier: a model forward over ``num_tokens`` tokens per request, captured per bucket.
    ``logits_at``: the forward computes the logits at one position per request (a replay's ``logits_at`` [B]),
    [B, 1, V], as an EAGLE head's draft-extend needs them at the accepted length only. ``feature_size``: the
    width of the features a head stage reads (default H)."""

    def __init__(self, context: GraphContext, stage: str, speculative_num_steps: int, model: torch.nn.Module,
                 cache, num_tokens: int, with_features: bool, tree_nodes: int | None = None,
                 tree_base: bool = False, logits_at: bool = False, feature_size: int | None = None):
        super().__init__(context, stage, speculative_num_steps, num_tokens)
        self.model = model
        self.logits_at = logits_at
        # a tree tier's verify (tree_nodes = T: a replay's tree_mask [B, T, T]) or a tree drafter's frontier step
        # (tree_base: a replay's (mask [B, T, R], base [B, 1]) region of R = tree_nodes nodes)
        self.tree_nodes, self.tree_base = tree_nodes, tree_base
        self.cache = cache
        self.with_features = with_features
        # the features' width (an EAGLE-3 head's draft-extend reads the target's fused 3H; default H)
        self.feature_size = feature_size or model.config.hidden_size
        self.device = cache.keys[0].device
        self.dtype = next(model.parameters()).dtype
        self._offsets = torch.arange(num_tokens, device=self.device)

    @torch.inference_mode()
    def _capture_one(self, batch: int, key_length: int) -> _C.GraphRunner:
        model, device, tokens, dtype = self.model, self.device, self.num_tokens, self.dtype
        runner = _C.GraphRunner(self.stage, self.speculative_num_steps, batch, self.context.pool)
        input_ids = torch.zeros(batch, tokens, dtype=torch.long, device=device)          # [b, T]
        positions = self._offsets.expand(batch, -1).clone()                               # [b, T]
        slots = torch.full((batch,), self.context.scratch_slot, dtype=torch.long, device=device)  # [b]
        # the output's hidden: a target returning auxiliary hidden states (EAGLE-3) is wider than H
        hidden_size = getattr(model, "feature_size", None) or model.config.hidden_size
        logits_width = self._logits_width()
        logits = torch.zeros(batch, 1 if self.logits_at else tokens, logits_width, dtype=dtype,
                             device=device)                                            # [b, T or 1, V]
        hidden = torch.zeros(batch, tokens, hidden_size, dtype=dtype, device=device)   # [b, T, H]
        for name, tensor in (("input_ids", input_ids), ("positions", positions), ("slots", slots),
                             ("logits", logits), ("hidden", hidden)):
            runner.set_buffer(name, tensor)
        options = {}
        if self.tree_nodes is not None:  # padded rows: each token sees itself (its region's last nodes)
            nodes = self.tree_nodes
            tree_mask = torch.zeros(batch, tokens, nodes, dtype=torch.bool, device=device)    # [b, T, R]
            tree_mask[:, torch.arange(tokens), nodes - tokens + torch.arange(tokens)] = True
            runner.set_buffer("tree_mask", tree_mask)
            options["tree_mask"] = tree_mask
            if self.tree_base:
                base = torch.zeros(batch, 1, dtype=torch.long, device=device)                  # [b, 1]
                runner.set_buffer("tree_base", base)
                options["tree_mask"] = (tree_mask, base)
        if self.logits_at:
            options["logits_at"] = torch.zeros(batch, dtype=torch.long, device=device)  # [b]
            runner.set_buffer("logits_at", options["logits_at"])
        if self.with_features:
            features = torch.zeros(batch, tokens, self.feature_size, dtype=dtype, device=device)
            runner.set_buffer("features", features)

            def body():
                out = model(input_ids, features, positions, self.cache, slots, key_length=key_length, **options)
                logits.copy_(out.logits)
                hidden.copy_(out.hidden)
        else:
            def body():
                out = model(input_ids, positions, self.cache, slots, key_length=key_length, **options)
                logits.copy_(out.logits)
                hidden.copy_(out.hidden)
        runner.capture(body)
        return runner

    def _logits_width(self) -> int:
        token_map = getattr(self.model, "token_map", None)
        if token_map is not None:
            return token_map.numel()
        config = self.model.config
        return getattr(config, "draft_vocab_size", None) or config.vocab_size  # an EAGLE head's config has no vocab_size

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, key_length: int,
                 features: torch.Tensor | None = None, logits_at: torch.Tensor | None = None,
                 tree_mask=None) -> ModelOutput:
        """Replay the forward for these inputs; returns views of the runner's outputs (valid until its next replay)."""
        # input_ids, positions: [B, T]; slots: [B]; features: [B, T, H] (EAGLE head); logits_at: [B]
        if (tree_mask is not None) != (self.tree_nodes is not None):
            raise ValueError(f"{self.stage} graphs were captured {'with' if self.tree_nodes else 'without'} a tree "
                             f"mask; a replay must {'pass' if self.tree_nodes else 'not pass'} one")
        if (logits_at is not None) != self.logits_at:
            raise ValueError(f"{self.stage} graphs were captured {'with' if self.logits_at else 'without'} "
                             f"logits_at; a replay must {'pass' if self.logits_at else 'not pass'} it")
        batch = input_ids.shape[0]
        key = self.runner_for(batch, key_length)
        runner, buffers = self.runners[key], self.buffers[key]
        rows = buffers
        if runner.bucket > batch:
            # padded rows write only the scratch cache row, at positions inside the key bucket
            buffers["slots"][batch:].fill_(self.context.scratch_slot)
            buffers["positions"][batch:].copy_(self._offsets)
            if self.logits_at:
                buffers["logits_at"][batch:].zero_()
            rows = {name: buffer[:batch] for name, buffer in buffers.items()}
        # (a full bucket needs no slicing, which costs about as much as the copy itself)
        rows["input_ids"].copy_(input_ids)
        rows["positions"].copy_(positions)
        rows["slots"].copy_(slots)
        if features is not None:
            rows["features"].copy_(features)
        if logits_at is not None:
            rows["logits_at"].copy_(logits_at)
        if tree_mask is not None:
            if self.tree_base:
                tree_mask, base = tree_mask
                rows["tree_base"].copy_(base)
            rows["tree_mask"].copy_(tree_mask)
        runner.replay()
        return ModelOutput(logits=rows["logits"], hidden=rows["hidden"])


class RoundGraphs(_BucketedGraphs):
    """A whole greedy decode round of one tier, captured per (batch bucket, key-length bucket).

    ``body(slot_index, key_length) -> (accept_lengths, next_tokens)`` is the tier's greedy round on tensors with
    the models called directly (``specswap.worker.round.Round`` over eager forwards: drafts, verify,
    acceptance, draft-extend, commit); recorded once per bucket, it
    replays as one tape, so the Python and dispatch between the stages' kernels (a tenth of a round on the
    tiny pair) is gone too. Only the slot list changes between replays; everything else the round reads
    (tokens, lengths, the head's last output) lives in the worker's per-slot tensors, which the tape holds by
    reference. Padded rows run on the scratch slot, whose committed length is reset to 1 before each replay so
    its writes stay inside the bucket. Sampling rounds keep to the stage graphs (their random draws are
    drawn per request on the host).
    """

    def __init__(self, context: GraphContext, stages, body, seq_lens: torch.Tensor, target=None):
        # the verify (the tier's speculative_num_draft_tokens) is the widest read of the round
        super().__init__(context, "round", stages.speculative_num_steps, stages.speculative_num_draft_tokens)
        self.body = body
        self.seq_lens = seq_lens  # the worker's [S + 1] committed lengths (row S: scratch)
        self.device = seq_lens.device
        # the target's heads that answer greedy readers with less (``greedy_only``: a tensor-parallel LM head
        # gathers each shard's argmax, not the row): a greedy round records that form
        self.greedy_heads = [m for m in (target.modules() if target is not None else ()) if hasattr(m, "greedy_only")]

    @torch.inference_mode()
    def _capture_one(self, batch: int, key_length: int) -> _C.GraphRunner:
        runner = _C.GraphRunner(self.stage, self.speculative_num_steps, batch, self.context.pool)
        long = dict(dtype=torch.long, device=self.device)
        slots = torch.full((batch,), self.context.scratch_slot, **long)
        accept_lengths, next_tokens = torch.zeros(batch, **long), torch.zeros(batch, **long)
        for name, tensor in (("slots", slots), ("accept_lengths", accept_lengths), ("next_tokens", next_tokens)):
            runner.set_buffer(name, tensor)

        def body():
            accepted, following = self.body(slots, key_length)
            accept_lengths.copy_(accepted)
            next_tokens.copy_(following)

        self.seq_lens[self.context.scratch_slot] = 1
        for head in self.greedy_heads:
            head.greedy_only = True
        try:
            runner.capture(body)
        finally:
            for head in self.greedy_heads:
                head.greedy_only = False
        return runner

    def __call__(self, slots: Sequence[int], key_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the round for these cache rows; returns views (accept_lengths [B], next_tokens [B]) valid until
        the next replay of the same bucket."""
        batch = len(slots)
        key = self.runner_for(batch, key_length)
        buffers = self.buffers[key]
        if key[0] > batch:
            buffers["slots"][batch:].fill_(self.context.scratch_slot)
            self.seq_lens[self.context.scratch_slot] = 1
        buffers["slots"][:batch] = torch.tensor(slots, dtype=torch.long)
        self.runners[key].replay()
        return buffers["accept_lengths"][:batch], buffers["next_tokens"][:batch]


def capture_count() -> int:
    """Graph captures so far in this process (all backends)."""
    return _C.graph_capture_count()
