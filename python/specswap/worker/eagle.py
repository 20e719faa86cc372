"""EAGLE drafting: an EAGLE head over the target's hidden states, in chains or EAGLE-2 dynamic trees.

Head position j consumes (embed(x_{j+1}), f_j), f_j the target hidden at j. Its
KV is valid through m-2, and the head output at m-2 (the logits for d_1 and the
hidden that feeds step 2) is kept per request. Draft step i >= 2 feeds
(d_{i-1}, previous head hidden) at position m+i-3. Draft-extend feeds
[d_1..d_a, b] with the verify hidden f_{m-1}..f_{m+a-1} at positions
m-1..m+a-1, padded to T = k+1 with the rejected drafts; the output at index a
is next round's step 1. Entries past a are stale and are overwritten before
they can be read (attention reads positions <= query). Tier-0 rounds keep
f_{m-1} so that the first round of a tier k >= 1 can catch the head up.

At tier 0 it checks one draft step now and then (``ModelDrafter``): the
head's output at m-2 after a catch-up is tier 1's law of d_1.

A tree tier (topk > 1) expands the top-k children of each depth's frontier
(``drafter.expand_tree``): the frontier of depth j feeds the head at position
m-2+j, its KV stored from m-1 on as a region of frontier nodes each sees its
ancestors in; the draft-extend over the accepted path then rewrites m-1.. as
for a chain.
"""

from __future__ import annotations

import torch

from specswap.worker.drafter import ModelDrafter, PrefillBatch, expand_tree, sample_draft
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import EagerForward, Forwards, TierStages


class EagleDrafter(ModelDrafter):
    lag = 1
    with_features = True

    def __init__(self, head: torch.nn.Module, target: torch.nn.Module, slots: SlotTable, cache_rows: int,
                 cache_capacity: int, keep_tier0_features: bool):
        super().__init__(head, head.make_cache(cache_rows, cache_capacity), slots)
        self.token_map = getattr(head, "token_map", None)
        self.vocab_size = target.config.vocab_size if self.token_map is None else self.token_map.numel()
        hidden_size, dtype, device = target.config.hidden_size, target.dtype, target.device
        self.next_draft_logits = torch.zeros(cache_rows, self.vocab_size, dtype=dtype,
                                             device=device)  # [S, Vd] head output at m-2
        self.next_draft_hidden = torch.zeros(cache_rows, hidden_size, dtype=dtype, device=device)  # [S, H]
        # f_{m-1} of tier-0 rounds, for the catch-up: [S, capacity, F] (only when tier 0 is a candidate, or a
        # hybrid's rounds may leave the head behind: keep_features)
        self.tier0_features: torch.Tensor | None = None
        self._feature_shape = (cache_rows, cache_capacity)
        self._rows = torch.arange(len(slots.host_seq_lens), device=device)  # 0..max_batch-1
        if keep_tier0_features:  # tier 0 runs: check the head's drafts there
            self.keep_features()
            self.enable_checks(target.config.vocab_size)

    @classmethod
    def build(cls, context) -> "EagleDrafter":
        return cls(context.draft, context.target, context.slots, context.cache_rows, context.cache_capacity,
                   keep_tier0_features=0 in context.tiers)

    def supports(self, steps: int) -> bool:
        return steps > 0 or self.tier0_features is not None

    def feature_size(self) -> int:
        """The width F of the target features the head reads (EAGLE: the hidden size)."""
        return self.next_draft_hidden.shape[-1]

    def keep_features(self) -> None:
        """Keep the target features the catch-up reads ([S, capacity, F]): tier 0's, and a drafting round's
        where ``keep_verified_features`` is called (a hybrid whose suffix rounds skip the draft-extend)."""
        if self.tier0_features is None:
            self.tier0_features = torch.zeros(*self._feature_shape, self.feature_size(),
                                              dtype=self.next_draft_hidden.dtype, device=self.next_draft_hidden.device)

    def keep_verified_features(self, slot_index: torch.Tensor, positions: torch.Tensor,
                               target_hidden: torch.Tensor) -> None:
        """A drafting round's target features [B, T, F] at their positions [B, T] (the accepted path as a chain;
        entries past it are rewritten by later rounds before a catch-up reads them), for a later catch-up."""
        self.tier0_features[slot_index.unsqueeze(-1), positions] = target_hidden

    def prefill(self, batch: PrefillBatch) -> None:
        super().prefill(batch)
        # head position j consumes (x_{j+1}, f_j): tokens x_1..x_P with features f_0..f_{P-1}
        input_ids, last = batch.input_ids, (batch.prompt_lens - 1)
        head_ids = torch.cat((input_ids[:, 1:], input_ids[:, :1]), dim=1)                # [B, P]
        head_ids.scatter_(1, last.unsqueeze(-1), batch.first_tokens.unsqueeze(-1))
        out = self.model(head_ids, batch.target_hidden, batch.positions, self.cache, batch.slot_index,
                         key_length=batch.key_length)
        self.next_draft_logits[batch.slot_index] = out.logits[batch.rows, last]
        self.next_draft_hidden[batch.slot_index] = out.hidden[batch.rows, last]

    def _first_draft_logits(self, slots) -> torch.Tensor:
        self.catch_up(slots)  # the head's output at m-2: the law of d_1
        return self.next_draft_logits[torch.tensor(slots, device=self.slots.device)]

    def draft(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, key_length, sampling) -> None:
        steps = tier.speculative_num_steps
        if not steps:
            return
        logits = self.next_draft_logits[slot_index]  # [B, Vd] head output at m-2: the law of d_1
        hidden = self.next_draft_hidden[slot_index]  # [B, H]
        if tier.speculative_eagle_topk > 1:
            self._draft_tree(tier, forwards, slot_index, seq_lens, key_length, logits, hidden)
            return
        deeper = self._checks_deeper(sampling)  # one step past the chain: d_{k+1}, checked, never verified
        for step in range(steps):
            tokens = sample_draft(tier.draft, step, logits, sampling, self.token_map)
            if step + 1 < steps or deeper:
                # head position m-1+step consumes (d_{step+1}, its own previous hidden)
                positions = (seq_lens - 1 + step).unsqueeze(-1)  # [B, 1]
                out = forwards.draft_steps[1](tokens.unsqueeze(-1), positions, slot_index, key_length,
                                              hidden.unsqueeze(1))
                logits, hidden = out.logits[:, 0], out.hidden[:, 0]
        if deeper:
            self._keep_deep_draft(logits)

    def _draft_tree(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, key_length, logits,
                    hidden) -> None:
        topk = tier.speculative_eagle_topk
        base = (seq_lens - 1).unsqueeze(-1)                    # [B, 1] the frontier nodes' region starts at m-1
        state = {}

        def step(tokens, depth, frontier_parents, region):
            if frontier_parents is None:                       # depth 1: the head output at m-2 feeds them all
                features = hidden.unsqueeze(1).expand(-1, topk, -1)
            else:                                              # each node: its parent's head output
                features = state["hidden"].gather(1, frontier_parents.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            positions = (seq_lens - 2 + depth).unsqueeze(-1).expand(-1, topk)
            forward = forwards.tree_steps.get((topk, depth)) or forwards.tree_steps[None]
            out = forward(tokens, positions, slot_index, key_length, features, tree_mask=(region, base))
            state["hidden"] = out.hidden
            return out.logits

        expand_tree(tier, logits, step, self.token_map)

    def extend(self, tier: TierStages, forwards: Forwards, slot_index, seq_lens, positions, target_hidden,
               accept_lengths, next_tokens, key_length) -> None:
        """Head over [d_1..d_a, b] with target features f_{m-1}..f_{m+a-1}; keep its output at index a."""
        steps = tier.speculative_num_steps
        if not steps:  # keep f_{m-1} for the catch-up
            self.tier0_features[slot_index, seq_lens - 1] = target_hidden[:, 0]
            return
        batch = positions.shape[0]
        input_ids = tier.draft_extend.input_ids[:batch]  # [B, k+1]
        input_ids[:, :steps] = tier.draft.draft_tokens[:batch, :steps]  # (a tree's accepted path, laid out)
        input_ids.scatter_(1, accept_lengths.unsqueeze(-1), next_tokens.unsqueeze(-1))
        # the LM head only at index a: the rows past it are rejected drafts, the ones before it are not drafted from
        out = forwards.draft_extend(input_ids, positions, slot_index, key_length, target_hidden,
                                    logits_at=accept_lengths)
        self.next_draft_logits[slot_index] = out.logits[:, 0]
        self.next_draft_hidden[slot_index] = out.hidden[self._rows[:batch], accept_lengths]

    def _catch_up_rows(self, slots: list[int], width: int) -> None:
        # head position j consumes (x_{j+1}, f_j), for j = start..start+width-1 of each request, in one forward
        device = self.slots.device
        starts, slot_index, positions = self._catch_up_positions(slots, width)                 # [B], [B, T]
        input_ids = torch.tensor([self.slots.host_tokens[slot][start + 1:start + width + 1]
                                  for slot, start in zip(slots, starts)], device=device)        # [B, T]
        features = self.tier0_features[slot_index.unsqueeze(-1), positions]                    # [B, T, H]
        out = self.model(input_ids, features, positions, self.cache, slot_index,
                         key_length=max(starts) + width,
                         logits_at=torch.full((len(slots),), width - 1, dtype=torch.long, device=device))
        self.next_draft_logits[slot_index] = out.logits[:, 0]
        self.next_draft_hidden[slot_index] = out.hidden[:, -1]

    def eager_forwards(self) -> Forwards:
        forwards = super().eager_forwards()
        forwards.draft_extend = EagerForward(self.model, self.cache, with_features=True)
        return forwards

    def stage_graphs(self, context, steps: int, topk: int = 1) -> Forwards:
        if not steps:
            return Forwards(verify=None)
        from specswap.graphs import StageGraphs

        extend = StageGraphs(context, "draft_extend", steps, self.model, self.cache, steps + 1, with_features=True,
                             logits_at=True, feature_size=getattr(self.model, "fused_feature_size", None))
        extend.capture()
        forwards = super().stage_graphs(context, steps, topk)
        forwards.draft_extend = extend
        return forwards
