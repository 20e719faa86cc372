"""NGRAM drafting: prompt lookup in the request's own tokens (``specswap.prompt_lookup``), no draft model.

Each request's drafts continue the latest earlier match of its last tokens (a
request with no match, in a batch where others have one, repeats its last
token: it costs no extra width). A batch where no request has a match is worth
no verify: the round runs as a plain decode (tier 0). The drafts have no law:
sampled rounds accept them against keyed draws (sampling.accept_keyed).

At tier 0 nothing is verified, so the policy would be blind there; but a
lookup's drafts can be checked against the tokens the request goes on to emit,
for free: every SHADOW_EVERY-th position, the drafts of the largest tier are
looked up and kept, and once the emitted tokens settle them (a mismatch, or
all of them matched) what that tier would have accepted is reported as a
shadow observation (``take_shadow``; the engine feeds it to the controller).
Since a request's text does not depend on its tier (greedy, or keyed draws),
this is exactly what the tier would have accepted.

A tree tier (topk > 1) verifies a trie instead (``prompt_lookup.propose_ngram_tree``):
the lookup's drafts, then what followed other occurrences of the suffix, so
text that branched before (code after ``if``, list items) can accept along
whichever branch it takes now. A request whose trie is short pads it with
copies of its last token under the root.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap.prompt_lookup import NumberTokens, propose_ngram, propose_ngram_tree
from specswap.worker.drafter import Drafter, Shadow
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import TierStages


# positions apart of the lookups tier 0 checks (a lookup costs up to half a millisecond over a long history)
SHADOW_EVERY = 4


class NgramDrafter(Drafter):
    plain_fallback = True  # a batch where no request has a match runs a plain decode
    drafts_trees = True
    def __init__(self, slots: SlotTable, numbers: NumberTokens | None, shadow_steps: int = 0):
        self.slots, self.numbers = slots, numbers
        self.shadow_steps = shadow_steps  # the tier tier-0 rounds check lookups for (0: none)
        # per slot: (position the drafts would continue from, the drafts) not yet settled
        self._pending: list[list[tuple[int, list[int]]]] = [[] for _ in slots.host_tokens]

    @classmethod
    def build(cls, context) -> "NgramDrafter":
        # with tier 0 among the tiers, its rounds check lookups for the largest tier
        return cls(context.slots, context.number_tokens, shadow_steps=context.max_steps if 0 in context.tiers else 0)

    def begin_round(self, tier: TierStages, slots: Sequence[int]) -> bool:
        steps = tier.speculative_num_steps
        if not steps:
            self._look_up_shadow(slots)
            return True
        host_tokens = self.slots.host_tokens
        if tier.speculative_eagle_topk > 1:
            return self._trie(tier, slots)
        proposals = [propose_ngram(host_tokens[slot], steps, numbers=self.numbers) for slot in slots]
        if not any(proposals):
            return False
        rows = [proposal or [host_tokens[slot][-1]] * steps for proposal, slot in zip(proposals, slots)]
        tier.draft.draft_tokens[:len(slots)].copy_(torch.tensor(rows, dtype=torch.long))  # [B, k]
        return True

    def _trie(self, tier: TierStages, slots: Sequence[int]) -> bool:
        depth, topk, nodes = tier.shape
        tries = [propose_ngram_tree(self.slots.host_tokens[slot], depth, topk, nodes - 1, numbers=self.numbers)
                 for slot in slots]
        if not any(tokens for tokens, _ in tries):
            return False
        rows, parents = [], []
        for (tokens, row_parents), slot in zip(tries, slots):
            pad = nodes - 1 - len(tokens)
            rows.append(tokens + [self.slots.host_tokens[slot][-1]] * pad)
            parents.append([0] + row_parents + [0] * pad)
        batch = len(slots)
        tier.draft.draft_tokens[:batch].copy_(torch.tensor(rows, dtype=torch.long))          # [B, T-1]
        tier.verify.layout.parents[:batch].copy_(torch.tensor(parents, dtype=torch.long))    # [B, T]
        return True

    def _look_up_shadow(self, slots: Sequence[int]) -> None:
        if not self.shadow_steps:
            return
        for slot in slots:
            tokens = self.slots.host_tokens[slot]
            if len(tokens) % SHADOW_EVERY:
                continue
            proposal = propose_ngram(tokens, self.shadow_steps, numbers=self.numbers)
            if proposal:
                self._pending[slot].append((len(tokens), proposal))

    def take_shadow(self, slots: Sequence[int], drafting: bool) -> Shadow | None:
        """What the checked lookups of these requests would have accepted, for those the emitted tokens
        settled since the last call; a round that drafted (``drafting``) drops them instead (it was observed)."""
        settled = []
        for slot in slots:
            pending = self._pending[slot]
            if drafting:
                pending.clear()
                continue
            tokens = self.slots.host_tokens[slot]
            keep = []
            for start, proposal in pending:
                emitted = tokens[start:start + len(proposal)]
                accepted = next((i for i, (d, t) in enumerate(zip(proposal, emitted)) if d != t), len(emitted))
                if accepted < len(emitted) or len(emitted) == len(proposal):
                    settled.append(accepted)
                else:
                    keep.append((start, proposal))
            self._pending[slot] = keep
        return Shadow(settled, self.shadow_steps) if settled else None

    def release(self, slot: int) -> None:
        self._pending[slot].clear()
