"""NGRAM drafting: prompt lookup in the request's own tokens (``specswap.prompt_lookup``), no draft model.

Each request's drafts continue the latest earlier match of its last tokens (a
request with no match, in a batch where others have one, repeats its last
token: it costs no extra width). A batch where no request has a match is worth
no verify: the round runs as a plain decode (tier 0). The drafts have no law:
sampled rounds accept them against keyed draws (sampling.accept_keyed).

At tier 0 nothing is verified, so the policy would be blind there; but a
lookup's drafts can be checked against the tokens the request goes on to emit,
for free: every SHADOW_EVERY-th tier-0 round, the drafts of the largest tier
are looked up for every request of the batch and kept, and once the emitted
tokens settle them (a mismatch, or all of them matched) what that tier would
have accepted is reported as a shadow observation (``take_shadow``; the engine
feeds it to the controller). Since a request's text does not depend on its
tier (greedy, or keyed draws), this is what the tier would have accepted, and
the round is checked as that tier would have run it: where no request has a
lookup it would have run a plain decode (nothing observed), and a request
without one beside a request with one would have verified a padded row that
accepts nothing (observed as 0).

A tree tier (topk > 1) verifies a trie instead (``prompt_lookup.propose_ngram_tree``):
the lookup's drafts, then what followed other occurrences of the suffix, so
text that branched before (code after ``if``, list items) can accept along
whichever branch it takes now. A request whose trie is short pads it with
copies of its last token under the root.

Under tensor parallelism (``lookup_on_leader``) the group's first rank looks
up and broadcasts each drafting round's drafts (a trie's parents with them,
and whether any request matched) in one collective; the other ranks look up
nothing, not even tier 0's checks (the agreement hears the leader's).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap.prompt_lookup import NgramIndex, NumberTokens, lookup_ngram, propose_ngram_tree
from specswap.worker.drafter import Drafter, Shadow
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import TierStages


# tier-0 rounds apart of the lookups checked
SHADOW_EVERY = 4


class NgramDrafter(Drafter):
    plain_fallback = True  # a batch where no request has a match runs a plain decode
    drafts_trees = True
    def __init__(self, slots: SlotTable, numbers: NumberTokens | None, shadow_steps: int = 0):
        self.slots, self.numbers = slots, numbers
        self.shadow_steps = shadow_steps  # the tier tier-0 rounds check lookups for (0: none)
        # per slot: (position the drafts would continue from, the drafts) not yet settled
        self._pending: list[list[tuple[int, list[int]]]] = [[] for _ in slots.host_tokens]
        self._tier0_rounds = 0  # tier-0 rounds so far: every SHADOW_EVERY-th is checked, the first included
        self._indexes = [NgramIndex() for _ in slots.host_tokens]  # per slot: where its n-grams end
        self._broadcast = None  # tensor parallelism: the leader's drafts to every rank (``lookup_on_leader``)
        self._follower = False
        self._packets: dict[tuple[int, int, int], torch.Tensor] = {}  # per tier shape: found, drafts, parents

    def lookup_on_leader(self, broadcast, leader: bool) -> None:
        """Tensor parallelism: ``broadcast(tensor)`` (in place, from the group's first rank) carries the leader's
        lookups to the others, which (``leader`` False) look up nothing themselves."""
        self._broadcast, self._follower = broadcast, not leader
        if self._follower:
            self.shadow_steps = 0

    @classmethod
    def build(cls, context) -> "NgramDrafter":
        # with tier 0 among the tiers, its rounds check lookups for the largest tier
        return cls(context.slots, context.number_tokens, shadow_steps=context.max_steps if 0 in context.tiers else 0)

    def begin_round(self, tier: TierStages, slots: Sequence[int]) -> bool:
        steps = tier.speculative_num_steps
        if not steps:
            self._look_up_shadow(slots)
            return True
        if self._follower:
            return self._receive(tier, len(slots))
        found = self._trie(tier, slots) if tier.speculative_eagle_topk > 1 else self._chain(tier, slots)
        if self._broadcast is not None:
            self._send(tier, len(slots), found)
        return found

    # ---- the lookups (``worker.suffix.SuffixDrafter`` replaces these two and keeps the rest) ----

    def propose(self, slot: int, steps: int) -> list[int]:
        """The slot's chain of exactly ``steps`` drafts, or [] where nothing is worth verifying."""
        return self.lookup(slot, steps)[0]

    def lookup(self, slot: int, steps: int) -> tuple[list[int], int]:
        """``propose``'s chain and the length of the match it continues (([], 0): none)."""
        return lookup_ngram(self.slots.host_tokens[slot], steps, numbers=self.numbers, index=self._indexes[slot])

    def propose_tree(self, slot: int, depth: int, topk: int, max_nodes: int) -> tuple[list[int], list[int]]:
        """The slot's draft tree (node tokens, parents; nodes numbered from 1, 0 the root, a node's children
        best first), at most ``depth`` deep, ``topk`` children a node, ``max_nodes`` nodes; ([], []): none."""
        return propose_ngram_tree(self.slots.host_tokens[slot], depth, topk, max_nodes, numbers=self.numbers,
                                  index=self._indexes[slot])

    def _chain(self, tier: TierStages, slots: Sequence[int]) -> bool:
        steps, host_tokens = tier.speculative_num_steps, self.slots.host_tokens
        proposals = [self.propose(slot, steps) for slot in slots]
        if not any(proposals):
            return False
        rows = [proposal or [host_tokens[slot][-1]] * steps for proposal, slot in zip(proposals, slots)]
        tier.draft.draft_tokens[:len(slots)].copy_(torch.tensor(rows, dtype=torch.long))  # [B, k]
        return True

    def _trie(self, tier: TierStages, slots: Sequence[int]) -> bool:
        depth, topk, nodes = tier.shape
        tries = [self.propose_tree(slot, depth, topk, nodes - 1) for slot in slots]
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

    # ---- tensor parallelism: one broadcast of [found, drafts [B, k], parents [B, T] (a trie's)] per round ----

    def _packet(self, tier: TierStages, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        rows = tier.draft.draft_tokens.shape[0]
        packet = self._packets.get(tier.shape)
        drafts = tier.draft.draft_tokens[0].numel()
        trie = tier.speculative_eagle_topk > 1
        nodes = tier.verify.layout.parents.shape[1] if trie else 0
        if packet is None:  # once per tier, at the largest batch
            packet = self._packets[tier.shape] = torch.zeros(1 + rows * (drafts + nodes), dtype=torch.long)
        used = packet[:1 + batch * (drafts + nodes)]
        tokens = used[1:1 + batch * drafts].view(batch, drafts)
        parents = used[1 + batch * drafts:].view(batch, nodes) if trie else None
        return used, tokens, parents

    def _send(self, tier: TierStages, batch: int, found: bool) -> None:
        packet, tokens, parents = self._packet(tier, batch)
        packet[0] = int(found)
        if found:
            tokens.copy_(tier.draft.draft_tokens[:batch])
            if parents is not None:
                parents.copy_(tier.verify.layout.parents[:batch])
        self._broadcast(packet)

    def _receive(self, tier: TierStages, batch: int) -> bool:
        packet, tokens, parents = self._packet(tier, batch)
        self._broadcast(packet)
        if not packet[0].item():
            return False
        tier.draft.draft_tokens[:batch].copy_(tokens)
        if parents is not None:
            tier.verify.layout.parents[:batch].copy_(parents)
        return True

    def _look_up_shadow(self, slots: Sequence[int]) -> None:
        if not self.shadow_steps:
            return
        self._tier0_rounds += 1
        if (self._tier0_rounds - 1) % SHADOW_EVERY:
            return
        host_tokens = self.slots.host_tokens
        proposals = [self.propose(slot, self.shadow_steps) for slot in slots]
        if not any(proposals):  # the drafting tier would have run a plain decode: nothing to learn
            return
        for slot, proposal in zip(slots, proposals):  # no lookup: a padded row, settled at once as 0 accepted
            self._pending[slot].append((len(host_tokens[slot]), proposal))

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
        self._indexes[slot] = NgramIndex()
