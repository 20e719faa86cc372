"""Standalone drafting: a small model with the target's vocabulary, over the committed tokens themselves.

Its KV is valid through m-3: step 1 feeds the two tokens [x_{m-2}, x_{m-1}] at
m-2, m-1 (rewriting m-2 is harmless), steps 2..k feed d_1..d_{k-1}. After
accepting a the draft holds x_{m-1}, d_1..d_{a-1} at m-1..m+a-2 = m'-3, so no
extra forward is needed when all are accepted: there is no draft-extend.
"""

from __future__ import annotations

import torch

from specswap.worker.drafter import ModelDrafter, PrefillBatch, sample_draft
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import Forwards, TierStages


class StandaloneDrafter(ModelDrafter):
    lag = 2
    draft_widths = (1, 2)  # step 1 feeds [x_{m-2}, x_{m-1}]

    def __init__(self, draft: torch.nn.Module, target: torch.nn.Module, slots: SlotTable, cache_rows: int,
                 cache_capacity: int):
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"standalone draft vocab_size {draft.config.vocab_size} does not match the target's "
                             f"{target.config.vocab_size}")
        super().__init__(draft, draft.make_cache(cache_rows, cache_capacity), slots)
        self.vocab_size = target.config.vocab_size
        self._step_one_offsets = torch.arange(2, device=slots.device)  # [2]: m-2, m-1

    @classmethod
    def build(cls, context) -> "StandaloneDrafter":
        return cls(context.draft, context.target, context.slots, context.cache_rows, context.cache_capacity)

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
        for step in range(steps):
            tokens = sample_draft(tier.draft, step, out.logits[:, -1], sampling, None)
            if step + 1 < steps:
                positions = (seq_lens + step).unsqueeze(-1)  # d_{step+1} sits at m+step
                out = forwards.draft_steps[1](tokens.unsqueeze(-1), positions, slot_index, key_length)

    def _catch_up_one(self, slot, slot_index, positions, start, end) -> None:
        tokens = self.slots.host_tokens[slot]
        input_ids = torch.tensor([tokens[start:end]], device=self.slots.device)  # [1, T]
        self.model(input_ids, positions, self.cache, slot_index, key_length=end, with_logits=False)  # cache only
