"""Standalone drafting: a small model with the target's vocabulary, over the committed tokens themselves.

Its KV is valid through m-3: step 1 feeds the two tokens [x_{m-2}, x_{m-1}] at
m-2, m-1 (rewriting m-2 is harmless), steps 2..k feed d_1..d_{k-1}. After
accepting a the draft holds x_{m-1}, d_1..d_{a-1} at m-1..m+a-2 = m'-3, so no
extra forward is needed when all are accepted: there is no draft-extend.

A tree tier (topk > 1) expands the top-k children of each depth's frontier
(``drafter.expand_tree``): the frontier of depth j sits at m-1+j, its KV
stored from m on as a region of frontier nodes. After acceptance, the KV of
the accepted path's d_1..d_{a-1} is moved from its region places to m..m+a-2,
where a chain would have left it.

At tier 0 it checks one draft step now and then (``ModelDrafter``): after a
catch-up, step 1's forward over [x_{m-2}, x_{m-1}] gives tier 1's law of d_1
(its KV writes at m-2, m-1 are what step 1 would write; the cache stays
valid through m-3 as far as the drafter counts).
"""

from __future__ import annotations

import torch

from specswap.worker.drafter import ModelDrafter, PrefillBatch, expand_tree, sample_draft
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import Forwards, TierStages


class StandaloneDrafter(ModelDrafter):
    lag = 2
    draft_widths = (1, 2)  # step 1 feeds [x_{m-2}, x_{m-1}]

    def __init__(self, draft: torch.nn.Module, target: torch.nn.Module, slots: SlotTable, cache_rows: int,
                 cache_capacity: int, checks: bool = False):
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"standalone draft vocab_size {draft.config.vocab_size} does not match the target's "
                             f"{target.config.vocab_size}")
        super().__init__(draft, draft.make_cache(cache_rows, cache_capacity), slots)
        self.vocab_size = target.config.vocab_size
        self._step_one_offsets = torch.arange(2, device=slots.device)  # [2]: m-2, m-1
        self._node_region: torch.Tensor | None = None  # a tree round's: each node's frontier-region index [B, T-1]
        if checks:  # tier 0 runs: check the draft's drafts there
            self.enable_checks(target.config.vocab_size)

    @classmethod
    def build(cls, context) -> "StandaloneDrafter":
        return cls(context.draft, context.target, context.slots, context.cache_rows, context.cache_capacity,
                   checks=0 in context.tiers)

    def prefill(self, batch: PrefillBatch) -> None:
        super().prefill(batch)
        self.model(batch.input_ids, batch.positions, self.cache, batch.slot_index, key_length=batch.key_length)

    def draft(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, key_length, sampling) -> None:
        steps = tier.speculative_num_steps
        if not steps:
            return
        # step 1: [x_{m-2}, x_{m-1}] at m-2, m-1
        input_ids = torch.stack((self.slots.prev_tokens[slot_index], self.slots.last_tokens[slot_index]),
                                dim=-1)                                                       # [B, 2]
        positions = (seq_lens - 2).unsqueeze(-1) + self._step_one_offsets                    # [B, 2]
        out = forwards.draft_steps[2](input_ids, positions, slot_index, key_length)
        if tier.speculative_eagle_topk > 1:
            self._draft_tree(tier, forwards, slot_index, seq_lens, key_length, out.logits[:, -1])
            return
        deeper = self._checks_deeper(sampling)  # one step past the chain: d_{k+1}, checked, never verified
        for step in range(steps):
            tokens = sample_draft(tier.draft, step, out.logits[:, -1], sampling, None)
            if step + 1 < steps or deeper:
                positions = (seq_lens + step).unsqueeze(-1)  # d_{step+1} sits at m+step
                out = forwards.draft_steps[1](tokens.unsqueeze(-1), positions, slot_index, key_length)
        if deeper:
            self._keep_deep_draft(out.logits[:, -1])

    def _draft_tree(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, key_length, logits) -> None:
        topk = tier.speculative_eagle_topk
        base = seq_lens.unsqueeze(-1)                          # [B, 1] the frontier nodes' region starts at m

        def step(tokens, depth, frontier_parents, region):
            positions = (seq_lens - 1 + depth).unsqueeze(-1).expand(-1, topk)
            forward = forwards.tree_steps.get((topk, depth)) or forwards.tree_steps[None]
            return forward(tokens, positions, slot_index, key_length, tree_mask=(region, base)).logits

        self._node_region = expand_tree(tier, logits, step, None)  # [B, T-1]

    def extend(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, positions, target_hidden,
               accept_lengths, next_tokens, key_length) -> None:
        """A tree tier: the accepted path's d_1..d_{depth-1} KV from its region places to m.. (past d_{a-1} the
        moved entries lie past what the draft holds valid, m' - 3, and are rewritten before being read)."""
        depth = tier.speculative_num_steps
        if tier.speculative_eagle_topk == 1 or depth < 2:
            return
        path = tier.verify.layout.last_paths[:, 1:depth]                                 # [B, depth-1] nodes
        region = self._node_region.gather(1, (path - 1).clamp_min(0)).clamp_min(0)       # [B, depth-1]
        start = seq_lens.unsqueeze(-1)                                                   # [B, 1] m
        self.cache.move(slot_index, start + region, start + torch.arange(depth - 1, device=start.device))

    def _first_draft_logits(self, slots) -> torch.Tensor:
        self.catch_up(slots)  # valid through m-3: step 1 over [x_{m-2}, x_{m-1}] at m-2, m-1
        device = self.slots.device
        lengths = [self.slots.host_seq_lens[slot] for slot in slots]
        input_ids = torch.tensor([self.slots.host_tokens[slot][m - 2:m] for slot, m in zip(slots, lengths)],
                                 device=device)                                                   # [B, 2]
        positions = torch.tensor(lengths, device=device).unsqueeze(-1) - 2 + self._step_one_offsets  # [B, 2]
        out = self.model(input_ids, positions, self.cache, torch.tensor(slots, device=device), key_length=max(lengths),
                         logits_at=torch.ones(len(slots), dtype=torch.long, device=device))
        return out.logits[:, 0]

    def _catch_up_rows(self, slots: list[int], width: int) -> None:
        starts, slot_index, positions = self._catch_up_positions(slots, width)                 # [B], [B, T]
        input_ids = torch.tensor([self.slots.host_tokens[slot][start:start + width]
                                  for slot, start in zip(slots, starts)], device=self.slots.device)  # [B, T]
        self.model(input_ids, positions, self.cache, slot_index, key_length=max(starts) + width,
                   with_logits=False)  # cache only
