"""The speculative worker: one decode round (draft, verify, draft-extend) for the whole running batch.

Topk = 1 chains. Alignment for a request whose committed tokens are
x_0..x_{m-1} (x_{m-1} sampled but not yet fed to the target):

- target KV is valid through position m-2;
- verify feeds [x_{m-1}, d_1..d_k] at positions m-1..m+k-1 (T = k+1) and
  accepts a drafts plus one correction/bonus token b, so m grows by a+1;
- EAGLE head position j consumes (embed(x_{j+1}), f_j), f_j the target hidden
  at j. Its KV is valid through m-2, and the head output at m-2 (the logits
  for d_1 and the hidden that feeds step 2) is kept per request. Draft step
  i >= 2 feeds (d_{i-1}, previous head hidden) at position m+i-3.
  Draft-extend feeds [d_1..d_a, b] with the verify hidden f_{m-1}..f_{m+a-1}
  at positions m-1..m+a-1, padded to T = k+1 with the rejected drafts; the
  output at index a is next round's step 1. Entries past a are stale and are
  overwritten before they can be read (attention reads positions <= query).
- a standalone draft's KV is valid through m-3; step 1 feeds the two tokens
  [x_{m-2}, x_{m-1}] at m-2, m-1 (rewriting m-2 is harmless), steps 2..k feed
  d_1..d_{k-1}. After accepting a the draft holds x_{m-1}, d_1..d_{a-1} at
  m-1..m+a-2 = m'-3, so no extra forward is needed when all are accepted.
- rollback is forgetting lengths: nothing is copied.

Tier k = 0 verifies [x_{m-1}] alone (plain decoding) and runs no draft at
all: it costs what target-only decoding costs. The draft falls behind (EAGLE
keeps the target features f_{m-1} of those rounds); the first round of a tier
k >= 1 catches each lagging request up before drafting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from specswap.capability import cpu_capability
from specswap.ngram import NumberTokens, propose_ngram
from specswap.sampling import (SamplingParams, accept_draft_tokens, accept_from_logits, accept_greedy, accept_keyed,
                               KeyedNoise, argmax, exponential_, logits_to_probs, position_key, sample_from_probs,
                               sample_keyed)

__all__ = ["EAGLEWorker", "RoundResult", "TierState", "DraftStage", "VerifyStage", "DraftExtendStage",
           "SPECULATIVE_ALGORITHMS", "propose_ngram"]

SPECULATIVE_ALGORITHMS = ("EAGLE", "STANDALONE", "NGRAM", None)
# graph mode captures whole greedy rounds (RoundGraphs) and repacks bf16 weights for targets up to this size by
# default: there a round is a few ms and its Python glue a tenth of it; past it a round is memory-bound, capture
# costs seconds and a packed copy of the weights hundreds of MB
ROUND_GRAPH_MAX_PARAMS = 50_000_000


@dataclass
class DraftStage:
    """Per-tier drafting buffers, built once per tier. The vocabulary-sized ones are views of one buffer
    sized for the largest tier (only one tier runs at a time), so tiers cost no extra memory per vocab row."""

    draft_tokens: torch.Tensor   # [max_batch, k] int64, target ids
    draft_probs: torch.Tensor    # [max_batch, k, V] float32, in target vocabulary (0 outside a token_map)
    draft_noise: torch.Tensor    # [max_batch, k, Vd] float32, Exp(1) draws (1.0 for greedy rows)
    graphs: Any = None           # draft-step StageGraphs, shared by every tier: T=1 (and T=2, standalone step 1)


@dataclass
class VerifyStage:
    """Per-tier verify buffers."""

    input_ids: torch.Tensor        # [max_batch, k+1] int64: [x_{m-1}, d_1..d_k]
    offsets: torch.Tensor          # [k+1] int64: 0..k
    uniforms: torch.Tensor         # [max_batch, k] float32
    residual_noise: torch.Tensor   # [max_batch, V] float32
    graphs: Any = None             # StageGraphs of the target over k+1 tokens (graph mode)


@dataclass
class DraftExtendStage:
    """Per-tier draft-extend buffers."""

    input_ids: torch.Tensor  # [max_batch, k+1] int64: [d_1..d_a, b, stale...]
    graphs: Any = None       # StageGraphs of the EAGLE head over k+1 tokens (graph mode)


@dataclass
class TierState:
    """Everything one tier needs; what a SpecRuntimeState carries for this worker."""

    speculative_num_steps: int
    speculative_num_draft_tokens: int
    draft: DraftStage
    verify: VerifyStage
    draft_extend: DraftExtendStage


@dataclass
class RoundResult:
    """One decode round: per running request (in the order given) its new tokens and accepted drafts."""

    new_tokens: list[list[int]]   # d_1..d_a then the correction/bonus token
    accept_lengths: list[int]     # a, bonus excluded
    speculative_num_steps: int


class EAGLEWorker:
    """Drafts, verifies and draft-extends for a batch of cache slots; implements AdaptiveSpecWorker.

    ``target``: LlamaForCausalLM. ``draft``: an EagleHead (speculative_algorithm "EAGLE"), a
    LlamaForCausalLM with the target's vocabulary ("STANDALONE"), or None: with "NGRAM" the drafts are
    looked up in the request's own prompt and output (``specswap.ngram``; ``ngram_numbers``: the tokenizer's
    digit tokens, which let the lookup extrapolate counters), with speculative_algorithm None it decodes
    target-only, one token per round. Caches hold max_seq_len plus room for the largest tier in
    ``tiers`` (never just the active one), so switching up can never overflow them.
    ``graphs``: replay each stage from graphs captured per tier at start-up; ``round_graphs`` (graph mode
    only; None = auto, on for targets up to ROUND_GRAPH_MAX_PARAMS) also captures each tier's whole greedy
    round (``specswap.graphs.RoundGraphs``), which greedy batches then replay as one tape.
    """

    def __init__(self, target, draft=None, speculative_algorithm: str | None = "EAGLE",
                 speculative_num_steps: int = 3, max_batch_size: int = 8, max_seq_len: int = 512,
                 tiers: Sequence[int] = (), graphs: bool = False, round_graphs: bool | None = None,
                 ngram_numbers: NumberTokens | None = None):
        if speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"speculative_algorithm {speculative_algorithm!r} is not supported; "
                             f"valid: {SPECULATIVE_ALGORITHMS}")
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
        self.draft = draft
        self.speculative_algorithm = speculative_algorithm
        self.speculative_num_steps = speculative_num_steps  # initial tier (AdaptiveSpecWorker protocol)
        self.ngram_numbers = ngram_numbers
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_steps = max((speculative_num_steps, *tiers))
        self.device = target.device
        self.vocab_size = target.config.vocab_size
        self.token_map = getattr(draft, "token_map", None) if speculative_algorithm == "EAGLE" else None
        self.draft_vocab_size = self.vocab_size if self.token_map is None else self.token_map.numel()
        if speculative_algorithm == "STANDALONE" and draft.config.vocab_size != self.vocab_size:
            raise ValueError(f"standalone draft vocab_size {draft.config.vocab_size} does not match the target's "
                             f"{self.vocab_size}")
        # Writes reach position m+k-1 with m <= max_seq_len: room for the largest tier.
        self.cache_capacity = max_seq_len + self.max_steps + 1
        # graph mode: one extra cache row that padded batch rows write into
        cache_rows = max_batch_size + 1 if graphs else max_batch_size
        # a small target's round is a few ms: its Python and per-call kernel overheads are worth capturing away
        small_target = sum(p.numel() for p in target.parameters()) <= ROUND_GRAPH_MAX_PARAMS
        if round_graphs is None:  # auto
            round_graphs = graphs and small_target
        if round_graphs and not graphs:
            raise ValueError("round_graphs=True needs graphs=True")
        self.round_graphs_enabled = bool(round_graphs)
        self._round_graphs: dict[int, Any] = {}  # tier -> RoundGraphs (greedy rounds, graph mode)
        self.target_cache = target.make_cache(cache_rows, self.cache_capacity)
        self.draft_cache = draft.make_cache(cache_rows, self.cache_capacity) if draft is not None else None
        self.graph_context = None
        self._draft_step_graphs = None
        if graphs:
            from specswap.graphs import GraphContext

            self.graph_context = GraphContext(self.device, max_batch_size, self.cache_capacity)
            # bf16 matmuls by weights recorded as oneDNN linears over weights repacked once (same bits, 15-40%
            # faster at decode sizes); the packed copy doubles the weights' memory, so small targets only. The
            # repacking needs oneDNN's bf16 path (AVX-512 or AVX-NE-CONVERT) and raises without it.
            self.graph_context.pool.pack_linear_weights = small_target and cpu_capability().onednn_bf16
            self.graph_context.share_model(target, self.target_cache)
            if draft is not None:
                self.graph_context.share_model(draft, self.draft_cache)

        # Per-slot request state, indexed by cache row.
        long = dict(dtype=torch.long, device=self.device)
        # in graph mode per-slot state has the scratch row too: a round graph's padded rows read and write it
        slot_rows = cache_rows
        self.seq_lens = torch.zeros(slot_rows, **long)     # [S] m: committed tokens
        self.last_tokens = torch.zeros(slot_rows, **long)  # [S] x_{m-1}
        self.prev_tokens = torch.zeros(slot_rows, **long)  # [S] x_{m-2} (standalone step 1)
        self.temperature = torch.zeros(slot_rows, device=self.device)
        self.top_p = torch.ones(slot_rows, device=self.device)
        self.top_k = torch.zeros(slot_rows, **long)
        if speculative_algorithm == "EAGLE":
            hidden_size = target.config.hidden_size
            self.next_draft_logits = torch.zeros(slot_rows, self.draft_vocab_size, dtype=target.dtype,
                                                 device=self.device)  # [S, Vd] head output at m-2
            self.next_draft_hidden = torch.zeros(slot_rows, hidden_size, dtype=target.dtype,
                                                 device=self.device)  # [S, H]
        self.host_seq_lens = [0] * max_batch_size
        self.host_tokens: list[list[int]] = [[] for _ in range(max_batch_size)]  # prompt + output: x_0..x_{m-1}
        # positions 0..draft_len-1 of the draft cache are valid (in step: m-1 for EAGLE, >= m-2 standalone)
        self.draft_len = [0] * max_batch_size
        if speculative_algorithm == "EAGLE" and 0 in (speculative_num_steps, *tiers):
            # f_{m-1} of tier-0 rounds, for the catch-up: [S, capacity, H] (only when tier 0 is a candidate)
            self.tier0_features = torch.zeros(slot_rows, self.cache_capacity, target.config.hidden_size,
                                              dtype=target.dtype, device=self.device)
        self.params: list[SamplingParams | None] = [None] * max_batch_size
        self.generators: list[torch.Generator | None] = [None] * max_batch_size
        self.controller = None  # an AdaptiveController, set by whoever owns one
        self.accept_fn: Callable = accept_draft_tokens
        # NGRAM and target-only decoding draw output position n of a request with noise keyed by (its seed, n)
        # (sampling.accept_keyed): its text then depends on its seed only, not on the tier, the switches or its
        # batch, and NGRAM's equals target-only decoding's
        self.keyed_sampling = speculative_algorithm in ("NGRAM", None)
        self.accept_keyed_fn: Callable = accept_keyed
        self._keyed_seeds = [0] * max_batch_size
        self._prompt_lens = [0] * max_batch_size
        self._keyed_noise = KeyedNoise(self.vocab_size, self.device) if self.keyed_sampling else None  # [V] scratch
        # vocabulary-sized buffers, shared by every tier (each tier holds views): [S, k_max, V], [S, k_max, Vd]
        self._draft_probs = torch.zeros(max_batch_size, self.max_steps, self.vocab_size, device=self.device)
        self._draft_noise = torch.ones(max_batch_size, self.max_steps, self.draft_vocab_size, device=self.device)
        self._residual_noise = torch.ones(max_batch_size, self.vocab_size, device=self.device)
        self.state: TierState | Any = None
        self._tiers: dict[int, TierState] = {}  # built once per tier, shared by the state the controller keeps
        self.apply_runtime_state(self._tier(speculative_num_steps))
        if speculative_algorithm == "NGRAM":
            self._tier(0)  # the plain-decode round that a batch with nothing to look up runs

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
        self.state = state

    @property
    def active_steps(self) -> int:
        """The tier the next round runs."""
        return self.state.speculative_num_steps

    def _tier(self, steps: int) -> TierState:
        """The buffers of tier ``steps``, built on first use (the start-up tier is not built twice)."""
        if steps not in self._tiers:
            if steps > self.max_steps or (steps == 0 and self.speculative_algorithm == "EAGLE"
                                          and not hasattr(self, "tier0_features")):
                raise ValueError(f"tier {steps} is not one the worker was sized for (tiers 0..{self.max_steps}, "
                                 f"tier 0 only if listed); pass it in tiers= when building the worker")
            self._tiers[steps] = self._build_tier(steps)
        return self._tiers[steps]

    def _build_tier(self, steps: int) -> TierState:
        batch, device = self.max_batch_size, self.device
        draft = DraftStage(
            draft_tokens=torch.zeros(batch, steps, dtype=torch.long, device=device),
            draft_probs=self._draft_probs[:, :steps],
            draft_noise=self._draft_noise[:, :steps],
        )
        verify = VerifyStage(
            input_ids=torch.zeros(batch, steps + 1, dtype=torch.long, device=device),
            offsets=torch.arange(steps + 1, device=device),
            uniforms=torch.zeros(batch, steps, device=device),
            residual_noise=self._residual_noise,
        )
        extend = DraftExtendStage(input_ids=torch.zeros(batch, steps + 1, dtype=torch.long, device=device))
        tier = TierState(steps, steps + 1, draft, verify, extend)
        if self.graph_context is not None:
            self._capture_tier(steps, draft, verify, extend)
            if self.round_graphs_enabled:
                from specswap.graphs import RoundGraphs

                self._round_graphs[steps] = RoundGraphs(
                    self.graph_context, steps, lambda slot_index, key_length: self._round_tensors(
                        tier, slot_index, key_length, None, eager=True),
                    self.seq_lens)
                self._round_graphs[steps].capture()
        return tier

    def _capture_tier(self, steps: int, draft: DraftStage, verify: VerifyStage, extend: DraftExtendStage) -> None:
        """Capture this tier's verify and draft-extend forwards (and, once for all tiers, the draft steps)."""
        from specswap.graphs import StageGraphs

        context = self.graph_context
        verify.graphs = StageGraphs(context, "verify", steps, self.target, self.target_cache, steps + 1,
                                    with_features=False)
        verify.graphs.capture()
        eagle = self.speculative_algorithm == "EAGLE"
        if eagle and steps:
            extend.graphs = StageGraphs(context, "draft_extend", steps, self.draft, self.draft_cache, steps + 1,
                                        with_features=True)
            extend.graphs.capture()
        if self.draft is not None and steps:
            if self._draft_step_graphs is None:
                widths = (1,) if eagle else (1, 2)  # standalone step 1 feeds [x_{m-2}, x_{m-1}]
                self._draft_step_graphs = {}
                for width in widths:
                    graphs = StageGraphs(context, "draft", steps, self.draft, self.draft_cache, width,
                                         with_features=eagle)
                    graphs.capture()
                    self._draft_step_graphs[width] = graphs
            draft.graphs = self._draft_step_graphs

    def tier_memory_bytes(self) -> dict[int, int]:
        """Bytes each built tier's graph runners and buffers hold beyond the shared weights and caches."""
        out = {}
        for steps, tier in self._tiers.items():
            nbytes = sum(t.numel() * t.element_size() for t in (tier.draft.draft_tokens, tier.verify.input_ids,
                                                                tier.verify.uniforms, tier.draft_extend.input_ids))
            for graphs in (tier.verify.graphs, tier.draft_extend.graphs, self._round_graphs.get(steps)):
                nbytes += graphs.memory_bytes() if graphs is not None else 0
            out[steps] = nbytes
        if self._draft_step_graphs:
            out["draft_steps_shared"] = sum(g.memory_bytes() for g in self._draft_step_graphs.values())
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
        for slot, request_params, generator in zip(slots, params, generators):
            self.params[slot] = request_params
            self.generators[slot] = generator
            self.temperature[slot] = request_params.temperature
            self.top_p[slot] = request_params.top_p
            self.top_k[slot] = request_params.top_k
        batch, padded_len = len(slots), max(len(p) for p in prompts)
        prompt_lens = torch.tensor([len(p) for p in prompts], device=self.device)            # [B]
        slot_index = torch.tensor(list(slots), device=self.device)                           # [B]
        input_ids = torch.tensor([list(p) + [0] * (padded_len - len(p)) for p in prompts],
                                 dtype=torch.long, device=self.device)                        # [B, P]
        positions = torch.arange(padded_len, device=self.device).expand(batch, -1)           # [B, P]
        rows = torch.arange(batch, device=self.device)
        out = self.target(input_ids, positions, self.target_cache, slot_index, key_length=padded_len,
                          logits_at=prompt_lens - 1)
        last_logits = out.logits[:, 0]                                                        # [B, V]
        probs = logits_to_probs(last_logits, self.temperature[slot_index], self.top_k[slot_index],
                                self.top_p[slot_index], any(p.needs_filter for p in params))  # [B, V]
        if self.keyed_sampling:
            first_tokens = argmax(probs)                                                      # [B] (greedy rows)
            for row, (slot, request_params, generator) in enumerate(zip(slots, params, generators)):
                self._prompt_lens[slot] = len(prompts[row])
                if not request_params.greedy:
                    seed = generator.initial_seed() if generator is not None else int(torch.randint(2 ** 62, ()))
                    self._keyed_seeds[slot] = seed
                    first_tokens[row] = sample_keyed(probs[row].log(), position_key(seed, 0), self._keyed_noise)
        else:
            noise = torch.ones_like(probs)
            for row, (request_params, generator) in enumerate(zip(params, generators)):
                if not request_params.greedy:
                    exponential_(noise[row], generator)
            first_tokens = sample_from_probs(probs, noise)                                    # [B]
        if self.speculative_algorithm == "EAGLE":
            # head position j consumes (x_{j+1}, f_j): tokens x_1..x_P with features f_0..f_{P-1}
            head_ids = torch.cat((input_ids[:, 1:], input_ids[:, :1]), dim=1)                # [B, P]
            head_ids.scatter_(1, (prompt_lens - 1).unsqueeze(-1), first_tokens.unsqueeze(-1))
            head_out = self.draft(head_ids, out.hidden, positions, self.draft_cache, slot_index,
                                  key_length=padded_len)
            self.next_draft_logits[slot_index] = head_out.logits[rows, prompt_lens - 1]
            self.next_draft_hidden[slot_index] = head_out.hidden[rows, prompt_lens - 1]
        elif self.speculative_algorithm == "STANDALONE":
            self.draft(input_ids, positions, self.draft_cache, slot_index, key_length=padded_len)
        self.seq_lens[slot_index] = prompt_lens + 1
        self.last_tokens[slot_index] = first_tokens
        self.prev_tokens[slot_index] = input_ids[rows, prompt_lens - 1]
        for slot, prompt in zip(slots, prompts):
            self.host_seq_lens[slot] = len(prompt) + 1
        for slot, prompt, token in zip(slots, prompts, first_tokens.tolist()):
            self.host_tokens[slot] = [*prompt, token]
            self.draft_len[slot] = len(prompt)
        return first_tokens.tolist()

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
        self.params[slot] = None
        self.generators[slot] = None
        self.host_seq_lens[slot] = 0
        self.host_tokens[slot] = []
        self.draft_len[slot] = 0

    # ---- one decode round ------------------------------------------------------------------------

    @torch.inference_mode()
    def decode_round(self, slots: Sequence[int]) -> RoundResult:
        """Draft k tokens per request, verify them in one target forward, draft-extend, roll back.

        ``slots``: the running requests' cache rows (each prefilled, each with room for k more tokens).
        """
        state = self.state
        steps = state.speculative_num_steps
        batch = len(slots)
        if batch == 0:
            return RoundResult([], [], steps)
        round_start = time.perf_counter()  # the round's cost, for the goodput policy
        proposals = None
        if self.speculative_algorithm == "NGRAM" and steps:
            proposals = [propose_ngram(self.host_tokens[slot], steps, numbers=self.ngram_numbers) for slot in slots]
            if not any(proposals):
                # no request's last token occurs earlier: nothing worth verifying, so this round is a plain
                # decode (tier 0, verify width 1, prebuilt); it tested no tier, so the controller does not see it
                state, steps = self._tiers[0], 0
        key_length = max(self.host_seq_lens[s] for s in slots) + steps  # > every position written this round
        apply_filters = any(self.params[s].needs_filter for s in slots)
        # an all-greedy batch skips building distributions: argmax in, argmax out (same tokens)
        all_greedy = all(self.params[s].greedy for s in slots)
        if steps and self.draft is not None:
            self._catch_up(slots)
        if proposals is not None and steps:
            self._draft_ngram(state, slots, proposals)
        round_graphs = self._round_graphs.get(steps) if all_greedy else None
        if round_graphs is not None:
            # the whole round replayed from one tape: drafts, verify, acceptance, draft-extend, commit
            accept_lengths, next_tokens = round_graphs(slots, key_length)
        else:
            slot_index = torch.tensor(slots, device=self.device)        # [B]
            self._draw_noise(state, slots)
            sampling = None if all_greedy else (self.temperature[slot_index], self.top_k[slot_index],
                                                self.top_p[slot_index], apply_filters)
            accept_lengths, next_tokens = self._round_tensors(state, slot_index, key_length, sampling)
        draft_tokens = state.draft.draft_tokens[:batch]

        accept_list = accept_lengths.tolist()  # the round's one host sync
        draft_list = draft_tokens.tolist()
        next_list = next_tokens.tolist()
        new_tokens = []
        for row, slot in enumerate(slots):
            accepted = accept_list[row]
            self.host_seq_lens[slot] += accepted + 1
            new_tokens.append(draft_list[row][:accepted] + [next_list[row]])
            self.host_tokens[slot].extend(new_tokens[-1])
            if steps:  # the draft is in step again (tier 0 leaves it behind)
                self.draft_len[slot] = self.host_seq_lens[slot] - (1 if self.speculative_algorithm == "EAGLE" else 2)
        if self.controller is not None and self.speculative_algorithm is not None and state is self.state:
            # a switch applies from the next round
            self.controller.on_verify_complete(accept_list, time.perf_counter() - round_start, not all_greedy)
        return RoundResult(new_tokens, accept_list, steps)

    def _round_tensors(self, state, slot_index: torch.Tensor, key_length: int, sampling,
                       eager: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The round on tensors, no host sync: drafts (EAGLE / STANDALONE; NGRAM's are already in place), verify,
        acceptance, draft-extend and the commit of seq_lens / last / previous tokens. Returns (accept_lengths [B],
        next_tokens [B]). ``sampling``: None for an all-greedy batch, else (temperature, top_k, top_p,
        apply_filters) per row. ``eager``: call the models directly even where stage graphs exist (how a round
        graph records the round)."""
        batch, steps = slot_index.shape[0], state.speculative_num_steps
        seq_lens = self.seq_lens[slot_index]                         # [B] m
        draft_tokens = state.draft.draft_tokens[:batch]   # [B, k]
        draft_probs = state.draft.draft_probs[:batch]     # [B, k, V]
        if steps and self.speculative_algorithm == "EAGLE":
            self._draft_eagle(state, slot_index, seq_lens, key_length, sampling, eager)
        elif steps and self.speculative_algorithm == "STANDALONE":
            self._draft_standalone(state, slot_index, seq_lens, key_length, sampling, eager)

        # verify: [x_{m-1}, d_1..d_k] at positions m-1..m+k-1
        verify_ids = state.verify.input_ids[:batch]                   # [B, k+1]
        verify_ids[:, 0] = self.last_tokens[slot_index]
        verify_ids[:, 1:] = draft_tokens
        positions = (seq_lens - 1).unsqueeze(-1) + state.verify.offsets  # [B, k+1]
        if state.verify.graphs is not None and not eager:
            out = state.verify.graphs(verify_ids, positions, slot_index, key_length)
        else:
            out = self.target(verify_ids, positions, self.target_cache, slot_index, key_length=key_length)
        if sampling is None:
            accept_lengths, next_tokens = accept_greedy(out.logits, draft_tokens)  # [B], [B]
        else:
            temperature, top_k, top_p, apply_filters = sampling
            if self.keyed_sampling:
                accept_lengths, next_tokens = self._accept_keyed(out.logits, draft_tokens, slot_index, sampling)
            elif not apply_filters and self.accept_fn is accept_draft_tokens:
                # no top-k/top-p: the same test straight from the logits, building p only where it is read
                accept_lengths, next_tokens = accept_from_logits(
                    out.logits, temperature, draft_tokens, draft_probs,
                    state.verify.uniforms[:batch], state.verify.residual_noise[:batch])
            else:
                target_probs = logits_to_probs(
                    out.logits.reshape(batch * (steps + 1), -1), temperature.repeat_interleave(steps + 1),
                    top_k.repeat_interleave(steps + 1), top_p.repeat_interleave(steps + 1), apply_filters,
                ).view(batch, steps + 1, -1)                                   # [B, k+1, V]
                accept_lengths, next_tokens = self.accept_fn(
                    target_probs, draft_probs, draft_tokens, state.verify.uniforms[:batch],
                    state.verify.residual_noise[:batch])                       # [B], [B]

        if self.speculative_algorithm == "EAGLE":
            if steps:
                self._draft_extend(state, slot_index, positions, out.hidden, accept_lengths, next_tokens, key_length,
                                   eager)
            else:  # keep f_{m-1} for the catch-up
                self.tier0_features[slot_index, seq_lens - 1] = out.hidden[:, 0]

        # commit: m += a + 1; the rejected tail is forgotten, not erased
        self.seq_lens[slot_index] = seq_lens + accept_lengths + 1
        self.prev_tokens[slot_index] = verify_ids.gather(1, accept_lengths.unsqueeze(-1)).squeeze(-1)
        self.last_tokens[slot_index] = next_tokens
        return accept_lengths, next_tokens

    def _accept_keyed(self, logits: torch.Tensor, draft_tokens: torch.Tensor, slot_index: torch.Tensor,
                      sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """accept_keyed per request on the verify's logits [B, k+1, V]: draws keyed by output position for
        sampled rows, the argmax for greedy ones. Host-side per request (a sampled round syncs anyway)."""
        temperature, top_k, top_p, apply_filters = sampling
        drafts = draft_tokens.tolist()
        accepted, tokens = [], []
        for row, slot in enumerate(slot_index.tolist()):
            request = self.params[slot]
            if request.greedy:
                draw = argmax(logits[row]).tolist().__getitem__
            else:
                seed, start = self._keyed_seeds[slot], self.host_seq_lens[slot] - self._prompt_lens[slot]

                def draw(i: int, row: int = row, request: SamplingParams = request, seed: int = seed,
                         start: int = start) -> int:
                    if apply_filters:
                        log_weights = logits_to_probs(logits[row, i:i + 1], temperature[row:row + 1],
                                                      top_k[row:row + 1], top_p[row:row + 1], True)[0].log()
                    else:
                        log_weights = logits[row, i].float() / request.temperature
                    return sample_keyed(log_weights, position_key(seed, start + i), self._keyed_noise)
            row_accepted, token = self.accept_keyed_fn(draw, drafts[row])
            accepted.append(row_accepted)
            tokens.append(token)
        return (torch.tensor(accepted, device=self.device), torch.tensor(tokens, device=self.device))

    def _draw_noise(self, state, slots: Sequence[int]) -> None:
        """Fill this round's random draws from each sampling request's own generator (ones for greedy rows).

        An all-greedy round reads no noise (argmax path); a mixed round refills exactly the region it reads.
        """
        steps = state.speculative_num_steps
        draft, verify = state.draft, state.verify
        sampling_rows = [(row, self.generators[s]) for row, s in enumerate(slots) if not self.params[s].greedy]
        if not sampling_rows or self.keyed_sampling:  # keyed draws are made where they are read
            return
        batch = len(slots)
        if steps:
            draft.draft_noise[:batch].fill_(1.0)
        verify.residual_noise[:batch].fill_(1.0)
        for row, generator in sampling_rows:  # in this order from each request's generator
            if steps:
                exponential_(draft.draft_noise[row], generator)
                verify.uniforms[row].uniform_(generator=generator)
            exponential_(verify.residual_noise[row], generator)

    def _sample_draft(self, state, step: int, logits, sampling) -> torch.Tensor:
        """Draw draft token ``step`` from draft logits [B, Vd]; record it and its law in target vocabulary.

        ``sampling``: (temperature, top_k, top_p, apply_filters) per row, or None for an all-greedy batch
        (argmax; the law is not needed by accept_greedy and is not built).
        """
        batch = logits.shape[0]
        if sampling is None:
            draft_ids = argmax(logits)  # [B]
            tokens = draft_ids if self.token_map is None else self.token_map[draft_ids]
            state.draft.draft_tokens[:batch, step] = tokens
            return tokens
        draft_law = logits_to_probs(logits, *sampling)  # [B, Vd]
        draft_ids = sample_from_probs(draft_law, state.draft.draft_noise[:batch, step])  # [B] draft vocab
        if self.token_map is None:
            state.draft.draft_probs[:batch, step] = draft_law
            tokens = draft_ids
        else:
            # columns outside the map stay 0 forever (zeroed at set-up)
            state.draft.draft_probs[:batch, step].index_copy_(-1, self.token_map, draft_law)
            tokens = self.token_map[draft_ids]
        state.draft.draft_tokens[:batch, step] = tokens
        return tokens

    def _draft_eagle(self, state, slot_index, seq_lens, key_length, sampling, eager=False):
        steps = state.speculative_num_steps
        logits = self.next_draft_logits[slot_index]  # [B, Vd] head output at m-2: the law of d_1
        hidden = self.next_draft_hidden[slot_index]  # [B, H]
        for step in range(steps):
            tokens = self._sample_draft(state, step, logits, sampling)
            if step + 1 < steps:
                # head position m-1+step consumes (d_{step+1}, its own previous hidden)
                positions = (seq_lens - 1 + step).unsqueeze(-1)  # [B, 1]
                if state.draft.graphs is not None and not eager:
                    out = state.draft.graphs[1](tokens.unsqueeze(-1), positions, slot_index, key_length,
                                                hidden.unsqueeze(1))
                else:
                    out = self.draft(tokens.unsqueeze(-1), hidden.unsqueeze(1), positions, self.draft_cache,
                                     slot_index, key_length=key_length)
                logits, hidden = out.logits[:, 0], out.hidden[:, 0]

    def _draft_standalone(self, state, slot_index, seq_lens, key_length, sampling, eager=False):
        steps = state.speculative_num_steps
        # step 1: [x_{m-2}, x_{m-1}] at m-2, m-1
        input_ids = torch.stack((self.prev_tokens[slot_index], self.last_tokens[slot_index]), dim=-1)  # [B, 2]
        positions = (seq_lens - 2).unsqueeze(-1) + torch.arange(2, device=self.device)                   # [B, 2]
        graphs = None if eager else state.draft.graphs
        if graphs is not None:
            out = graphs[2](input_ids, positions, slot_index, key_length)
        else:
            out = self.draft(input_ids, positions, self.draft_cache, slot_index, key_length=key_length)
        for step in range(steps):
            tokens = self._sample_draft(state, step, out.logits[:, -1], sampling)
            if step + 1 < steps:
                positions = (seq_lens + step).unsqueeze(-1)  # d_{step+1} sits at m+step
                if graphs is not None:
                    out = graphs[1](tokens.unsqueeze(-1), positions, slot_index, key_length)
                else:
                    out = self.draft(tokens.unsqueeze(-1), positions, self.draft_cache, slot_index,
                                     key_length=key_length)

    def _catch_up(self, slots: Sequence[int]) -> None:
        """Bring the draft of requests that ran tier-0 rounds back in step, one request at a time (this only
        happens on the first round after a switch up from tier 0)."""
        eagle = self.speculative_algorithm == "EAGLE"
        for slot in slots:
            seq_len = self.host_seq_lens[slot]
            start, end = self.draft_len[slot], seq_len - (1 if eagle else 2)  # positions start..end-1 missing
            if start >= end:
                continue
            tokens = self.host_tokens[slot]
            slot_index = torch.tensor([slot], device=self.device)
            positions = torch.arange(start, end, device=self.device).unsqueeze(0)           # [1, T]
            if eagle:
                # head position j consumes (x_{j+1}, f_j)
                input_ids = torch.tensor([tokens[start + 1:end + 1]], device=self.device)    # [1, T]
                features = self.tier0_features[slot, start:end].unsqueeze(0)                  # [1, T, H]
                out = self.draft(input_ids, features, positions, self.draft_cache, slot_index, key_length=end)
                self.next_draft_logits[slot] = out.logits[0, -1]
                self.next_draft_hidden[slot] = out.hidden[0, -1]
            else:
                input_ids = torch.tensor([tokens[start:end]], device=self.device)            # [1, T]
                self.draft(input_ids, positions, self.draft_cache, slot_index, key_length=end)
            self.draft_len[slot] = end

    def _draft_ngram(self, state, slots: Sequence[int], proposals: list[list[int]]) -> None:
        """Prompt lookup: each request's drafts continue the latest earlier match of its last tokens (a request
        with no match, in a batch where others have one, repeats its last token: it costs no extra width). No
        draft law: sampled rounds accept them against keyed draws (sampling.accept_keyed)."""
        batch = len(slots)
        steps = state.speculative_num_steps
        rows = [proposal or [self.host_tokens[slot][-1]] * steps for proposal, slot in zip(proposals, slots)]
        state.draft.draft_tokens[:batch].copy_(torch.tensor(rows, dtype=torch.long))        # [B, k]

    def _draft_extend(self, state, slot_index, positions, target_hidden, accept_lengths, next_tokens, key_length,
                      eager=False):
        """Head over [d_1..d_a, b] with target features f_{m-1}..f_{m+a-1}; keep its output at index a."""
        batch, steps = positions.shape[0], state.speculative_num_steps
        input_ids = state.draft_extend.input_ids[:batch]  # [B, k+1]
        input_ids[:, :steps] = state.draft.draft_tokens[:batch]
        input_ids.scatter_(1, accept_lengths.unsqueeze(-1), next_tokens.unsqueeze(-1))
        if state.draft_extend.graphs is not None and not eager:
            out = state.draft_extend.graphs(input_ids, positions, slot_index, key_length, target_hidden)
        else:
            out = self.draft(input_ids, target_hidden, positions, self.draft_cache, slot_index,
                             key_length=key_length)
        rows = torch.arange(batch, device=self.device)
        self.next_draft_logits[slot_index] = out.logits[rows, accept_lengths]
        self.next_draft_hidden[slot_index] = out.hidden[rows, accept_lengths]
