"""``SpeculativeWorker``: the running batch's decode rounds over one target and a drafter.

The worker owns the caches, the slot table and the C++ state pool that holds
one state per tier (its stages and the round that runs them), and runs a
round on the host side: the drafter's host part, then the active tier's
greedy round graph or its ``Round`` (eager or stage graphs, chosen when the
tier was built), then the one host sync and the bookkeeping. It returns what
the round measured; the policy that may switch the pool's active tier is the
adaptive controller's. Rollback is forgetting lengths: nothing is copied (a tree tier moves
its accepted path's keys into place, ``worker.layout``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from specswap.capability import cpu_capability
from specswap.prompt_lookup import NumberTokens
from specswap.sampling import (LOSSLESS, KeyedNoise, SamplingParams, Verifier, argmax, draw_key, draw_uniform_,
                               logits_to_probs, position_key, sample_from_cdf, sample_keyed)
from specswap._core import SpecRuntimeState, StatePool, tier_key, tier_shape
from specswap.algorithms import algorithm
from specswap.tier import Tier
from specswap.worker.drafter import Drafter, DrafterContext, PrefillBatch, Shadow
from specswap.worker.layout import ChainLayout, TreeLayout, tree_shape
from specswap.worker.round import Round
from specswap.worker.slots import SlotTable
from specswap.worker.tiers import EagerForward, TierBuffers, TierRound

# graph mode captures whole greedy rounds (RoundGraphs) and repacks bf16 weights for targets up to this size by
# default: there a round is a few ms and its Python glue a tenth of it; past it a round is memory-bound, capture
# costs seconds and a packed copy of the weights hundreds of MB
ROUND_GRAPH_MAX_PARAMS = 50_000_000


@dataclass
class RoundResult:
    """What one decode round did and measured, per running request in the order given."""

    new_tokens: list[list[int]]   # d_1..d_a then the correction/bonus token
    accept_lengths: list[int]     # a, bonus excluded
    tier: Tier                    # the active tier the round ran for
    ran: Tier                     # the tier that ran: ``tier``, or tier 0 in its place (NGRAM with nothing to look up)
    # the round's cost for the policy: its wall time, host bookkeeping included (Drafter.round_cost: the hybrid's
    # model drafter priced at its share of rounds)
    round_seconds: float = 0.0
    sampled: bool = False         # not all-greedy
    # per request: whether it speculates (False: speculation off for it, disable_speculative_decoding)
    speculating: list[bool] = field(default_factory=list)
    shadow: Shadow | None = None  # the drafter's part: its tier-0 checks settled this round (Drafter.take_shadow)
    # a plain decode run in a drafting tier's place: the seconds the drafter spent finding nothing to verify
    # (NGRAM's lookups), a cost of being at that tier that the plain decode itself is not
    lookup_seconds: float = 0.0
    # a tree round's chain (``TreeLayout``: the path of first children, what the chain of the tree's depth would
    # have drafted), per request: its drafts accepted, and its depth in the tree (drafted up to there); None for
    # a chain, or a tree whose drafts were drawn from a law (the chain's draws differ)
    chain_accept_lengths: list[int] | None = None
    chain_depths: list[int] | None = None
    # a chain round that checked one draft past the chain (Drafter.take_deep_checks), per request: 1 / 0 what the
    # next deeper chain would have accepted there, -1 unchecked (the request fell short of the chain); else None
    deep_checks: list[int] | None = None
    # a cost some rounds of a tier pay at a rate that moves faster than the tier is timed (Drafter.tier_surcharge:
    # the hybrid's model drafter at its current share of rounds), Tier -> seconds; None: none. ``round_seconds``
    # includes it at this round's tier (``surcharge_seconds`` of it): a policy fed the round alone (data parallelism's
    # merged rounds carry no surcharge) prices the tier as timed; the controller takes it out and has the policy
    # price every tier at its current surcharge where it decides
    tier_surcharge: Callable[[Tier], float] | None = None
    surcharge_seconds: float = 0.0

    @property
    def measured_tier(self) -> bool:
        """Whether the round tested the active tier (a plain decode run in its place did not)."""
        return self.ran == self.tier

    @property
    def drafts_verified(self) -> list[int]:
        """Drafts each request had verified this round (0 for a plain decode or a request with speculation off)."""
        drafts = self.ran.draft_tokens - 1
        return [drafts if on else 0 for on in self.speculating]


class SpeculativeWorker:
    """Drafts, verifies and draft-extends for a batch of cache slots, over one target and one drafter.

    ``target``: a causal LM. ``speculative_algorithm``: a name (``specswap.algorithms``: "EAGLE" with an EagleHead
    as ``draft``, "STANDALONE" with a draft model of the target's vocabulary, "NGRAM" drafting from the request's
    own tokens, None: target-only, one token per round) or a drafter factory (``factory(slot_table) ->
    Drafter``, e.g. a tree drafter). ``number_tokens``: the tokenizer's digit tokens, for a drafter that
    extrapolates counters (NGRAM). ``drafter_options``: the algorithm's own settings (``Algorithm.options``; SUFFIX's
    trees). Caches hold max_seq_len plus room for the largest of ``tiers`` (never just
    the active one), so switching up can never overflow them.

    Every tier (``speculative_num_steps`` and ``tiers``) is built at start-up, its stages and round registered in
    the C++ state pool (``self.pool``); a round runs the pool's active state (one acquire), so switching is
    ``pool.activate(tier)`` between rounds (the adaptive controller's, or a caller's).
    ``graphs``: replay each stage from graphs captured per tier at start-up; ``round_graphs`` (graph mode
    only; None = auto, on for targets up to ROUND_GRAPH_MAX_PARAMS) also captures each tier's whole greedy
    round (``specswap.graphs.RoundGraphs``), which greedy batches then replay as one tape. ``verifier``: the
    acceptance rules (``sampling.Verifier``; tests inject biased ones).
    """

    def __init__(self, target, draft=None,
                 speculative_algorithm: str | Callable[[SlotTable], Drafter] | None = "EAGLE",
                 speculative_num_steps: int = 3, max_batch_size: int = 8, max_seq_len: int = 512,
                 tiers: Sequence[int] = (), graphs: bool = False, round_graphs: bool | None = None,
                 number_tokens: NumberTokens | None = None, verifier: Verifier = LOSSLESS,
                 speculative_eagle_topk: int = 1, speculative_num_draft_tokens: int | None = None,
                 drafter_options: dict | None = None):
        spec = None if callable(speculative_algorithm) else algorithm(speculative_algorithm)
        if spec is not None and spec.needs_draft and draft is None:
            raise ValueError(f"speculative_algorithm {spec.name!r} needs {spec.draft_model}; got draft=None")
        if spec is not None and not spec.needs_draft and draft is not None:
            raise ValueError(f"speculative_algorithm {spec.flag!r} uses no draft model; pass draft=None")
        if spec is not None and spec.name is None:
            speculative_num_steps, tiers, speculative_eagle_topk, speculative_num_draft_tokens = 0, (), 1, None
        for steps in (speculative_num_steps, *tiers):
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
                raise ValueError(f"speculative_num_steps must be an int >= 0; got {steps!r}")
        # the start-up tier's shape: a chain (topk 1), or a draft tree of that depth, width and node budget; every
        # tier is known by its key (_core.tier_key: a chain's step count, a tree's encoded shape)
        self.start_shape = tree_shape(speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens)
        self.start_key = tier_key(*self.start_shape)
        shapes = {self.start_key: self.start_shape}
        for key in tiers:
            shapes[key] = tuple(tier_shape(key))
            if shapes[key][1] > 1:
                tree_shape(*shapes[key])  # a tree's key names a valid shape, or this names what is wrong
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2; got {max_seq_len}")
        self.target = target
        self.speculative_algorithm = speculative_algorithm
        self.number_tokens = number_tokens
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_steps = max(steps for steps, _, _ in shapes.values())
        self.device = target.device
        self.vocab_size = target.config.vocab_size
        self.verifier = verifier
        # Writes reach position m+k-1 with m <= max_seq_len: room for the largest tier (a tree: its nodes in the
        # target's cache, the frontier nodes a drafter stores in its own)
        margin = max(max(steps, nodes - 1, steps * topk if topk > 1 else 0) for steps, topk, nodes in shapes.values())
        self.cache_capacity = max_seq_len + margin + 1
        # graph mode: one extra cache (and slot table) row that padded batch rows read and write
        cache_rows = max_batch_size + 1 if graphs else max_batch_size
        # a small target's round is a few ms: its Python and per-call kernel overheads are worth capturing away
        small_target = sum(p.numel() for p in target.parameters()) <= ROUND_GRAPH_MAX_PARAMS
        if round_graphs is None:  # auto
            round_graphs = graphs and small_target
        if round_graphs and not graphs:
            raise ValueError("round_graphs=True needs graphs=True")
        self.round_graphs_enabled = bool(round_graphs)
        self.target_cache = target.make_cache(cache_rows, self.cache_capacity)
        self.slots = SlotTable(cache_rows, max_batch_size, self.device)
        all_tiers = tuple(sorted({steps for steps, _, _ in shapes.values()}))  # every depth
        if callable(speculative_algorithm):  # a drafter of the caller's: algorithm(slot table) -> Drafter
            self.drafter = speculative_algorithm(self.slots)
        else:
            self.drafter = spec.drafter_class().build(DrafterContext(
                draft, target, self.slots, cache_rows, self.cache_capacity, all_tiers, number_tokens,
                dict(drafter_options or {})))
        chains = {steps for steps, topk, _ in shapes.values() if topk == 1 and steps > 0}
        self.drafter.enable_deep_checks(frozenset(steps for steps in chains if steps + 1 in chains))
        trees = [shape for shape in shapes.values() if shape[1] > 1]
        if trees and not self.drafter.drafts_trees:
            raise ValueError(f"draft tree {trees[0]} (speculative_eagle_topk {trees[0][1]}): "
                             f"{type(self.drafter).__name__} drafts chains only; EAGLE, STANDALONE and NGRAM draft "
                             f"trees")
        # the target as prefill and verify call it (an EAGLE-3 drafter's returns the auxiliary hidden states)
        target = self.target = self.drafter.target_view(target)
        self.keyed_sampling = self.drafter.keyed_sampling
        self.token_map = self.drafter.token_map
        self.graph_context = self._graph_context(target, small_target) if graphs else None
        # NGRAM and target-only decoding draw output position n of a request with noise keyed by (its seed, n)
        # (sampling.accept_keyed): its text then depends on its seed only, not on the tier, the switches or its
        # batch, and NGRAM's equals target-only decoding's
        # (and the tier-0 rounds of drafters with draft laws, by keys from each request's generator)
        self._keyed_noise = KeyedNoise(self.vocab_size, self.device)  # [V] scratch
        self._buffers = TierBuffers(max_batch_size, self.max_steps, self.vocab_size,
                                    self.drafter.vocab_size or self.vocab_size, self.device)
        self._eager = self.drafter.eager_forwards()  # the eager Forwards, shared by every tier
        self._eager.verify = EagerForward(target, self.target_cache, with_features=False)
        # every tier built (and in graph mode captured) once, here; the pool holds them and the active one
        self.pool = StatePool()
        self.rounds: dict[int, TierRound] = {}  # each tier's round (its stages, driver and graph), by key
        self.tier_build_seconds: dict[int, float] = {}  # each tier's build (graph mode: its captures), by key
        for key in sorted(shapes):
            self._register(key)
        # a drafter that finds nothing worth verifying (NGRAM) runs a plain decode, tier 0, in the tier's place
        self._plain_round = None
        if self.drafter.plain_fallback:
            self._plain_round = self.rounds[0] if 0 in self.rounds else self._register(0)
        self.pool.activate(self.start_key)

    def _graph_context(self, target, small_target: bool):
        """Graph mode's shared context: the models' weights and caches every tier's captures read."""
        from specswap.graphs import GraphContext

        context = GraphContext(self.device, self.max_batch_size, self.cache_capacity)
        # bf16 matmuls by weights recorded as oneDNN linears over weights repacked once (same bits, faster at
        # decode sizes); the packed copy doubles the weights' memory, so small targets only. The repacking
        # needs oneDNN's bf16 path (AVX-512 or AVX-NE-CONVERT) and raises without it.
        context.pool.pack_linear_weights = small_target and cpu_capability().onednn_bf16
        context.share_model(target, self.target_cache)
        if self.drafter.model is not None:
            context.share_model(self.drafter.model, self.drafter.cache)
        return context

    def _register(self, key: int) -> TierRound:
        steps, topk, nodes = tier_shape(key)
        if steps > self.max_steps or not self.drafter.supports(steps):
            raise ValueError(f"tier {steps} is not one the worker can run (tiers 0..{self.max_steps}, tier 0 only if "
                             f"listed); pass it in tiers= when building the worker")
        start = time.perf_counter()
        round_ = self.rounds[key] = self._build_round(steps, topk, nodes)
        self.tier_build_seconds[key] = time.perf_counter() - start
        stages = round_.stages
        self.pool.register(SpecRuntimeState(steps, stages.speculative_num_draft_tokens, draft=stages.draft,
                                            verify=stages.verify, draft_extend=stages.draft_extend, round=round_,
                                            speculative_eagle_topk=topk))
        return round_

    @property
    def active_tier(self) -> int:
        """The key of the tier the next round runs (the pool's active state)."""
        return self.pool.active_tier

    @property
    def tiers(self) -> list[int]:
        """Every tier the worker built."""
        return self.pool.tiers()

    def _build_round(self, steps: int, topk: int, nodes: int) -> TierRound:
        if topk > 1:  # a drafter's tree, a new one every round
            layout = TreeLayout(nodes, steps, self.target_cache, self.device, self.max_batch_size)
        else:
            parents = self.drafter.tree_parents(steps)  # a fixed tree of ``steps`` nodes, or None: a chain
            layout = ChainLayout(steps, self.device) if parents is None else \
                TreeLayout.fixed(parents, self.target_cache, self.device, self.max_batch_size)
            if layout.num_draft_tokens != steps + 1:
                raise ValueError(f"tier {steps}'s draft tree has {layout.num_draft_tokens - 1} nodes; it must have "
                                 f"{steps}")
        stages = self._buffers.build(steps, layout, topk)
        eager = self._eager
        context = self.graph_context
        if context is None:
            return TierRound(stages, Round(stages, self.slots, self.drafter, eager, self.verifier))
        from specswap.graphs import RoundGraphs, StageGraphs

        tree_nodes = None if layout.tree_mask is None else stages.speculative_num_draft_tokens
        verify = StageGraphs(context, "verify", steps, self.target, self.target_cache, stages.speculative_num_draft_tokens,
                             with_features=False, tree_nodes=tree_nodes)
        verify.capture()
        forwards = self.drafter.stage_graphs(context, steps, topk)
        forwards.verify = verify
        round_ = TierRound(stages, Round(stages, self.slots, self.drafter, forwards, self.verifier))
        if self.round_graphs_enabled:  # the same round with the models called directly, recorded as one tape
            round_.graphs = tuple(RoundGraphs(context, stages, Round(stages, self.slots, drafter, eager, self.verifier),
                                              self.slots.seq_lens, self.target)
                                  for drafter in self.drafter.round_graph_drafters(steps))
            for graph in round_.graphs:
                graph.capture()
        return round_

    def tier_shapes(self) -> dict[int, tuple[int, int, int]]:
        """Each built tier's (speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens), by key."""
        return {key: round_.stages.shape for key, round_ in self.rounds.items()}

    def tier_memory_bytes(self) -> dict[int | str, int]:
        """Bytes each built tier's graph runners and buffers hold beyond the shared weights and caches."""
        out: dict[int | str, int] = {key: round_.memory_bytes() for key, round_ in self.rounds.items()}
        if self.drafter.shared_memory_bytes():
            out["draft_steps_shared"] = self.drafter.shared_memory_bytes()
        if self.graph_context is not None and self.graph_context.pool.derived_bytes:
            out["packed_weights_shared"] = self.graph_context.pool.derived_bytes
        return out

    # ---- requests --------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                generators: Sequence[torch.Generator | None] | None = None) -> list[int]:
        """Run prompts through target (and draft) in cache rows ``slots``; return each one's first new token.

        Prompts of different lengths share one forward, right-padded: padding lands at positions past a
        prompt's end, which no real token attends to and the next round overwrites.
        """
        generators = list(generators) if generators is not None else [None] * len(slots)
        if not (len(slots) == len(prompts) == len(params) == len(generators)):
            raise ValueError(f"prefill needs one prompt, params and generator per slot; got {len(slots)} slots, "
                             f"{len(prompts)} prompts, {len(params)} params, {len(generators)} generators")
        for slot, prompt in zip(slots, prompts):
            self.check_prompt(prompt)
            if not 0 <= slot < self.max_batch_size:
                raise ValueError(f"slot {slot} is out of range; valid slots are 0..{self.max_batch_size - 1}")
        if not slots:
            return []
        table = self.slots
        table.admit(slots, params, generators)
        batch, padded_len = len(slots), max(len(p) for p in prompts)
        prompt_lens = torch.tensor([len(p) for p in prompts], device=self.device)            # [B]
        slot_index = torch.tensor(list(slots), device=self.device)                           # [B]
        input_ids = torch.tensor([list(p) + [0] * (padded_len - len(p)) for p in prompts],
                                 dtype=torch.long, device=self.device)                        # [B, P]
        positions = torch.arange(padded_len, device=self.device).expand(batch, -1)           # [B, P]
        rows = torch.arange(batch, device=self.device)
        out = self.target(input_ids, positions, self.target_cache, slot_index, key_length=padded_len,
                          logits_at=prompt_lens - 1)
        logits = out.logits[:, 0]                                                             # [B, V]
        banned = [(row, ids) for row, (slot, p) in enumerate(zip(slots, params))
                  if (ids := table.banned_ids(slot))]
        if banned:  # min_new_tokens: the first token is not EOS or a stop id
            logits = logits.clone()
            for row, ids in banned:
                logits[row, list(ids)] = -math.inf
        probs = logits_to_probs(logits, table.temperature[slot_index], table.top_k[slot_index],
                                table.top_p[slot_index], any(p.needs_filter for p in params))  # [B, V]
        first_tokens = self._first_tokens(probs, slots, params, generators)                   # [B]
        self.drafter.prefill(PrefillBatch(slots, prompts, slot_index, input_ids, positions, prompt_lens, rows,
                                          out.hidden, first_tokens, padded_len))
        table.commit_prefill(slots, prompts, slot_index, prompt_lens, input_ids[rows, prompt_lens - 1], first_tokens)
        return first_tokens.tolist()

    def _first_tokens(self, probs: torch.Tensor, slots, params, generators) -> torch.Tensor:
        """Each request's first token from its law after the prompt [B, V]: keyed by output position 0 for keyed
        sampling, else drawn as a round's last token is (``sample_from_cdf``, one uniform from its generator; a
        greedy row's one-hot law gives its argmax)."""
        if self.keyed_sampling:
            first_tokens = argmax(probs)                                                      # [B] (greedy rows)
            for row, (slot, request_params, generator) in enumerate(zip(slots, params, generators)):
                if not request_params.greedy:
                    seed = generator.initial_seed() if generator is not None else draw_key(None)
                    self.slots.keyed_seeds[slot] = seed
                    first_tokens[row] = sample_keyed(probs[row].log(), position_key(seed, 0), self._keyed_noise)
            return first_tokens
        uniforms = torch.zeros(probs.shape[0], device=probs.device)
        for row, (request_params, generator) in enumerate(zip(params, generators)):
            if not request_params.greedy:
                draw_uniform_(uniforms[row:row + 1], generator)
        return sample_from_cdf(probs, uniforms)

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise ValueError naming the problem if a prompt cannot be served."""
        prompt_len = len(prompt_ids)
        if not 1 <= prompt_len < self.max_seq_len:
            raise ValueError(f"prompt of {prompt_len} tokens does not fit; it needs 1..{self.max_seq_len - 1} tokens "
                             f"(max_seq_len {self.max_seq_len})")
        bad = [t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < self.vocab_size)]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary 0..{self.vocab_size - 1}")

    def release(self, slot: int) -> None:
        """Forget a finished or aborted request; its cache row is free for the next one."""
        self.slots.release(slot)
        self.drafter.release(slot)

    # ---- one decode round ------------------------------------------------------------------------

    @torch.inference_mode()
    def decode_round(self, slots: Sequence[int]) -> RoundResult:
        """Draft k tokens per request, verify them in one target forward, accept, draft-extend, commit.

        ``slots``: the running requests' cache rows (each prefilled, each with room for k more tokens). The
        round runs the pool's active state; a request with speculation off (``disable_speculative_decoding``)
        takes part in the same forward and takes the target's own token after x_{m-1}, as a tier-0 round would.
        """
        active = self.pool.acquire().round  # the one acquire: the active tier's stages and round
        round_ = active
        if not slots:
            return RoundResult([], [], active.stages.tier, active.stages.tier)
        round_start = time.perf_counter()  # the round's cost, for the goodput policy
        table = self.slots
        lookup_seconds = 0.0
        if not self.drafter.begin_round(round_.stages, slots):
            # nothing worth verifying (NGRAM: no request's last token occurs earlier): a plain decode, tier 0
            round_ = self._plain_round
            lookup_seconds = time.perf_counter() - round_start
        stages = round_.stages
        steps = stages.speculative_num_steps
        key_length = max(table.host_seq_lens[s] for s in slots) + stages.writes_past  # > every position written
        # an all-greedy batch skips building distributions: argmax in, argmax out (same tokens)
        all_greedy = table.all_greedy(slots)
        plain = table.plain_rows(slots, drafting=steps > 0)  # speculation off (drafting rounds) or short of min tokens
        graph = self.drafter.round_graph
        if all_greedy and plain is None and round_.graphs and graph is not None and not self.drafter.deep_check_due:
            # the whole round replayed from one tape: drafts, verify, acceptance, draft-extend, commit
            accept_lengths, next_tokens = round_.graphs[graph](slots, key_length)
        else:
            slot_index = torch.tensor(slots, device=self.device)        # [B]
            sampling = None if all_greedy else table.sampling(stages, slots, slot_index, self._keyed_noise,
                                                                        self.keyed_sampling)
            if plain is not None:
                plain = table.plain_draws(plain, slots, self._keyed_noise, self.keyed_sampling)
            accept_lengths, next_tokens = round_.run(slot_index, key_length, sampling, plain)

        accept_list = accept_lengths.tolist()  # the round's one host sync
        draft_list = stages.draft.draft_tokens[:len(slots)].tolist()
        next_list = next_tokens.tolist()
        new_tokens = [drafts[:accepted] + [token]                     # d_1..d_a, b
                      for drafts, accepted, token in zip(draft_list, accept_list, next_list)]
        table.commit_round(slots, new_tokens)
        self.drafter.end_round(stages, slots)
        shadow = self.drafter.take_shadow(slots, drafting=steps > 0)
        deep_checks = self.drafter.take_deep_checks(accept_list, next_list, steps)
        speculating = [True] * len(slots) if plain is None else [row not in plain.rows for row in range(len(slots))]
        chain_accepted = chain_depths = None
        if stages.speculative_eagle_topk > 1 and (all_greedy or self.keyed_sampling):
            layout = stages.verify.layout
            chain_accepted = layout.chain_accepted[:len(slots)].tolist()
            chain_depths = layout.chain_depth[:len(slots)].tolist()
        seconds = self.drafter.round_cost(stages, time.perf_counter() - round_start)
        surcharge = self.drafter.tier_surcharge
        return RoundResult(new_tokens, accept_list, active.stages.tier, stages.tier, seconds,
                           not all_greedy, speculating, shadow, lookup_seconds, chain_accepted, chain_depths,
                           deep_checks, surcharge, 0.0 if surcharge is None else surcharge(stages.tier))
