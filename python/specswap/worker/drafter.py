"""The drafter interface, the no-draft drafter, and what the model drafters share.

A drafter is the per-algorithm part of a round: it prefills its own state,
proposes d_1..d_k (``draft``, on tensors, inside the round), brings itself up
to the accepted tokens (``extend``), and catches up requests it fell behind on
(tier-0 rounds run no draft). ``begin_round`` / ``end_round`` are its host-side
parts, outside any graph. One implementation per algorithm: ``EagleDrafter``
(``worker.eagle``), ``StandaloneDrafter`` (``worker.standalone``),
``NgramDrafter`` (``worker.ngram``) and ``Drafter`` itself (no speculation).
At a tree tier (``speculative_eagle_topk`` > 1) ``draft`` fills the tree's
node tokens and each request's parents (the tier layout's ``parents``):
EAGLE and standalone expand the top-k children of each depth's frontier and
keep the best nodes by path probability (``expand_tree``, EAGLE-2), NGRAM
merges several lookups into a trie. A custom drafter may name one fixed tree
instead (``tree_parents(steps)``). The layout (``worker.layout.TreeLayout``)
masks the verify and lays the accepted path out as a chain, so ``extend`` and
the round driver see a chain either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specswap.sampling import RoundSampling, argmax, draw_uniform_, logits_to_probs, sample_from_probs
from specswap.tier import Tier
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import DraftStage, EagerForward, Forwards, TierStages


@dataclass
class DrafterContext:
    """What a drafter is built from (``Drafter.build``): the models, the slot table, the caches' shape, the
    tiers it must serve and the algorithm's extra inputs."""

    draft: Any                   # the draft model (None for drafters without one)
    target: torch.nn.Module
    slots: SlotTable
    cache_rows: int
    cache_capacity: int
    tiers: tuple[int, ...]       # every tier the worker was sized for (0 among them: tier-0 rounds run)
    number_tokens: Any = None    # specswap.prompt_lookup.NumberTokens for a drafter that extrapolates counters
    options: dict[str, Any] = field(default_factory=dict)  # its algorithm's Engine keywords (``Algorithm.options``)

    @property
    def max_steps(self) -> int:
        return max(self.tiers)


@dataclass
class Shadow:
    """A drafter's part of a round's result: what drafts of ``steps`` tokens would have accepted per request,
    settled by the tokens emitted since (checked at tier 0, where nothing is verified; for drafts drawn from a
    law, a draw with the law of that acceptance: ``ModelDrafter``)."""

    accept_lengths: list[int]
    steps: int


@dataclass
class PrefillBatch:
    """What the target's prefill saw, for a drafter to prefill from (right-padded to P tokens)."""

    slots: Sequence[int]
    prompts: Sequence[Sequence[int]]
    slot_index: torch.Tensor     # [B]
    input_ids: torch.Tensor      # [B, P]
    positions: torch.Tensor      # [B, P]
    prompt_lens: torch.Tensor    # [B]
    rows: torch.Tensor           # [B] 0..B-1
    target_hidden: torch.Tensor  # [B, P, H]
    first_tokens: torch.Tensor   # [B]
    key_length: int


class Drafter:
    """No speculation: draft nothing (a tier-0 round verifies [x_{m-1}] alone). The base of every drafter."""

    model = None
    cache = None
    token_map = None
    vocab_size: int | None = None  # the draft vocabulary's size (None: no draft model)
    # deterministic drafts (no law): sampled rounds accept them against keyed draws (sampling.accept_keyed)
    keyed_sampling = True
    # whether begin_round may find nothing worth verifying, so the worker keeps a plain-decode round (tier 0)
    plain_fallback = False
    drafts_trees = False  # fills a tree tier's nodes and parents (speculative_eagle_topk > 1)

    @classmethod
    def build(cls, context: DrafterContext) -> "Drafter":
        """The drafter for a worker (``algorithms.Algorithm.drafter`` names the class)."""
        return cls()

    def supports(self, steps: int) -> bool:
        """Whether this drafter can run tier ``steps`` (its state was sized for it)."""
        return True

    def target_view(self, target: torch.nn.Module) -> torch.nn.Module:
        """The target as the worker calls it for prefill and verify (EAGLE-3: one returning its auxiliary hidden
        states as ``hidden``); the target itself by default."""
        return target

    def tree_parents(self, steps: int) -> Sequence[int] | None:
        """Tier ``steps``'s draft tree: [-1, parent of node 1, ..., parent of node k] (node 0 is x_{m-1});
        None: the k drafts are a chain."""
        return None

    def prefill(self, batch: PrefillBatch) -> None:
        pass

    def begin_round(self, tier: TierStages, slots: Sequence[int]) -> bool:
        """Host-side work before the round; False: nothing is worth verifying, run a plain decode instead."""
        return True

    def draft(self, tier: TierStages, forwards: Forwards, slot_index: torch.Tensor, seq_lens: torch.Tensor,
              key_length: int, sampling: RoundSampling | None) -> None:
        """Fill tier.draft.draft_tokens [B, k] (and their laws for sampled rounds); no host sync."""

    def extend(self, tier: TierStages, forwards: Forwards, slot_index: torch.Tensor, seq_lens: torch.Tensor,
               positions: torch.Tensor, target_hidden: torch.Tensor, accept_lengths: torch.Tensor,
               next_tokens: torch.Tensor, key_length: int) -> None:
        """Bring the draft's state up to the accepted tokens; no host sync."""

    def end_round(self, tier: TierStages, slots: Sequence[int]) -> None:
        """Host-side bookkeeping after the round's tokens are committed."""

    # after begin_round: which of round_graph_drafters()' whole-round graphs a greedy batch of this round may
    # replay (None: none; the round runs its stages)
    round_graph = 0
    # Tier -> the seconds round_cost() adds to a round at that tier at the current rate, a cost the policy prices at
    # decision time rather than as timed (RoundResult.tier_surcharge); None: round_cost() adds none
    tier_surcharge: Callable[[Tier], float] | None = None

    def round_graph_drafters(self, steps: int) -> tuple["Drafter", ...]:
        """What tier ``steps``'s whole-round graphs record (graph mode, small targets), one graph each: this
        drafter (the hybrid's drafting tiers: its all-model and its all-suffix rounds)."""
        return (self,)

    def round_cost(self, tier: TierStages, seconds: float) -> float:
        """What the round just ended (after ``end_round``) costs the policy's estimate of its tier, from its wall
        time ``seconds``: the wall time (``HybridDrafter``: the model drafter's part priced at its running share
        of rounds)."""
        return seconds

    shadow_steps = 0  # the tier take_shadow's observations are for (0: it makes none)
    checks_paused = False  # pause_checks(True): no drafting tier could pay now, so no tier-0 check could matter

    def pause_checks(self, paused: bool) -> None:
        """Set after each round from the policy (``AdaptiveController.checks_pay``): while no drafting tier could
        beat tier 0 even with every draft accepted, a model drafter skips its tier-0 checks (each a catch-up
        forward); a switch to a drafting tier catches the draft up as it would anyway."""
        self.checks_paused = paused

    def take_shadow(self, slots: Sequence[int], drafting: bool) -> Shadow | None:
        """After a round: what drafts of ``shadow_steps`` tokens would have accepted, for checks the emitted
        tokens settled (at tier 0: ``NgramDrafter``, ``ModelDrafter``); None when there are none."""
        return None

    def observe_plain_round(self, slot_index: torch.Tensor, logits: torch.Tensor, next_tokens: torch.Tensor,
                            sampling: RoundSampling) -> None:
        """A sampled tier-0 round's target logits [B, 1, V] and emitted tokens [B] (greedy rounds never call it):
        for tier-0 checks of drafts drawn from a law (``ModelDrafter``)."""

    # whether this round's draft checks one draft past its chain (``ModelDrafter``); the worker then runs the
    # round through its driver, not a whole-round graph recorded without the check
    deep_check_due = False

    def enable_deep_checks(self, steps: frozenset[int]) -> None:
        """The chain tiers whose next deeper chain is a tier too: a drafter that can may check, in their greedy
        rounds, one draft past the chain (``take_deep_checks``)."""

    def take_deep_checks(self, accept_lengths: Sequence[int], next_tokens: Sequence[int],
                         steps: int) -> list[int] | None:
        """After a chain round of ``steps`` drafts that checked one draft past them: per request, 1 / 0 when the
        emitted bonus token (``next_tokens``) equals / differs from that draft, for a request that accepted all
        ``steps`` (what the chain one step deeper would have accepted there), -1 for the others; None when the
        round checked nothing."""
        return None

    def release(self, slot: int) -> None:
        pass

    def flush_cache(self) -> None:
        """Forget what drafts learnt across requests (SUFFIX's global tree); nothing by default."""

    def stats(self) -> dict[str, Any]:
        """The drafter's own figures for ``Engine.stats()`` (SUFFIX: its global tree's size); none by default."""
        return {}

    def shared_memory_bytes(self) -> int:
        """Bytes of graphs every tier shares (the draft steps)."""
        return 0

    def eager_forwards(self) -> Forwards:
        """The draft's entries of an eager tier's Forwards (verify filled in by the worker)."""
        return Forwards(verify=None)

    def stage_graphs(self, context, steps: int, topk: int = 1) -> Forwards:
        """Capture the draft's stages of tier ``steps`` (a tree of ``topk`` children per node when > 1; graph
        mode); verify filled in by the worker."""
        return Forwards(verify=None)


# tier-0 rounds apart of a model drafter's checks: each catches the draft up over the rounds since the last (the
# catch-up a switch to a drafting tier would run anyway) and runs it once more, so checking more often costs
# more eager draft forwards
SHADOW_EVERY = 8
# Greedy chain rounds apart of a model drafter's checks one draft past the chain (at chain tiers with a chain one
# step deeper among the tiers): each costs one batched draft step (about 1.2 ms at batch 2 on Gemma 3 270M's EAGLE
# head, 6% of a tier-2 round), so every round would cost more than the better-priced deeper tier returns
DEEP_CHECK_EVERY = 4
# A chain tier's first checks come every DEEP_CHECK_EVERY-th round; past them it has settled and is checked every
# DEEP_CHECK_SETTLED_EVERY-th, across its stays, until a sampled round: at tier 3 of the EAGLE transition's code
# phases every 4th round's check cost about 2% of the tier's time (tier 3 pinned, ms per round over static 3's:
# 1.010-1.020x checking every 4th, 0.995-1.008x settling after 8 checks, 0.997-1.000x with none; paired medians,
# two runs of 30 interleaved repeats), and the count starting over at each stay kept a policy that moves between
# tiers 1 and 3 checking every 4th (greedy tune code, fresh engines: 1.031x static 3 against 1.000x with no checks)
DEEP_CHECK_SETTLE_CHECKS = 8
DEEP_CHECK_SETTLED_EVERY = 16
# Tier-0 rounds after a drafting round (or the first ever) that are all checked: a move to tier 0 on a dip of the
# acceptance estimate is then confirmed or undone within a decision or two, where checks every SHADOW_EVERY-th
# round brought the evidence back 8 times slower than the drafting tier it left (stays of 25-120 rounds at tier 0
# where tier 1 paid 1.2x, in EAGLE's sampled phases).
CONFIRM_ROUNDS = 8


class ModelDrafter(Drafter):
    """A drafter with its own model and KV cache, which falls behind in tier-0 rounds and catches up.

    ``lag``: its cache is valid through position m - 1 - lag when in step (EAGLE 1, standalone 2).

    Shadow checks at tier 0 (``enable_checks``, with tier 0 among the tiers): each of the first CONFIRM_ROUNDS
    tier-0 rounds after a drafting round, then every SHADOW_EVERY-th, catches the draft up and takes the law of
    d_1, what tier 1 would draft for x_m (``_first_draft_logits``); once the round emits x_m, what tier 1 would
    have accepted is reported (``take_shadow``, one step). A greedy request accepts its argmax draft if x_m equals
    it. A sampled request would draw d ~ q and accept it with probability min(1, p(d)/q(d)), which is accepted
    with probability sum_x min(p(x), q(x)) = E_{x~p}[min(1, q(x)/p(x))]: with x_m drawn from p, one Bernoulli draw
    at min(1, q(x_m)/p(x_m)) (from the drafter's own generator, never a request's) has exactly the law of tier 1's
    acceptance. p comes from the round's own target logits (``observe_plain_round``), q from the draft at the
    request's temperature and filters. So the policy sees the drafter's acceptance at tier 0, as NGRAM's
    lookups let it see theirs, and is not blind there.

    Checks past the chain (``enable_deep_checks``): every DEEP_CHECK_EVERY-th round at a chain tier k whose chain
    k + 1 is a tier too (every DEEP_CHECK_SETTLED_EVERY-th once the tier has made DEEP_CHECK_SETTLE_CHECKS checks,
    over its stays since the last sampled round: sampled rounds check nothing and unsettle every tier), when
    the round is all greedy, the draft runs one step more and keeps its argmax d_{k+1}, what chain k + 1 would
    have drafted next. A request that accepts all k drafts then emits the target's argmax there as its bonus
    token, so d_{k+1} == bonus is exactly what chain k + 1 would have accepted at position k + 1
    (``take_deep_checks``). The extra step writes the draft cache one position past the chain,
    which the next draft-extend (EAGLE) or step 1 (standalone) rewrites before anything reads it.
    """

    keyed_sampling = False
    drafts_trees = True
    lag = 1
    with_features = False
    draft_widths: tuple[int, ...] = (1,)

    def __init__(self, model: torch.nn.Module, cache, slots: SlotTable):
        self.model, self.cache, self.slots = model, cache, slots
        # positions 0..draft_len-1 of the draft cache are valid
        self.draft_len = [0] * len(slots.host_seq_lens)
        self._step_graphs: dict[int, object] | None = None  # draft-step StageGraphs, shared by every tier
        self._tree_graphs: dict[tuple[int, int], object] = {}  # frontier-step StageGraphs by (topk, depth)
        # tier-0 checks (enable_checks): per slot (position of the token checked, the greedy draft, the sampled
        # check's outcome or None), and the law of the round's drafts [B, Vd]
        self._tier0_rounds = 0  # since the last drafting round
        self._pending: list[tuple[int, int, int | None] | None] = [None] * len(slots.host_seq_lens)
        self._check_logits: torch.Tensor | None = None
        self._shadow_generator = torch.Generator().manual_seed(0)
        self._draft_id: torch.Tensor | None = None  # target id -> draft id (-1: outside the draft vocabulary)
        # checks past the chain (enable_deep_checks): the chain tiers checked, their rounds counted, and the
        # round's draft one past its chain [S] (target ids), filled in draft() without a host sync
        self._deep_tiers: frozenset[int] = frozenset()
        self._chain_rounds = 0  # rounds at the chain tiers checked, counted across stays
        self._checks: dict[int, int] = {}  # chain steps -> its checks since the last sampled round, across stays
        self._deep_drafts = torch.zeros(len(slots.host_seq_lens), dtype=torch.long, device=slots.device)
        self._deep_drafted = False

    def enable_checks(self, target_vocab_size: int) -> None:
        """Check one draft step in tier-0 rounds (the worker runs tier 0): each of the first CONFIRM_ROUNDS after
        a drafting round, then every SHADOW_EVERY-th."""
        self.shadow_steps = 1
        if self.token_map is not None:
            device = self.token_map.device
            self._draft_id = torch.full((target_vocab_size,), -1, dtype=torch.long, device=device)
            self._draft_id[self.token_map] = torch.arange(self.token_map.numel(), device=device)

    def enable_deep_checks(self, steps: frozenset[int]) -> None:
        self._deep_tiers = frozenset(steps)

    def begin_round(self, tier: TierStages, slots: Sequence[int]) -> bool:
        self.deep_check_due = False
        steps = tier.speculative_num_steps if tier.speculative_eagle_topk == 1 else 0
        if tier.speculative_num_steps:
            self.catch_up(slots)
            self._tier0_rounds = 0
            if steps in self._deep_tiers:
                self._chain_rounds += 1
                settled = self._checks.get(steps, 0) >= DEEP_CHECK_SETTLE_CHECKS
                every = DEEP_CHECK_SETTLED_EVERY if settled else DEEP_CHECK_EVERY
                self.deep_check_due = self._chain_rounds % every == 0
        elif self.shadow_steps and not self.checks_paused:
            self._tier0_rounds += 1
            if self._tier0_rounds <= CONFIRM_ROUNDS or (self._tier0_rounds - CONFIRM_ROUNDS) % SHADOW_EVERY == 0:
                self._check(slots)
        return True

    def _first_draft_logits(self, slots: Sequence[int]) -> torch.Tensor:
        """The draft's logits [B, Vd] of d_1 for each request, as tier 1 would draft it now."""
        raise NotImplementedError

    def _check(self, slots: Sequence[int]) -> None:
        self._check_logits = self._first_draft_logits(slots)
        drafts = argmax(self._check_logits)  # [B] as drafted
        if self.token_map is not None:
            drafts = self.token_map[drafts]
        for slot, draft in zip(slots, drafts.tolist()):
            self._pending[slot] = (len(self.slots.host_tokens[slot]), draft, None)

    def observe_plain_round(self, slot_index: torch.Tensor, logits: torch.Tensor, next_tokens: torch.Tensor,
                            sampling: RoundSampling) -> None:
        """Settle the sampled requests' checks with one draw each at min(1, q(x)/p(x)) (the class docstring)."""
        if self._check_logits is None:
            return
        slots = slot_index.tolist()
        rows = [row for row, slot in enumerate(slots)
                if self._pending[slot] is not None and self._pending[slot][2] is None
                and float(sampling.temperature[row]) > 0.0]
        if not rows:
            return
        index = torch.tensor(rows, device=logits.device)
        settings = (sampling.temperature[index], sampling.top_k[index], sampling.top_p[index], sampling.apply_filters)
        tokens = next_tokens[index]                                                        # [R] x_m
        p = logits_to_probs(logits[index, 0], *settings).gather(1, tokens.unsqueeze(-1)).squeeze(-1)  # [R]
        q_law = logits_to_probs(self._check_logits[index], *settings)                    # [R, Vd]
        draft_ids = tokens if self._draft_id is None else self._draft_id[tokens]
        q = torch.where(draft_ids >= 0, q_law.gather(1, draft_ids.clamp_min(0).unsqueeze(-1)).squeeze(-1),
                        torch.zeros_like(p))
        ratio = (q.float() / p.float().clamp_min(torch.finfo(torch.float32).tiny)).clamp(max=1.0).cpu()
        accepted = (draw_uniform_(torch.empty(len(rows)), self._shadow_generator) < ratio).tolist()
        for row, outcome in zip(rows, accepted):
            position, draft, _ = self._pending[slots[row]]
            self._pending[slots[row]] = (position, draft, int(outcome))

    def take_shadow(self, slots: Sequence[int], drafting: bool) -> Shadow | None:
        """What tier 1 would have accepted for the requests checked this round (a drafting round observed itself:
        its checks are dropped)."""
        self._check_logits = None
        settled = []
        for slot in slots:
            pending = self._pending[slot]
            if pending is None:
                continue
            self._pending[slot] = None
            if drafting:
                continue
            position, draft, outcome = pending
            tokens = self.slots.host_tokens[slot]
            if outcome is None:  # greedy (or a batch with none sampled): the argmax draft against x_m
                outcome = int(len(tokens) > position and tokens[position] == draft)
            settled.append(outcome)
        return Shadow(settled, self.shadow_steps) if settled else None

    def _checks_deeper(self, sampling: RoundSampling | None) -> bool:
        """Whether this round's chain draft runs one step past the chain (due, and all greedy). A sampled round
        unsettles every chain tier: the greedy rounds after it may be another workload's."""
        if sampling is not None:
            self._checks.clear()
            return False
        return self.deep_check_due

    def _keep_deep_draft(self, logits: torch.Tensor) -> None:
        """The draft one past the chain, from the draft's logits [B, Vd] there: its argmax, in target ids."""
        draft_ids = argmax(logits)
        self._deep_drafts[:logits.shape[0]] = draft_ids if self.token_map is None else self.token_map[draft_ids]
        self._deep_drafted = True

    def take_deep_checks(self, accept_lengths: Sequence[int], next_tokens: Sequence[int],
                         steps: int) -> list[int] | None:
        if not self._deep_drafted:
            return None
        self._deep_drafted = False
        self._checks[steps] = self._checks.get(steps, 0) + 1
        drafts = self._deep_drafts[:len(accept_lengths)].tolist()
        return [int(bonus == draft) if accepted == steps else -1
                for accepted, bonus, draft in zip(accept_lengths, next_tokens, drafts)]

    def end_round(self, tier: TierStages, slots: Sequence[int]) -> None:
        if tier.speculative_num_steps:  # the draft is in step again (tier 0 leaves it behind)
            for slot in slots:
                self.draft_len[slot] = self.slots.host_seq_lens[slot] - self.lag

    def prefill(self, batch: PrefillBatch) -> None:
        for slot, prompt in zip(batch.slots, batch.prompts):
            self.draft_len[slot] = len(prompt)

    def release(self, slot: int) -> None:
        self.draft_len[slot] = 0
        self._pending[slot] = None

    def catch_up(self, slots: Sequence[int]) -> None:
        """Bring the draft of requests that ran tier-0 rounds back in step: one forward per group of requests
        missing as many positions (the first round after a switch up from tier 0, and the tier-0 checks)."""
        groups: dict[int, list[int]] = {}
        for slot in slots:
            start, end = self.draft_len[slot], self.slots.host_seq_lens[slot] - self.lag  # start..end-1 missing
            if start < end:
                groups.setdefault(end - start, []).append(slot)
        for width, members in groups.items():
            self._catch_up_rows(members, width)
            for slot in members:
                self.draft_len[slot] += width

    def _catch_up_rows(self, slots: list[int], width: int) -> None:
        """Run the draft over positions draft_len..draft_len+width-1 of each of ``slots``, in one forward."""
        raise NotImplementedError

    def _catch_up_positions(self, slots: list[int], width: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(each request's first missing position, slot index [B], positions [B, width]) for ``_catch_up_rows``."""
        device = self.slots.device
        starts = [self.draft_len[slot] for slot in slots]
        positions = torch.tensor(starts, device=device).unsqueeze(-1) + torch.arange(width, device=device)
        return starts, torch.tensor(slots, device=device), positions

    def eager_forwards(self) -> Forwards:
        step = EagerForward(self.model, self.cache, self.with_features)
        return Forwards(verify=None, draft_steps={width: step for width in self.draft_widths},
                        tree_steps={None: step})

    def stage_graphs(self, context, steps: int, topk: int = 1) -> Forwards:
        if not steps:
            return Forwards(verify=None)
        from specswap.graphs import StageGraphs

        for depth in range(1, steps if topk > 1 else 1):  # a tree's frontier steps: depths 1..steps-1
            if (topk, depth) not in self._tree_graphs:
                graphs = StageGraphs(context, "draft", steps, self.model, self.cache, topk,
                                     with_features=self.with_features, tree_nodes=topk * depth, tree_base=True)
                graphs.capture()
                self._tree_graphs[topk, depth] = graphs
        if self._step_graphs is None:
            self._step_graphs = {}
            for width in self.draft_widths:
                graphs = StageGraphs(context, "draft", steps, self.model, self.cache, width,
                                     with_features=self.with_features)
                graphs.capture()
                self._step_graphs[width] = graphs
        return Forwards(verify=None, draft_steps=self._step_graphs, tree_steps=self._tree_graphs)

    def shared_memory_bytes(self) -> int:
        graphs = (*(self._step_graphs or {}).values(), *self._tree_graphs.values())
        return sum(g.memory_bytes() for g in graphs)


def sample_draft(draft: DraftStage, step: int, logits: torch.Tensor, sampling: RoundSampling | None,
                 token_map: torch.Tensor | None) -> torch.Tensor:
    """Draw draft token ``step`` from draft logits [B, Vd]; record it and its law in target vocabulary.

    ``sampling`` None: an all-greedy batch (argmax; the law is not needed by greedy acceptance and not built).
    Returns the tokens [B] in target ids.
    """
    batch = logits.shape[0]
    if sampling is None:
        draft_ids = argmax(logits)  # [B]
        tokens = draft_ids if token_map is None else token_map[draft_ids]
        draft.draft_tokens[:batch, step] = tokens
        return tokens
    draft_law = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                                sampling.apply_filters)                                 # [B, Vd]
    draft_ids = sample_from_probs(draft_law, draft.draft_noise[:batch, step])           # [B] draft vocab
    if token_map is None:
        draft.draft_probs[:batch, step] = draft_law
        tokens = draft_ids
    else:
        # columns outside the map stay 0 forever (zeroed at set-up)
        draft.draft_probs[:batch, step].index_copy_(-1, token_map, draft_law)
        tokens = token_map[draft_ids]
    draft.draft_tokens[:batch, step] = tokens
    return tokens


def expand_tree(tier: TierStages, first_logits: torch.Tensor, step, token_map: torch.Tensor | None) -> torch.Tensor:
    """EAGLE-2's dynamic draft tree, on tensors (no host sync): the top-k tokens of ``first_logits`` [B, Vd] are
    depth 1; at each further depth the frontier (the k best nodes of the depth before, by path probability:
    the product of the draft's probabilities along the path) runs through the draft in one forward, k rows per
    request, and each frontier node's top-k children are candidates. The tier's num_draft_tokens - 1 best
    candidates by path probability (a child never beats its parent; ties keep the earlier, shallower one) are
    the tree: written in candidate order (parents first) into the tier's draft tokens and its layout's parents.

    ``step(tokens [B, k], depth, frontier_parents [B, k] or None, region (mask [B, k, R], None)) -> logits
    [B, k, Vd]``: the draft over the frontier of ``depth``, stored as the last k nodes of a region of R = k *
    depth nodes (the frontiers so far; the drafter sets the region's base); frontier_parents[b, j] is the
    frontier node of the step before that node j descends from (None at depth 1). Returns each tree node's
    index in that region [B, T-1] (-1: a node never expanded, a leaf), where its draft state was stored.
    """
    topk, depth, nodes = tier.speculative_eagle_topk, tier.speculative_num_steps, tier.speculative_num_draft_tokens
    batch = first_logits.shape[0]
    device = first_logits.device
    scores, ids = torch.log_softmax(first_logits.float(), dim=-1).topk(topk, dim=-1)     # [B, k]
    tokens = ids if token_map is None else token_map[ids]
    all_scores, all_tokens, all_parents = [scores], [tokens], [torch.full_like(ids, -1)]  # candidate parents
    all_regions = [torch.arange(topk, device=device).expand(batch, -1)]                  # region index or -1
    frontier = torch.arange(topk, device=device).expand(batch, -1)                        # [B, k] candidates
    eye = torch.eye(topk, dtype=torch.bool, device=device).expand(batch, -1, -1)         # [B, k, k]
    region = eye
    frontier_parents, offset = None, topk
    for level in range(1, depth):
        logits = step(tokens, level, frontier_parents, region)                            # [B, k, Vd]
        child_scores, child_ids = (torch.log_softmax(logits.float(), dim=-1)
                                   + scores.unsqueeze(-1)).topk(topk, dim=-1)             # [B, k, k]
        child_tokens = child_ids if token_map is None else token_map[child_ids]
        all_scores.append(child_scores.flatten(1))
        all_tokens.append(child_tokens.flatten(1))
        all_parents.append(frontier.unsqueeze(-1).expand(-1, -1, topk).flatten(1))
        scores, best = child_scores.flatten(1).topk(topk, dim=-1)                         # [B, k] next frontier
        frontier_parents = best // topk
        tokens = child_tokens.flatten(1).gather(1, best)
        frontier = offset + best
        all_regions.append(torch.full((batch, topk * topk), -1, dtype=torch.long, device=device).scatter(
            1, best, torch.arange(level * topk, (level + 1) * topk, device=device).expand(batch, -1)))
        offset += topk * topk
        width = region.shape[-1]
        region = torch.cat((region.gather(1, frontier_parents.unsqueeze(-1).expand(-1, -1, width)), eye), dim=-1)
    candidate_scores = torch.cat(all_scores, dim=1)                                      # [B, C]
    order = torch.sort(candidate_scores, dim=-1, descending=True, stable=True).indices[:, :nodes - 1]
    chosen = order.sort(dim=-1).values                                                   # [B, T-1] parents first
    tier.draft.draft_tokens[:batch] = torch.cat(all_tokens, dim=1).gather(1, chosen)
    parent = torch.cat(all_parents, dim=1).gather(1, chosen)                             # [B, T-1] candidate
    node_of = chosen.new_zeros(batch, candidate_scores.shape[1] + 1).scatter(                  # out of place
        1, chosen + 1, torch.arange(1, nodes, device=device).expand(batch, -1))
    layout = tier.verify.layout
    layout.parents[:batch, 0] = 0
    layout.parents[:batch, 1:] = node_of.gather(1, parent + 1)                           # the root: 0
    return torch.cat(all_regions, dim=1).gather(1, chosen)
