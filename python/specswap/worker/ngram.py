"""NGRAM drafting: prompt lookup in the request's own tokens (``specswap.ngram``), no draft model.

Each request's drafts continue the latest earlier match of its last tokens (a
request with no match, in a batch where others have one, repeats its last
token: it costs no extra width). A batch where no request has a match is worth
no verify: the round runs as a plain decode (tier 0). The drafts have no law:
sampled rounds accept them against keyed draws (sampling.accept_keyed).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap.ngram import NumberTokens, propose_ngram
from specswap.worker.drafter import Drafter
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import TierState


class NgramDrafter(Drafter):
    def __init__(self, slots: SlotTable, numbers: NumberTokens | None):
        self.slots, self.numbers = slots, numbers

    def begin_round(self, tier: TierState, slots: Sequence[int]) -> bool:
        steps = tier.speculative_num_steps
        if not steps:
            return True
        host_tokens = self.slots.host_tokens
        proposals = [propose_ngram(host_tokens[slot], steps, numbers=self.numbers) for slot in slots]
        if not any(proposals):
            return False
        rows = [proposal or [host_tokens[slot][-1]] * steps for proposal, slot in zip(proposals, slots)]
        tier.draft.draft_tokens[:len(slots)].copy_(torch.tensor(rows, dtype=torch.long))  # [B, k]
        return True
