"""Hybrid drafting: a model drafter (EAGLE, EAGLE3, STANDALONE) and SUFFIX's trees side by side, the better draft
verified per request each round (Arctic Inference's hybrid; ``Engine(..., hybrid_drafter="SUFFIX")``).

Each drafting round, per request: SUFFIX's draft and what it is expected to get accepted, against what the model's
drafts accepted per round at this tier (an EMA over the requests that verified them, from MODEL_PRIOR x the tier's
depth): the suffix draft is verified where its expectation is higher, the model's elsewhere. At a chain tier
SUFFIX's draft is its own: prompt lookup's where it finds one, expected to get what lookups continuing a match of
that length got at the tier (``lookup_expected``: a mean, from the whole chain counted once, so a length is tried
before it is judged), else the trees' best path. The trees' draft (a tree tier's always) is expected to get its
score (the sum of its tokens' estimated path probabilities) calibrated at the tier: times what the trees' drafts
verified there got accepted over what they scored (EMAs over those request-rounds: on sampled prose the scores
promise several times what they get). Prompt lookup first, as SUFFIX drafts: on Gemma 3 270M's code its copies
are right where the trees' best path, the most frequent continuation, is not, at no draft step's cost. All the
means are kept per request temperature band (``heat``: greedy, below 0.5, below 1, 1 and above;
a band not seen yet at the tier starts from the nearest one seen): a deterministic draft's acceptance falls with
the temperature (a suffix draft scoring 0.55 at tier 1 got 0.80 of its score accepted at 0.7 and 0.32 at 1.0, the
tune prompts' mixed workload), so a calibration learned in one band misprices the other. The model then drafts
in the round only if it pays for its draft steps: what the requests that chose its draft expect from it over
their suffix drafts, as a share of what the round emits without it, beats those steps' seconds over the rest of
the round's (``ModelCost.pays``); else they verify their suffix drafts (the last
token repeated where SUFFIX has none). After REFRESH drafts of one kind in a row at a tier (where the other
had one too), the other's is taken once, the model's even where it does not pay, so neither mean goes stale (the
model's turn waits while the suffix draft is expected to get every draft accepted: no mean could beat that).
At a chain tier of k the suffix draft is that chain, at most k tokens, padded as SUFFIX pads it; at a tree
tier it is SUFFIX's tree for the tier's shape (``SuffixDrafter.scored_suffix_tree``: its best path as the first
children, padded with copies of the last token under the root), its nodes and parents written over
the model's tree in that row. The choice reads only what the request emitted so far, never this round's draws, so
each row's acceptance is exact: a suffix row's chain draft is a point mass (its ``draft_probs`` one-hot) under the
model drafter's acceptance (accepted with probability p(d), a rejection draws p without d); a tree's children are
point masses in every row already (the model's are its top-k); the model's rows as the model drafter alone,
greedy rows by the argmax.

The model drafter is kept in step lazily. A round catches it up only for the requests that verify its draft; a
round where every request takes the suffix draft runs no draft forward and no draft-extend, so those requests
fall behind, as in tier-0 rounds (an EAGLE head keeps the verified target features for it). In a round where
some request takes the model's draft, EAGLE's draft-extend runs over every request's verified tokens: a suffix
row then in step stays in step, one behind stays behind; a standalone draft's cache keeps, for a suffix row,
only what it held before the round. A request behind is caught up (one forward over what it missed) when it next
verifies the model's draft or tier 0 checks it.

At tier 0 the model drafter checks tier 1's draft now and then (``ModelDrafter``); where the hybrid would have
taken the suffix draft at tier 1 the check is that draft's first token instead (a point mass is accepted exactly
when the emitted token equals it, in law too), so the policy sees what the hybrid would have accepted.

Chains and trees; one process or data parallelism (the Engine refuses tensor parallelism). In graph mode a tier
has two whole-round graphs: a greedy round where every request verifies the model's draft replays the model
drafter's round, one where every request verifies the suffix draft replays a round with the drafts already in the
tier's buffers (as NGRAM's) that keeps the verified features and runs no model; a round that mixes them, or that
samples, runs from the stages' graphs.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from typing import Any, Sequence

import torch

from specswap.tier import Tier
from specswap.worker.drafter import Drafter, ModelDrafter, PrefillBatch
from specswap.worker.slots import SlotTable
from specswap.worker.suffix import SuffixConfig, SuffixDrafter
from specswap.worker.tiers import Forwards, TierStages

# the model's accepted drafts per round at a tier never yet observed, as a share of the tier's k: where its mean
# starts
MODEL_PRIOR = 0.5
# weight of each model-drafted request-round in the tier's running mean (an EMA)
MODEL_EMA_ALPHA = 0.05
# drafts of one kind taken in a row at a tier (where the other kind had a draft too) after which a request-round
# verifies the other's instead, so that neither kind's mean there goes stale (one in 33 at most; the choice stays
# a function of the history)
REFRESH = 32
# weight of each suffix-drafted request-round in the tier's calibration (EMAs of its accepted drafts and score),
# which starts at the score as it is (SUFFIX_PRIOR accepted per SUFFIX_PRIOR scored)
SUFFIX_EMA_ALPHA = 0.05
SUFFIX_PRIOR = 1.0
# weight of each lookup-drafted request-round in its (tier, band, match length)'s mean once it has 1 / this many
LOOKUP_EMA_ALPHA = 0.05
# temperature band edges (``heat``): greedy is band 0, a temperature below HEAT_EDGES[i] band i + 1, the rest last
HEAT_EDGES = (0.5, 1.0)
HEAT_LABELS = ("greedy", "T<0.5", "T<1", "T>=1")
TIER_ONE = Tier(1)  # what tier 0's checks stand for
# weight of each drafting round in the model drafter's share of rounds and in its cost per round at a tier (EMAs)
MODEL_COST_ALPHA = 0.1


class ModelCost:
    """Per-drafter cost accounting: a hybrid round's cost as the policy should price its tier. A round where some
    request verifies the model's draft pays the model's catch-up, draft steps and draft-extend; one where every
    request takes the suffix draft pays none of it, so the same tier's rounds cost up to twice as much one round
    as the next (an EAGLE chain of 6 on Gemma 3 270M: 84 ms with the model's draft, about 35 without). Priced by
    its wall time alone, a tier timed in a model round keeps that price while the suffix drafts nearly every round
    there. ``price`` gives a round's wall time less its model part plus the model's cost at the tier times its
    share of drafting rounds lately: every round of a tier then prices it at the running mix. That last part goes to
    the policy apart too (``HybridDrafter.tier_surcharge``, ``RoundResult.surcharge_seconds``), which prices every
    tier at the share now: a tier last timed at another mix (tier 7 in resampled text, share 0.5) is not held to it
    (in verbatim text, share 0.05).

    The model part is host-timed around the model drafter's calls: exact on a CPU; on an accelerator it times the
    launches alone, and the tier is priced near its wall time, as without this."""

    def __init__(self):
        self.share = 1.0  # EMA over drafting rounds of whether the model drafted: from the model drafter alone's price
        self.cost: dict[Tier, float] = {}  # tier -> the model's seconds in a round where it drafted (EMA)
        self.drafting: dict[Tier, float] = {}  # tier -> of those, its draft and draft-extend's alone (EMA)
        self.rest: dict[Tier, float] = {}  # tier -> a round's seconds less the model's (EMA)

    def price(self, tier: Tier, seconds: float, model_seconds: float | None, drafted: bool,
              catch_up_seconds: float = 0.0) -> float:
        """One drafting round at ``tier`` of wall time ``seconds``, ``model_seconds`` of it the model's (None: not
        timed apart, a whole-round graph's: its running cost there stands in), ``catch_up_seconds`` of that its
        catch-up over what it missed; ``drafted``: some request verified the model's draft."""
        self.share += MODEL_COST_ALPHA * (float(drafted) - self.share)
        if model_seconds is None:
            model_seconds = self.model_seconds(tier) if drafted else 0.0
        else:
            _ema(self.rest, tier, seconds - model_seconds)
            if drafted:
                _ema(self.cost, tier, model_seconds)
                _ema(self.drafting, tier, model_seconds - catch_up_seconds)
        return seconds - model_seconds + self.surcharge(tier)

    def surcharge(self, tier: Tier) -> float:
        """The model's part of a round's price at ``tier``: its cost there at its share of drafting rounds now."""
        return self.share * self.model_seconds(tier)

    def pays(self, tier: Tier, gain: float) -> bool:
        """Whether the model's drafts, adding ``gain`` to the tokens a round at ``tier`` emits (a share of what
        it emits without them), are worth its draft steps: gain > their seconds over the rest of the round's.
        Its catch-up is left out: it falls due whichever round runs the model, and grows the longer it waits.
        True until both are measured."""
        drafting, rest = self.drafting.get(tier), self.rest.get(tier)
        return drafting is None or not rest or gain > drafting / rest

    def model_seconds(self, tier: Tier) -> float:
        """The model's cost in a round at ``tier`` where it drafts: measured there, else the measured tiers' mean
        cost per draft step times the tier's steps (0 before any)."""
        cost = self.cost.get(tier)
        if cost is not None:
            return cost
        per_step = [value / shape.steps for shape, value in self.cost.items()]
        return sum(per_step) / len(per_step) * tier.steps if per_step else 0.0


class HybridDrafter(Drafter):
    """``model`` (a ``ModelDrafter``) and ``suffix`` (a ``SuffixDrafter``) over one slot table; built through
    ``over(model_algorithm, second_algorithm)`` (``algorithms.Algorithm.hybrid``)."""

    keyed_sampling = False  # the model's drafts have a law: sampled rounds draw from each request's generator
    plain_fallback = False
    drafts_trees = True
    parts: tuple[Any, Any] = ()  # (the model drafter's Algorithm, the second drafter's), set by ``over``

    def __init__(self, model: ModelDrafter, suffix: SuffixDrafter, slots: SlotTable):
        self.model_drafter, self.suffix, self.slots = model, suffix, slots
        self.model, self.cache = model.model, model.cache
        self.token_map, self.vocab_size = model.token_map, model.vocab_size
        self.shadow_steps = model.shadow_steps
        # a drafter without a draft-extend (standalone) keeps its own drafts in its cache: a suffix row rolls back
        self._rewinds = model.eager_forwards().draft_extend is None
        # an EAGLE head's catch-up reads target features: kept from every drafting round (keep_verified_features)
        self._keeps_features = hasattr(model, "keep_verified_features")
        if self._keeps_features:
            model.keep_features()
        size = len(slots.host_tokens)
        # (tier, heat) -> the model's accepted drafts per round (EMA)
        self.expected: dict[tuple[Tier, int], float] = {}
        # (tier, heat) -> the suffix drafts' [accepted, score] a round (EMAs)
        self.calibration: dict[tuple[Tier, int], list[float]] = {}
        # (tier, heat, match length) -> prompt lookup's accepted drafts a round at a chain tier and their count
        # (a mean, then an EMA: ``lookup_expected``)
        self.lookups: dict[tuple[Tier, int, int], list[float]] = {}
        self._streak: dict[Tier, tuple[str, int]] = {}  # tier -> the kind taken in a row (where both had one), times
        self._score: list[float | None] = [0.0] * size  # per slot this round: its suffix draft's score (None: filler)
        self._candidate: list[tuple | None] = [None] * size  # per slot this round: the suffix draft it had, if any
        self._match = [0] * size                      # per slot this round: its lookup draft's match (0: trees')
        self._turn = [False] * size                   # per slot this round: the model's draft taken as its turn
        self._start = [0] * size                      # per slot: its length when the round began
        self._draft_len = [0] * size                  # per slot: the model's draft_len when the round began
        self._chosen: list[str | None] = [None] * size  # per slot this round: "suffix", "model" or None (plain)
        self._suffix_rows: list[int] = []             # this round's rows verifying the suffix draft
        self._suffix_index: torch.Tensor | None = None   # [R] those rows
        self._suffix_tokens: torch.Tensor | None = None  # [R, k] their drafts (a tree's nodes: [R, T-1])
        self._suffix_parents: torch.Tensor | None = None  # [R, T] a tree tier's: their parents
        self._run_model = True                        # whether the model drafts this round (a row takes it)
        self._model_seconds = 0.0                     # this round's host time in the model drafter's calls
        self._catch_up_seconds = 0.0                  # of which its begin_round's (the catch-up)
        self._drafted_eagerly = False                 # whether this round's model draft ran here (not replayed)
        self.model_cost = ModelCost()
        self._point_masses = None                     # the last sampled round's one-hot cells: (draft_probs, index)
        self._shadow_suffix: dict[int, tuple[int, int]] = {}  # tier-0 checks taken by the suffix draft: slot -> (pos, token)
        self.counts: Counter[str] = Counter()         # suffix_rounds / model_rounds and what each accepted

    @classmethod
    @functools.cache
    def over(cls, model_algorithm, second_algorithm) -> type:
        """The class drafting with ``model_algorithm``'s drafter beside ``second_algorithm``'s (SUFFIX)."""
        return type(f"HybridDrafter({model_algorithm.name}+{second_algorithm.name})", (cls,),
                    {"parts": (model_algorithm, second_algorithm)})

    @classmethod
    def build(cls, context) -> "HybridDrafter":
        if not cls.parts:
            raise TypeError("HybridDrafter is built through HybridDrafter.over(model algorithm, SUFFIX)")
        model = cls.parts[0].drafter_class().build(context)
        # tier 0: the model's checks
        suffix = SuffixDrafter(context.slots, SuffixConfig.from_options(context.options), numbers=context.number_tokens)
        return cls(model, suffix, context.slots)

    # ---- what the worker asks of the model drafter ----

    def supports(self, steps: int) -> bool:
        return self.model_drafter.supports(steps)

    def target_view(self, target: torch.nn.Module) -> torch.nn.Module:
        return self.model_drafter.target_view(target)

    def enable_deep_checks(self, steps: frozenset[int]) -> None:
        self.model_drafter.enable_deep_checks(steps)

    def pause_checks(self, paused: bool) -> None:
        self.model_drafter.pause_checks(paused)  # the suffix draft's checks ride on the model's

    def observe_plain_round(self, slot_index, logits, next_tokens, sampling) -> None:
        self.model_drafter.observe_plain_round(slot_index, logits, next_tokens, sampling)

    def eager_forwards(self) -> Forwards:
        return self.model_drafter.eager_forwards()

    def stage_graphs(self, context, steps: int, topk: int = 1) -> Forwards:
        return self.model_drafter.stage_graphs(context, steps, topk)

    def shared_memory_bytes(self) -> int:
        return self.model_drafter.shared_memory_bytes()

    # ---- requests ----

    def prefill(self, batch: PrefillBatch) -> None:
        self.model_drafter.prefill(batch)
        self.suffix.prefill(batch)

    def release(self, slot: int) -> None:
        self.model_drafter.release(slot)
        self.suffix.release(slot)
        self._shadow_suffix.pop(slot, None)

    def flush_cache(self) -> None:
        self.suffix.flush_cache()

    # ---- the choice ----

    def heat(self, slot: int) -> int:
        """The temperature band of ``slot``'s request (HEAT_EDGES): 0 greedy, then 1, 2, 3."""
        params = self.slots.params[slot]
        if params.greedy:
            return 0
        temperature = params.temperature
        return 1 + next((i for i, edge in enumerate(HEAT_EDGES) if temperature < edge), len(HEAT_EDGES))

    def model_expected(self, tier: Tier, heat: int = 0) -> float:
        """The model's accepted drafts per round at ``tier`` in band ``heat`` so far (``_nearest``; MODEL_PRIOR x
        its depth before any)."""
        mean = _nearest(self.expected, tier, heat)
        return MODEL_PRIOR * tier.steps if mean is None else mean

    def suffix_expected(self, tier: Tier, score: float, heat: int = 0) -> float:
        """What a suffix draft of ``score`` is expected to get accepted at ``tier`` in band ``heat``: the score
        times the calibration there (accepted over scored, ``_nearest``; from SUFFIX_PRIOR each)."""
        accepted, scored = _nearest(self.calibration, tier, heat) or (SUFFIX_PRIOR, SUFFIX_PRIOR)
        return score * accepted / scored

    def lookup_expected(self, tier: Tier, match: int, heat: int = 0) -> float:
        """What prompt lookup's chain continuing a match of ``match`` tokens got accepted at ``tier`` in band
        ``heat``: a mean from the whole chain (optimistic: a length never tried is verified where the model's
        draft is not expected to get every draft accepted) counted as one request-round, over at most
        1 / LOOKUP_EMA_ALPHA of them, an EMA after."""
        found = self.lookups.get((tier, heat, match))
        return float(tier.steps) if found is None else found[0]

    def candidate_expected(self, tier: Tier, candidate: tuple, heat: int = 0) -> float:
        """What a suffix candidate (``suffix_candidate``) is expected to get accepted at ``tier`` in band ``heat``."""
        match = candidate[3]
        return self.lookup_expected(tier, match, heat) if match else self.suffix_expected(tier, candidate[2], heat)

    def suffix_candidate(self, slot: int, tier: Tier) -> tuple[list[int], list[int] | None, float, int] | None:
        """SUFFIX's draft at ``tier``, its score and the length of the prompt-lookup match it continues (0: the
        trees'), or None where it has none: at a chain tier SUFFIX's chain (prompt lookup's where it finds one, else
        the trees' best path) padded to k with its last token, and None; at a tree tier the trees' T-1 node tokens
        and parents [T] (padded with copies of the request's last token under the root, as SUFFIX pads a tree)."""
        if not self.suffix._drafting(slot):
            return None
        parents, match = None, 0
        if tier.is_tree:
            tokens, parents, score = self.suffix.scored_suffix_tree(slot, tier.steps, tier.topk, tier.drafts)
        else:
            tokens, score, match = self.suffix.scored_chain(slot, tier.steps)  # (SuffixDrafter.propose's draft)
        return (*self._padded(slot, tier, tokens, parents), score, match) if tokens else None

    def _padded(self, slot: int, tier: Tier, tokens: list[int], parents: list[int] | None):
        """A suffix draft filled to the tier's drafts, as SUFFIX fills it: a chain with its last token (none: the
        request's), a tree with copies of the request's last token under the root (its parents [T], 0 the root's)."""
        pad = tier.drafts - len(tokens)
        last = self.slots.host_tokens[slot][-1]
        if not tier.is_tree:
            return tokens + (tokens[-1:] or [last]) * pad, None
        return tokens + [last] * pad, [0] + (parents or []) + [0] * pad

    def _expectations(self, tier: Tier, candidate: tuple, slot: int) -> tuple[float, float]:
        """What a suffix candidate and the model's draft are expected to get accepted at ``tier`` for ``slot``'s
        request (its temperature band)."""
        heat = self.heat(slot)
        return self.candidate_expected(tier, candidate, heat), self.model_expected(tier, heat)

    def _prefers_suffix(self, tier: Tier, candidate: tuple, slot: int) -> bool:
        """Whether a suffix candidate is expected to get more accepted at ``tier`` than the model's draft."""
        suffix, model = self._expectations(tier, candidate, slot)
        return suffix > model

    def suffix_draft(self, slot: int, tier: Tier) -> tuple[list[int], list[int] | None, float, int] | None:
        """The suffix draft at ``tier`` (``suffix_candidate``) where what it is expected to get accepted (its
        calibrated score; a lookup's mean) beats the model's expectation there, else None; after REFRESH
        request-rounds in a row of one kind where both had a draft
        (``_taken``), the other's turn: the suffix draft after the model's, None after the suffix's, but not where
        the suffix draft is expected to get every draft accepted (no mean of the model's could win that choice:
        the turn waits for a request-round where it could)."""
        found = self._candidate[slot] = self.suffix_candidate(slot, tier)
        if found is None:
            return None
        expected, model = self._expectations(tier, found, slot)
        wins = expected > model
        kind, count = self._streak.get(tier, ("", 0))
        # the other kind's turn, whichever is preferred: its mean is refreshed; but not the model's where the
        # suffix draft is expected to get every draft accepted (no mean of the model's could win that choice)
        if count >= REFRESH and not (kind == "suffix" and expected >= tier.steps):
            wins = kind == "model"
            self._turn[slot] = kind == "suffix"
            self._streak[tier] = ("", 0)  # one request-round's turn, not every request's of this round
        return found if wins else None

    def _taken(self, tier: Tier, kind: str) -> None:
        """A request-round at ``tier`` verified ``kind``'s draft where the other had one too: the streak."""
        last, count = self._streak.get(tier, ("", 0))
        self._streak[tier] = (kind, count + 1 if last == kind else 1)

    def begin_round(self, tier: TierStages, slots: Sequence[int]) -> bool:
        shape, model = tier.tier, self.model_drafter
        self._suffix_rows, self._drafted_eagerly, self.round_graph = [], False, 0
        if not shape.steps:
            model.begin_round(tier, slots)  # tier-0 checks (each catches its request up)
            self.deep_check_due, self._run_model = model.deep_check_due, True
            self._suffix_checks(slots)
            return True
        table, rows, drafts, model_slots, model_rows = self.slots, [], [], [], []
        for row, slot in enumerate(slots):
            self._start[slot] = table.host_seq_lens[slot]
            if table.params[slot].disable_speculative_decoding or table.banned_ids(slot):
                self._chosen[slot] = None  # verifies no draft this round (sampling.PlainRows)
                continue
            self._candidate[slot], self._turn[slot] = None, False
            draft = self.suffix_draft(slot, shape)
            self._chosen[slot] = "model" if draft is None else "suffix"
            if draft is not None:
                rows.append(row)
                drafts.append(draft[:2])
                self._score[slot], self._match[slot] = draft[2:]
            else:
                model_slots.append(slot)
                model_rows.append(row)
        if model_slots and not self._model_pays(shape, slots, model_slots):
            for row, slot in zip(model_rows, model_slots):  # the suffix draft, else the last token repeated
                filler = (*self._padded(slot, shape, [], None), None, 0)
                tokens, parents, self._score[slot], self._match[slot] = self._candidate[slot] or filler
                self._chosen[slot] = "suffix"
                rows.append(row)
                drafts.append((tokens, parents))
            order = sorted(range(len(rows)), key=rows.__getitem__)
            rows, drafts, model_slots = [rows[i] for i in order], [drafts[i] for i in order], []
        for slot in slots:  # the kinds taken, towards the other's turn (a filler counts: the model could have run)
            if self._chosen[slot] == "suffix" or (self._chosen[slot] == "model" and self._candidate[slot] is not None):
                self._taken(shape, self._chosen[slot])
        # the model catches up only the requests that verify its draft (and checks past the chain): the others
        # may stay behind, their features kept (extend), until they verify its draft or tier 0 checks them
        began = time.perf_counter()
        model.begin_round(tier, model_slots)
        self._model_seconds = self._catch_up_seconds = time.perf_counter() - began
        self.deep_check_due = model.deep_check_due
        for slot in slots:
            self._draft_len[slot] = model.draft_len[slot]
        self._suffix_rows = rows
        self._run_model = bool(model_slots)
        if rows:
            device = table.device
            self._suffix_index = torch.tensor(rows, device=device)
            self._suffix_tokens = torch.tensor([tokens for tokens, _ in drafts], dtype=torch.long, device=device)
            self._suffix_parents = torch.tensor([parents for _, parents in drafts], dtype=torch.long,
                                                device=device) if shape.is_tree else None
        self.round_graph = 0 if not rows else None
        if len(rows) == len(slots):  # every request verifies the suffix draft: the drafts go in now (as NGRAM's)
            self.round_graph = SUFFIX_ROUNDS
            tier.draft.draft_tokens[:len(rows)].copy_(self._suffix_tokens)
            if self._suffix_parents is not None:
                tier.verify.layout.parents[:len(rows)].copy_(self._suffix_parents)
        return True

    def _model_pays(self, tier: Tier, slots: Sequence[int], model_slots: Sequence[int]) -> bool:
        """Whether the model drafts this round for ``model_slots`` (the requests that chose its draft): what they
        expect from it over their suffix drafts (calibrated; none: 0), as a share of what the round emits without
        it, against the model's draft steps' cost (``ModelCost.pays``). A request's turn for the model's draft
        (REFRESH) always runs it."""
        if any(self._turn[slot] for slot in model_slots):
            return True
        suffix = {slot: 0.0 if self._candidate[slot] is None
                  else self.candidate_expected(tier, self._candidate[slot], self.heat(slot))
                  for slot in slots if self._chosen[slot] is not None}
        gain = sum(max(self.model_expected(tier, self.heat(slot)) - suffix[slot], 0.0) for slot in model_slots)
        return self.model_cost.pays(tier, gain / sum(1.0 + value for value in suffix.values()))

    def round_graph_drafters(self, steps: int) -> tuple[Drafter, ...]:
        return (_ModelRounds(self), _SuffixRounds(self)) if steps else (_ModelRounds(self),)

    def draft(self, tier: TierStages, forwards: Forwards, slot_index: torch.Tensor, seq_lens: torch.Tensor,
              key_length: int, sampling) -> None:
        if not tier.speculative_num_steps:
            return
        if self._point_masses is not None:  # a reduced draft vocabulary's columns outside it stay 0 (sample_draft)
            self._point_masses[0][self._point_masses[1:]] = 0.0
            self._point_masses = None
        if self._run_model:
            began = time.perf_counter()
            self.model_drafter.draft(tier, forwards, slot_index, seq_lens, key_length, sampling)
            self._model_seconds += time.perf_counter() - began
            self._drafted_eagerly = True
        if not self._suffix_rows:
            return
        rows, tokens = self._suffix_index, self._suffix_tokens
        tier.draft.draft_tokens.index_copy_(0, rows, tokens)
        if self._suffix_parents is not None:  # a tree: its parents (every tree child is a point mass already)
            tier.verify.layout.parents.index_copy_(0, rows, self._suffix_parents)
            return
        if sampling is not None:  # a point mass at each suffix draft: accepted with probability p(d)
            probs = tier.draft.draft_probs
            probs.index_fill_(0, rows, 0.0)
            cells = (rows.unsqueeze(-1), torch.arange(tokens.shape[1], device=tokens.device), tokens)
            probs[cells] = 1.0
            self._point_masses = (probs, *cells)

    def extend(self, tier, forwards, slot_index, seq_lens, positions, target_hidden, accept_lengths, next_tokens,
               key_length) -> None:
        steps = tier.speculative_num_steps
        self._keep_features(tier, slot_index, positions, target_hidden)
        if steps and not self._run_model:  # no request verified the model's draft: it stays behind, caught up later
            return
        # over the verified tokens, whichever drafter drafted them (EAGLE's draft-extend)
        began = time.perf_counter()
        self.model_drafter.extend(tier, forwards, slot_index, seq_lens, positions, target_hidden, accept_lengths,
                                  next_tokens, key_length)
        if steps:
            self._model_seconds += time.perf_counter() - began

    def _keep_features(self, tier: TierStages, slot_index, positions, target_hidden) -> None:
        """A drafting round's verified target features, what a later catch-up of a request left behind reads (an
        EAGLE head's; a standalone draft keeps none)."""
        if tier.speculative_num_steps and self._keeps_features:
            self.model_drafter.keep_verified_features(slot_index, positions, target_hidden)

    def end_round(self, tier: TierStages, slots: Sequence[int]) -> None:
        self.model_drafter.end_round(tier, slots)
        self.suffix.end_round(tier, slots)  # the trees take the committed tokens
        shape = tier.tier
        if not shape.steps:
            return
        self._update_means(shape, slots)
        model = self.model_drafter
        for slot in slots:  # left behind: no draft-extend ran, or it ran over a request already behind
            # (a standalone draft's cache holds its own drafts past m-1 in a suffix row, not the suffix's)
            in_step = self._draft_len[slot] >= self._start[slot] - model.lag  # when the round began
            if not (self._run_model and in_step) or (self._rewinds and self._chosen[slot] == "suffix"):
                model.draft_len[slot] = self._draft_len[slot]

    def _update_means(self, shape: Tier, slots: Sequence[int]) -> None:
        """What each request's draft got accepted this round at ``shape``: the counts, the model's mean, prompt
        lookup's means and the trees' calibration."""
        for slot in slots:
            chosen = self._chosen[slot]
            if chosen is None:
                continue
            accepted = self.slots.host_seq_lens[slot] - self._start[slot] - 1
            self.counts[f"{chosen}_rounds"] += 1
            self.counts[f"{chosen}_accepted"] += accepted
            heat = self.heat(slot)
            if chosen == "model":
                mean = self.model_expected(shape, heat)
                self.expected[shape, heat] = mean + MODEL_EMA_ALPHA * (accepted - mean)
            elif self._match[slot]:  # a lookup's chain
                means = self.lookups.setdefault((shape, heat, self._match[slot]), [float(shape.steps), 1])
                means[1] += 1
                means[0] += max(1.0 / means[1], LOOKUP_EMA_ALPHA) * (accepted - means[0])
            elif self._score[slot] is not None:  # (a filler, the last token repeated, has no score)
                means = self.calibration.get((shape, heat))
                if means is None:  # from the nearest band's
                    means = self.calibration[shape, heat] = list(_nearest(self.calibration, shape, heat)
                                                                 or (SUFFIX_PRIOR, SUFFIX_PRIOR))
                means[0] += SUFFIX_EMA_ALPHA * (accepted - means[0])
                means[1] += SUFFIX_EMA_ALPHA * (self._score[slot] - means[1])

    def tier_surcharge(self, tier: Tier) -> float:
        """The model's part of a round's price at ``tier`` (``ModelCost.price``) at its current share: the policy
        prices every tier at it where it decides, so a tier last timed at another share is not held to it."""
        return self.model_cost.surcharge(tier)

    def round_cost(self, tier: TierStages, seconds: float) -> float:
        if not tier.speculative_num_steps:
            return seconds
        replayed = self._run_model and not self._drafted_eagerly  # the model's part inside a whole-round graph
        return self.model_cost.price(tier.tier, seconds, None if replayed else self._model_seconds, self._run_model,
                                     self._catch_up_seconds)

    def take_deep_checks(self, accept_lengths: Sequence[int], next_tokens: Sequence[int],
                         steps: int) -> list[int] | None:
        checks = self.model_drafter.take_deep_checks(accept_lengths, next_tokens, steps)
        if checks is not None:
            for row in self._suffix_rows:  # the model's draft past the chain was not what these rows verified
                checks[row] = -1
        return checks

    # ---- tier 0: what the hybrid would have accepted at tier 1 ----

    def _suffix_checks(self, slots: Sequence[int]) -> None:
        """Where the model drafter checks tier 1 this round, the suffix draft's first token in its place where the
        hybrid would have verified it."""
        pending = self.model_drafter._pending
        for slot in slots:
            check = pending[slot]
            if check is None or check[0] != len(self.slots.host_tokens[slot]):
                continue  # not checked this round
            self._shadow_suffix.pop(slot, None)
            if self.slots.params[slot].disable_speculative_decoding:
                continue
            # the hybrid's preference at tier 1 (a check takes no turn: turns are drafting rounds')
            found = self.suffix_candidate(slot, TIER_ONE)
            if found is not None and self._prefers_suffix(TIER_ONE, found, slot):
                self._shadow_suffix[slot] = (check[0], found[0][0])

    def take_shadow(self, slots: Sequence[int], drafting: bool):
        checked = [slot for slot in slots if self.model_drafter._pending[slot] is not None]
        shadow = self.model_drafter.take_shadow(slots, drafting)
        overrides = {slot: self._shadow_suffix.pop(slot) for slot in checked if slot in self._shadow_suffix}
        if shadow is None or drafting or not overrides:
            return shadow
        for index, slot in enumerate(checked):  # the model's settled checks, in these slots' order
            if slot in overrides:
                position, token = overrides[slot]
                tokens = self.slots.host_tokens[slot]
                shadow.accept_lengths[index] = int(len(tokens) > position and tokens[position] == token)
        return shadow

    def stats(self) -> dict[str, Any]:
        """The global tree (SUFFIX's) and the hybrid's choices: request-rounds each drafter's draft was verified in,
        the drafts each got accepted, the model's running mean and the suffix score's calibration per tier."""
        counts = self.counts
        return {**self.suffix.stats(), "hybrid": {
            "drafter": self.parts[1].name if self.parts else None,
            "suffix_rounds": counts["suffix_rounds"], "model_rounds": counts["model_rounds"],
            "suffix_accepted": counts["suffix_accepted"], "model_accepted": counts["model_accepted"],
            "model_expected": _by_heat(self.expected),
            "suffix_calibration": _by_heat({key: accepted / scored for key, (accepted, scored)
                                            in self.calibration.items()}),  # accepted per scored
            "lookup_expected": {f"{tier.label} {HEAT_LABELS[heat]} match {match}": round(mean, 3)
                                for (tier, heat, match), (mean, _) in sorted(
                                    self.lookups.items(), key=lambda item: (item[0][0].key, *item[0][1:]))},
            "model_share": round(self.model_cost.share, 3),  # of drafting rounds lately, the policy's price
            "model_seconds": _by_tier(self.model_cost.cost, 6)}}


SUFFIX_ROUNDS = 1  # round_graph_drafters()' all-suffix round


class _ModelRounds(Drafter):
    """The hybrid's greedy round where every request verifies the model's draft, as a whole-round graph records
    it: the model drafter's draft and draft-extend, the verified features kept (as ``HybridDrafter`` runs it)."""

    def __init__(self, hybrid: HybridDrafter):
        self.hybrid = hybrid

    def draft(self, tier, forwards, slot_index, seq_lens, key_length, sampling) -> None:
        self.hybrid.model_drafter.draft(tier, forwards, slot_index, seq_lens, key_length, sampling)

    def extend(self, tier, forwards, slot_index, seq_lens, positions, target_hidden, accept_lengths, next_tokens,
               key_length) -> None:
        self.hybrid._keep_features(tier, slot_index, positions, target_hidden)
        self.hybrid.model_drafter.extend(tier, forwards, slot_index, seq_lens, positions, target_hidden,
                                         accept_lengths, next_tokens, key_length)


class _SuffixRounds(Drafter):
    """The hybrid's greedy drafting round where every request verifies the suffix draft, as a whole-round graph
    records it: the drafts (a tree's parents too) already in the tier's buffers (``HybridDrafter.begin_round``
    wrote them), no model forward, the verified features kept for the model's later catch-up."""

    def __init__(self, hybrid: HybridDrafter):
        self.hybrid = hybrid

    def extend(self, tier, forwards, slot_index, seq_lens, positions, target_hidden, accept_lengths, next_tokens,
               key_length) -> None:
        self.hybrid._keep_features(tier, slot_index, positions, target_hidden)


def _ema(values: dict[Tier, float], tier: Tier, value: float) -> None:
    before = values.get(tier)
    values[tier] = value if before is None else before + MODEL_COST_ALPHA * (value - before)


def _by_tier(values: dict[Tier, float], digits: int) -> dict[str, float]:
    return {tier.label: round(value, digits) for tier, value in sorted(values.items(), key=lambda item: item[0].key)}


def _by_heat(values: dict[tuple[Tier, int], float]) -> dict[str, dict[str, float]]:
    """{tier label: {band label: value}} of a mean kept per (tier, heat)."""
    out: dict[str, dict[str, float]] = {}
    for (tier, heat), value in sorted(values.items(), key=lambda item: (item[0][0].key, item[0][1])):
        out.setdefault(tier.label, {})[HEAT_LABELS[heat]] = round(value, 3)
    return out


def _nearest(values: dict[tuple[Tier, int], Any], tier: Tier, heat: int) -> Any:
    """``values[tier, heat]``, else the value at ``tier`` of the nearest band seen there (the cooler of two as near),
    else None."""
    found = values.get((tier, heat))
    if found is None:
        bands = [(abs(band - heat), band) for shape, band in values if shape == tier]
        if bands:
            found = values[tier, min(bands)[1]]
    return found
