"""The round driver: one decode round of one tier on tensors, the reference algorithm in one screen.

Draft k tokens per request, verify [x_{m-1}, d_1..d_k] in one target forward,
accept the longest lossless prefix a and a correction/bonus token b (the
tier's layout: a chain, or a tree whose accepted path it lays out as a
chain), extend the draft over what was accepted, commit m += a + 1. A greedy
round never syncs with the host, and nothing here depends on the algorithm,
the layout or the execution mode: the drafter
(``worker.drafter.Drafter``) does its part through the tier's ``Forwards``
(eager models or stage graphs), so the same ``Round`` is what a round graph
records and what eager mode runs.
"""

from __future__ import annotations

import torch

from specswap.sampling import PlainRows, RoundSampling, Verifier, take_plain_tokens
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import Forwards, TierStages


class Round:
    """``round(slot_index [B], key_length, sampling, plain) -> (accept_lengths [B], next_tokens [B])`` for one tier.

    ``sampling``: None for an all-greedy batch, else the round's settings and draws (sampling.RoundSampling).
    ``plain``: the requests with speculation off (sampling.PlainRows), or None. ``key_length`` exceeds every
    position the round writes.
    """

    def __init__(self, tier: TierStages, slots: SlotTable, drafter, forwards: Forwards, verifier: Verifier):
        self.tier, self.slots, self.drafter, self.forwards, self.verifier = tier, slots, drafter, forwards, verifier

    def __call__(self, slot_index: torch.Tensor, key_length: int, sampling: RoundSampling | None = None,
                 plain: PlainRows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        tier, slots, forwards = self.tier, self.slots, self.forwards
        batch = slot_index.shape[0]
        seq_lens = slots.seq_lens[slot_index]                               # [B] m
        draft_tokens = tier.draft.draft_tokens[:batch]                      # [B, k]
        self.drafter.draft(tier, forwards, slot_index, seq_lens, key_length, sampling)
        layout = tier.verify.layout
        layout.prepare(batch)  # a tree drafter's tree of this round: its depths and mask

        # verify: [x_{m-1}, d_1..d_k] at positions m-1 + offsets (a tree's nodes: m-1 + depth)
        verify_ids = tier.verify.input_ids[:batch]                          # [B, k+1]
        verify_ids[:, 0] = slots.last_tokens[slot_index]
        verify_ids[:, 1:] = draft_tokens
        positions = (seq_lens - 1).unsqueeze(-1) + layout.offsets_for(batch)  # [B, k+1]
        out = forwards.verify(verify_ids, positions, slot_index, key_length, tree_mask=layout.mask_for(batch))

        # accept; from here on the accepted tokens are a chain (a tree's path laid out as one)
        accept_lengths, next_tokens, positions, hidden = layout.accept(
            self.verifier, out, verify_ids, draft_tokens, positions, slot_index, sampling)  # [B], [B], ...
        if plain is not None:  # requests with speculation off take the target's own token after x_{m-1}: a = 0
            take_plain_tokens(plain, out.logits, accept_lengths, next_tokens)
        if sampling is not None and not tier.speculative_num_steps:  # a sampled tier-0 round: shadow checks' law
            self.drafter.observe_plain_round(slot_index, out.logits, next_tokens, sampling)
        self.drafter.extend(tier, forwards, slot_index, seq_lens, positions, hidden, accept_lengths,
                            next_tokens, key_length)

        # commit: m += a + 1; the rejected tail is forgotten, not erased
        slots.seq_lens[slot_index] = seq_lens + accept_lengths + 1
        slots.prev_tokens[slot_index] = verify_ids.gather(1, accept_lengths.unsqueeze(-1)).squeeze(-1)
        slots.last_tokens[slot_index] = next_tokens
        return accept_lengths, next_tokens
