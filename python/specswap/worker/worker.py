"""``EAGLEWorker``: the running batch's decode rounds over one target and a drafter, per-tier state.

The worker owns the caches, the slot table and one ``TierState`` per tier, and
runs a round on the host side: the drafter's host part, then the tier's
greedy round graph or its ``Round`` (eager or stage graphs, chosen when the
tier was built), then the one host sync and the bookkeeping. It returns what
the round measured; the policy loop that may switch the tier lives in the
engine. Rollback is forgetting lengths: nothing is copied (a tree tier moves
its accepted path's keys into place, ``worker.layout``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from specswap.capability import cpu_capability
from specswap.ngram import NumberTokens
from specswap.sampling import (LOSSLESS, KeyedNoise, SamplingParams, Verifier, argmax, draw_key, draw_uniform_,
                               logits_to_probs, position_key, sample_from_cdf, sample_keyed)
from specswap.worker.drafter import Drafter, PrefillBatch
from specswap.worker.eagle import EagleDrafter
from specswap.worker.layout import ChainLayout, TreeLayout
from specswap.worker.ngram import NgramDrafter
from specswap.worker.round import Round
from specswap.worker.slots import SlotTable
from specswap.worker.standalone import StandaloneDrafter
from specswap.worker.tiers import EagerForward, TierBuffers, TierState

SPECULATIVE_ALGORITHMS = ("EAGLE", "STANDALONE", "NGRAM", None)
# graph mode captures whole greedy rounds (RoundGraphs) and repacks bf16 weights for targets up to this size by
# default: there a round is a few ms and its Python glue a tenth of it; past it a round is memory-bound, capture
# costs seconds and a packed copy of the weights hundreds of MB
ROUND_GRAPH_MAX_PARAMS = 50_000_000


@dataclass
class RoundResult:
    """What one decode round did and measured, per running request in the order given."""

    new_tokens: list[list[int]]   # d_1..d_a then the correction/bonus token
    accept_lengths: list[int]     # a, bonus excluded
    speculative_num_steps: int    # the tier the round ran
    tier: int                     # the active tier it ran for (NGRAM with nothing to look up runs tier 0 instead)
    round_seconds: float = 0.0    # wall time of the round, host bookkeeping included
    sampled: bool = False         # not all-greedy
    # what drafts of shadow_steps tokens would have accepted, settled this round (Drafter.take_shadow)
    shadow: list[int] = field(default_factory=list)
    shadow_steps: int = 0

    @property
    def measured_tier(self) -> bool:
        """Whether the round tested the active tier (a plain decode run in its place did not)."""
        return self.speculative_num_steps == self.tier


class EAGLEWorker:
    """Drafts, verifies and draft-extends for a batch of cache slots; implements AdaptiveSpecWorker.

    ``target``: LlamaForCausalLM. ``draft``: an EagleHead (speculative_algorithm "EAGLE"), a
    LlamaForCausalLM with the target's vocabulary ("STANDALONE"), or None: with "NGRAM" the drafts are
    looked up in the request's own prompt and output (``specswap.ngram``; ``ngram_numbers``: the tokenizer's
    digit tokens, which let the lookup extrapolate counters), with speculative_algorithm None it decodes
    target-only, one token per round; a callable is a drafter factory (``factory(slot_table) -> Drafter``,
    e.g. a tree drafter). Caches hold max_seq_len plus room for the largest tier in
    ``tiers`` (never just the active one), so switching up can never overflow them.
    ``graphs``: replay each stage from graphs captured per tier at start-up; ``round_graphs`` (graph mode
    only; None = auto, on for targets up to ROUND_GRAPH_MAX_PARAMS) also captures each tier's whole greedy
    round (``specswap.graphs.RoundGraphs``), which greedy batches then replay as one tape. ``verifier``: the
    acceptance rules (``sampling.Verifier``; tests inject biased ones).
    """

    def __init__(self, target, draft=None,
                 speculative_algorithm: str | Callable[[SlotTable], Drafter] | None = "EAGLE",
                 speculative_num_steps: int = 3, max_batch_size: int = 8, max_seq_len: int = 512,
                 tiers: Sequence[int] = (), graphs: bool = False, round_graphs: bool | None = None,
                 ngram_numbers: NumberTokens | None = None, verifier: Verifier = LOSSLESS):
        if not callable(speculative_algorithm) and speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"speculative_algorithm {speculative_algorithm!r} is not supported; "
                             f"valid: {SPECULATIVE_ALGORITHMS} or a drafter factory")
        if speculative_algorithm in ("EAGLE", "STANDALONE") and draft is None:
            raise ValueError(f"speculative_algorithm {speculative_algorithm!r} needs a draft model; got draft=None")
        if speculative_algorithm == "NGRAM" and draft is not None:
            raise ValueError("speculative_algorithm 'NGRAM' drafts from the request's own tokens; pass draft=None")
        if speculative_algorithm is None:
            speculative_num_steps, tiers = 0, ()
        for steps in (speculative_num_steps, *tiers):
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
                raise ValueError(f"speculative_num_steps must be an int >= 0; got {steps!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2; got {max_seq_len}")
        self.target = target
        self.speculative_algorithm = speculative_algorithm
        self.speculative_num_steps = speculative_num_steps  # initial tier (AdaptiveSpecWorker protocol)
        self.ngram_numbers = ngram_numbers
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_steps = max((speculative_num_steps, *tiers))
        self.device = target.device
        self.vocab_size = target.config.vocab_size
        self.verifier = verifier
        # Writes reach position m+k-1 with m <= max_seq_len: room for the largest tier.
        self.cache_capacity = max_seq_len + self.max_steps + 1
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
        self.drafter = self._make_drafter(draft, cache_rows, tier_zero=0 in (speculative_num_steps, *tiers))
        self.keyed_sampling = self.drafter.keyed_sampling
        self.token_map = self.drafter.token_map
        self.graph_context = None
        if graphs:
            from specswap.graphs import GraphContext

            self.graph_context = GraphContext(self.device, max_batch_size, self.cache_capacity)
            # bf16 matmuls by weights recorded as oneDNN linears over weights repacked once (same bits, 15-40%
            # faster at decode sizes); the packed copy doubles the weights' memory, so small targets only. The
            # repacking needs oneDNN's bf16 path (AVX-512 or AVX-NE-CONVERT) and raises without it.
            self.graph_context.pool.pack_linear_weights = small_target and cpu_capability().onednn_bf16
            self.graph_context.share_model(target, self.target_cache)
            if self.drafter.model is not None:
                self.graph_context.share_model(self.drafter.model, self.drafter.cache)
        # NGRAM and target-only decoding draw output position n of a request with noise keyed by (its seed, n)
        # (sampling.accept_keyed): its text then depends on its seed only, not on the tier, the switches or its
        # batch, and NGRAM's equals target-only decoding's
        # (and the tier-0 rounds of drafters with draft laws, by keys from each request's generator)
        self._keyed_noise = KeyedNoise(self.vocab_size, self.device)  # [V] scratch
        self._buffers = TierBuffers(max_batch_size, self.max_steps, self.vocab_size,
                                    self.drafter.vocab_size or self.vocab_size, self.device)
        self._eager = self.drafter.eager_forwards()  # the eager Forwards, shared by every tier
        self._eager.verify = EagerForward(target, self.target_cache, with_features=False)
        self.state: Any = None
        self._tiers: dict[int, TierState] = {}  # built once per tier, shared by the state the controller keeps
        self.apply_runtime_state(self._tier(speculative_num_steps))
        if speculative_algorithm == "NGRAM":
            self._tier(0)  # the plain-decode round that a batch with nothing to look up runs

    def _make_drafter(self, draft, cache_rows: int, tier_zero: bool) -> Drafter:
        algorithm = self.speculative_algorithm
        if callable(algorithm):  # a drafter of the caller's: algorithm(slot table) -> Drafter
            return algorithm(self.slots)
        if algorithm == "EAGLE":
            return EagleDrafter(draft, self.target, self.slots, cache_rows, self.cache_capacity, tier_zero)
        if algorithm == "STANDALONE":
            return StandaloneDrafter(draft, self.target, self.slots, cache_rows, self.cache_capacity)
        if algorithm == "NGRAM":  # with tier 0 among the tiers, its rounds check lookups for the largest tier
            return NgramDrafter(self.slots, self.ngram_numbers, shadow_steps=self.max_steps if tier_zero else 0)
        return Drafter()

    @property
    def draft(self):
        return self.drafter.model

    @property
    def draft_cache(self):
        return self.drafter.cache

    # ---- AdaptiveSpecWorker protocol -------------------------------------------------------------

    def build_adaptive_runtime_state(self, speculative_num_steps: int, speculative_num_draft_tokens: int):
        """Preallocate one tier's buffers and wrap them in the core's immutable SpecRuntimeState."""
        from specswap._core import SpecRuntimeState

        if speculative_num_draft_tokens != speculative_num_steps + 1:
            raise ValueError(f"a top-1 chain verifies speculative_num_steps + 1 tokens; got steps "
                             f"{speculative_num_steps} with {speculative_num_draft_tokens} draft tokens")
        if speculative_num_steps > self.max_steps:
            raise ValueError(f"tier {speculative_num_steps} exceeds the largest tier {self.max_steps} the caches were "
                             f"sized for; pass it in tiers= when building the worker")
        tier = self._tier(speculative_num_steps)
        return SpecRuntimeState(speculative_num_steps, speculative_num_draft_tokens, draft=tier.draft,
                                verify=tier.verify, draft_extend=tier.draft_extend)

    def apply_runtime_state(self, state) -> None:
        """Swap the active tier (a reference swap, between rounds)."""
        self._active = self._tier(state.speculative_num_steps)
        self.state = state

    @property
    def active_steps(self) -> int:
        """The tier the next round runs."""
        return self.state.speculative_num_steps

    def _tier(self, steps: int) -> TierState:
        """Tier ``steps``, built (and in graph mode captured) on first use: the start-up tier is not built twice."""
        if steps not in self._tiers:
            if steps > self.max_steps or not self.drafter.supports(steps):
                raise ValueError(f"tier {steps} is not one the worker was sized for (tiers 0..{self.max_steps}, "
                                 f"tier 0 only if listed); pass it in tiers= when building the worker")
            self._tiers[steps] = self._build_tier(steps)
        return self._tiers[steps]

    def _build_tier(self, steps: int) -> TierState:
        parents = self.drafter.tree_parents(steps)
        layout = ChainLayout(steps, self.device) if parents is None else \
            TreeLayout(parents, self.target_cache, self.device, self.drafter.keyed_sampling)
        if len(layout.offsets) != steps + 1:
            raise ValueError(f"tier {steps}'s draft tree has {len(layout.offsets) - 1} nodes; it must have {steps}")
        tier = self._buffers.build(steps, layout)
        eager = self._eager
        if layout.tree_mask is not None:
            eager = replace(eager, verify=EagerForward(self.target, self.target_cache, False, layout.tree_mask))
        context = self.graph_context
        if context is None:
            tier.round = Round(tier, self.slots, self.drafter, eager, self.verifier)
            return tier
        from specswap.graphs import RoundGraphs, StageGraphs

        verify = StageGraphs(context, "verify", steps, self.target, self.target_cache, steps + 1, with_features=False,
                             tree_mask=layout.tree_mask)
        verify.capture()
        forwards = self.drafter.stage_graphs(context, steps)
        forwards.verify = verify
        tier.round = Round(tier, self.slots, self.drafter, forwards, self.verifier)
        if self.round_graphs_enabled:  # the same round with the models called directly, recorded as one tape
            tier.round_graph = RoundGraphs(context, steps, Round(tier, self.slots, self.drafter, eager,
                                                                 self.verifier), self.slots.seq_lens)
            tier.round_graph.capture()
        return tier

    def tier_memory_bytes(self) -> dict[int | str, int]:
        """Bytes each built tier's graph runners and buffers hold beyond the shared weights and caches."""
        out: dict[int | str, int] = {}
        for steps, tier in self._tiers.items():
            forwards = tier.round.forwards
            graphs = (forwards.verify, forwards.draft_extend, tier.round_graph)
            out[steps] = tier.buffer_bytes() + sum(g.memory_bytes() for g in graphs if g is not None)
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
        probs = logits_to_probs(out.logits[:, 0], table.temperature[slot_index], table.top_k[slot_index],
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

        ``slots``: the running requests' cache rows (each prefilled, each with room for k more tokens).
        """
        active = tier = self._active
        if not slots:
            return RoundResult([], [], tier.speculative_num_steps, tier.speculative_num_steps)
        round_start = time.perf_counter()  # the round's cost, for the goodput policy
        table = self.slots
        if not self.drafter.begin_round(tier, slots):
            # nothing worth verifying (NGRAM: no request's last token occurs earlier): a plain decode, tier 0
            tier = self._tiers[0]
        steps = tier.speculative_num_steps
        key_length = max(table.host_seq_lens[s] for s in slots) + steps  # > every position written this round
        # an all-greedy batch skips building distributions: argmax in, argmax out (same tokens)
        all_greedy = table.all_greedy(slots)
        if all_greedy and tier.round_graph is not None:
            # the whole round replayed from one tape: drafts, verify, acceptance, draft-extend, commit
            accept_lengths, next_tokens = tier.round_graph(slots, key_length)
        else:
            slot_index = torch.tensor(slots, device=self.device)        # [B]
            sampling = None if all_greedy else table.sampling(tier, slots, slot_index, self._keyed_noise,
                                                                        self.keyed_sampling)
            accept_lengths, next_tokens = tier.round(slot_index, key_length, sampling)

        accept_list = accept_lengths.tolist()  # the round's one host sync
        draft_list = tier.draft.draft_tokens[:len(slots)].tolist()
        next_list = next_tokens.tolist()
        new_tokens = [drafts[:accepted] + [token]                     # d_1..d_a, b
                      for drafts, accepted, token in zip(draft_list, accept_list, next_list)]
        table.commit_round(slots, new_tokens)
        self.drafter.end_round(tier, slots)
        shadow = self.drafter.take_shadow(slots, drafting=steps > 0)
        return RoundResult(new_tokens, accept_list, steps, active.speculative_num_steps,
                           time.perf_counter() - round_start, not all_greedy, shadow, self.drafter.shadow_steps)
