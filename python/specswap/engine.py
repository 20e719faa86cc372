"""The engine: requests in, tokens out, with continuous batching over a speculative worker.

A request waits in a FIFO queue until a cache slot is free, joins the running
batch with a prefill, takes part in one decode round per ``step()``, and leaves
when it hits EOS, a stop string, its token budget or ``abort()``. Requests
never share randomness: each has its own seeded generator. The engine owns the
adaptive controller (when enabled) and hands it each round's result; the
controller switches the worker's state pool between rounds. It never imports
a server.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from specswap.algorithms import algorithm
from specswap.loading import resolve_checkpoint, resolve_dtype  # re-exported: callers import them from here
from specswap.huge_pages import place_on_huge_pages
from specswap.prompt_lookup import NumberTokens
from specswap.sampling import SamplingParams
from specswap.tier import Tier
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key, tree_shape

logger = logging.getLogger(__name__)

__all__ = ["Engine", "RequestOutput", "StepOutput", "resolve_dtype", "resolve_checkpoint", "encode_text"]

DEFAULT_MAX_SEQ_LEN = 2048
# joining requests are prefilled together, right-padded, in groups of at most this many (padded) tokens
PREFILL_TOKEN_BUDGET = 8192


@dataclass
class RequestOutput:
    """A request's state as the engine reports it; ``finish_reason`` is None while it runs."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]                  # generated tokens only (an EOS that ended the request included)
    text: str                             # decoded tokens, cut before a matched stop string
    finish_reason: str | None             # "length" | "stop" | "abort" | "error" | None
    num_verify_rounds: int
    accept_lengths: list[int]             # accepted draft tokens per verify round, bonus excluded
    num_draft_tokens: int = 0             # drafts verified for this request over its rounds (0 with speculation off)
    error: str | None = None              # finish_reason "error": what failed while serving this request alone

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepOutput:
    """What one ``step()`` did: the outputs of every request that changed (running ones with their text so far;
    each finished one exactly once) and the tier its decode round ran for (the active tier: a switch the
    policy makes after the round applies from the next step)."""

    outputs: list[RequestOutput]
    tier: int

    @property
    def finished(self) -> list[RequestOutput]:
        return [output for output in self.outputs if output.finished]


@dataclass
class _Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int                       # max_new_tokens capped by what fits in max_seq_len
    generator: torch.Generator | None
    slot: int | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    accept_lengths: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0             # drafts verified for it over its rounds
    stop_string_hit: bool = False         # text was cut at a stop string
    error: str | None = None              # a fault while serving it alone (finish_reason "error")

    def append(self, tokens: list[int], eos_token_ids: frozenset[int], tokenizer: Any) -> int:
        """Add a round's tokens, stopping at EOS, the token budget or a stop string (sets finish_reason);
        returns how many were taken before a stop."""
        taken = 0
        params = self.params
        for token in tokens:
            self.token_ids.append(token)
            taken += 1
            if (token in eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
                self.finish_reason = "stop"  # (masked while short of min_new_tokens: never drawn then)
                break
            if len(self.token_ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
        if params.stop and tokenizer is not None and len(self.token_ids) >= params.min_new_tokens:
            self._cut_at_stop_string(tokenizer, len(tokens))
        return taken

    def _cut_at_stop_string(self, tokenizer: Any, num_new: int) -> None:
        """Cut at the first stop string that ends past the request's first ``min_new_tokens`` tokens."""
        text = tokenizer.decode(self.token_ids)
        floor = len(tokenizer.decode(self.token_ids[:self.params.min_new_tokens])) if self.params.min_new_tokens else 0
        hits = [(at, s) for s in self.params.stop if (at := text.find(s, max(floor - len(s) + 1, 0))) >= 0]
        if not hits:
            return
        cut, _ = min(hits)
        # keep the shortest token prefix whose text reaches the stop string
        for keep in range(max(len(self.token_ids) - num_new, self.params.min_new_tokens, 0), len(self.token_ids) + 1):
            prefix_text = tokenizer.decode(self.token_ids[:keep])
            if any(s in prefix_text[max(floor - len(s) + 1, 0):] for s in self.params.stop):
                del self.token_ids[keep:]
                break
        self.finish_reason = "stop"
        self.stop_string_hit = True
        self.text = text[:cut]

    def output(self, tokenizer: Any) -> RequestOutput:
        text = self.text
        if self.finish_reason is None and tokenizer is not None:
            text = tokenizer.decode(self.token_ids)
        return RequestOutput(self.request_id, list(self.prompt_ids), list(self.token_ids), text,
                             self.finish_reason, len(self.accept_lengths), list(self.accept_lengths),
                             self.num_draft_tokens, self.error)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a string prompt, with BOS when the tokenizer has one (how the engine tokenizes)."""
    return tokenizer.encode(text, add_bos=tokenizer.bos_token_id is not None)


def _hybrid_round_graphs(shape, tp_size: int, round_graphs: bool | None, disable_graphs: bool) -> bool | None:
    """A hybrid's checks (chains, one process per tensor group); its ``round_graphs``: off, said once (the draft
    is chosen per request on the host, so its rounds run from stage graphs, never as one recorded round)."""
    if shape[1] > 1:
        raise ValueError("hybrid_drafter drafts chains: speculative_eagle_topk must be 1 (and the adaptive config "
                         "without candidate_trees)")
    if tp_size != 1:
        raise ValueError("hybrid_drafter runs in one process or under data parallelism (dp_size); tensor "
                         "parallelism (tp_size > 1) is not supported with it")
    if round_graphs:
        raise ValueError("round_graphs=True: a hybrid_drafter chooses each request's draft on the host, so its "
                         "rounds run from stage graphs, not whole-round graphs")
    if not disable_graphs and not _HYBRID_SAID:
        _HYBRID_SAID.append(True)
        logger.warning("specswap: hybrid drafting runs each round from its stages' graphs, not one whole-round graph "
                       "(the draft is chosen per request on the host)")
    return None if disable_graphs else False


_HYBRID_SAID: list[bool] = []  # the round-graph line logged once a process


def prefill_groups(requests: list, token_budget: int) -> list[list]:
    """Split joining requests, in order, into groups whose padded size (count x longest prompt) fits the
    budget; a prompt longer than the budget goes alone."""
    groups: list[list] = []
    for request in requests:
        if groups:
            group = groups[-1]
            longest = max(len(request.prompt_ids), *(len(r.prompt_ids) for r in group))
            if (len(group) + 1) * longest <= token_budget:
                group.append(request)
                continue
        groups.append([request])
    return groups


class Engine:
    """Serve generate() / add_request()+step() over one target, with EAGLE, a standalone draft, NGRAM
    (prompt lookup, no draft model) or no speculation.

    ``model``: a checkpoint directory, a zoo name ("tiny"), or a LlamaForCausalLM already built (then
    ``draft`` must be a built model too and ``tokenizer`` may be given; ``dtype``/``device`` are not
    applied). With a zoo name and no ``draft``, "<name>-eagle" (EAGLE) or "<name>-draft" (STANDALONE)
    is used. ``speculative_adaptive_config`` (path or dict) requires ``speculative_adaptive=True``; without one the
    default policy runs: goodput with tier 0, its tiers chosen for this machine (``adaptive_config``).
    ``disable_graphs=True`` (``--disable-cuda-graph``) runs the worker eagerly instead of replaying the
    stage graphs captured at start-up. ``weights`` ("auto", "native", "bf16", "fp32"): "native" keeps a GGUF
    model's matrices in the file's block formats, computed by ggml's CPU kernels ("auto": native for GGUF models
    on CPU when ggml is installed; see ``resolve_weights``). ``draft_quantization`` ("auto", "none", "int8",
    "q8_0"): the EAGLE head's linears as weight-only int8 ("auto" on CPU in bf16, where a head step is bound by
    reading its weights) or as ggml Q8_0 blocks ("auto" with native target weights); the output is the target's
    either way, only the acceptance can move. A built head is quantized, in place, only when named. ``round_graphs`` (None = auto: on for targets up to 50M parameters) also captures each tier's whole
    greedy round as one graph (docs/graphs.md). ``ngram_numbers``: NGRAM drafts extrapolate counters (``id = 4``
    after ``id = 2``, ``id = 3``) where the tokenizer writes numbers one digit per token (``specswap.prompt_lookup``);
    False copies them as plain prompt lookup does. ``speculative_eagle_topk`` > 1 drafts a tree of depth
    ``speculative_num_steps`` verifying ``speculative_num_draft_tokens`` tokens (the root included; default
    steps x topk + 1) as SGLang's flags do, for every drafter: EAGLE and standalone keep each depth's top-k
    children by path probability (EAGLE-2), NGRAM a trie of lookups (docs/trees.md). The adaptive config's
    ``candidate_trees`` puts trees among the policy's tiers (the goodput policy).

    ``row_costs`` ("auto", "off" or {rows: relative cost}): under the goodput policy the verify's cost per row
    count is measured once where the engine starts ("auto", cached on disk, ``worker.row_cost``;
    ``SPECSWAP_ROW_COSTS=off`` skips it) and prices the tiers never timed; the adaptive config's
    ``"candidate_trees": "auto"`` takes its trees from it (docs/trees.md). "off" keeps ``cost_prior_slope``'s prior
    (said once); a mapping is used as given.

    ``tp_size`` / ``dp_size`` (> 1 under torchrun; README, "Several processes"): the target sharded over
    ``tp_size`` ranks whose first rank (``is_leader``) takes requests while the others call ``follow()``, in ``dp_size`` groups that
    each run their own requests; every rank's adaptive policy sees the same merged observations, so tier
    switches agree (``min_dwell_rounds`` steps at least between two, default 8). ``dist_timeout``: seconds any
    collective waits for a peer before a ``RankFailure`` naming it (default ``SPECSWAP_DIST_TIMEOUT`` or 60).
    ``tp_draft``: where a tensor-parallel engine's drafts come from: "replicate" (the default for a draft model
    or head: every rank runs all of it), "shard" (split like the target), for NGRAM "leader" (the default: the
    first rank looks up and broadcasts) or "replicate" (every rank looks up; the step checksum compares them).

    ``hybrid_drafter="SUFFIX"`` with EAGLE, EAGLE3 or STANDALONE: SUFFIX's trees draft beside the model, and each
    round verifies, per request, the suffix draft where its score beats the model's mean accepted drafts at the tier,
    the model's elsewhere (``worker.hybrid``; chains; ``stats()["hybrid"]`` counts the choices).

    ``suffix_decoding_max_tree_depth`` (24), ``suffix_decoding_max_cached_requests`` (10000),
    ``suffix_decoding_max_spec_factor`` (1.0), ``suffix_decoding_min_token_prob`` (0.1): SUFFIX's trees, as
    vLLM's speculative_config names them, None for their defaults (``worker.suffix``; docs/suffix.md).
    """

    def __init__(self, model: Any, draft: Any = None, speculative_algorithm: str | None = "EAGLE",
                 speculative_num_steps: int = 3, speculative_adaptive: bool = False,
                 speculative_adaptive_config: Any = None, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = "auto", max_batch_size: int = 8, max_seq_len: int | None = None,
                 tokenizer: Any = None, disable_graphs: bool = False, draft_quantization: str = "auto",
                 round_graphs: bool | None = None, ngram_numbers: bool = True, weights: str = "auto",
                 speculative_eagle_topk: int = 1, speculative_num_draft_tokens: int | None = None,
                 tp_size: int = 1, dp_size: int = 1, dist_timeout: float | None = None,
                 min_dwell_rounds: int | None = None, tp_draft: str | None = None,
                 row_costs: str | Mapping[int, float] = "auto", suffix_decoding_max_tree_depth: int | None = None,
                 suffix_decoding_max_cached_requests: int | None = None,
                 suffix_decoding_max_spec_factor: float | None = None,
                 suffix_decoding_min_token_prob: float | None = None, hybrid_drafter: str | None = None):
        spec = algorithm(speculative_algorithm)
        drafting = spec.hybrid(hybrid_drafter)  # what the worker drafts with: spec, or a hybrid ("EAGLE+SUFFIX")
        drafter_options = drafting.drafter_options(  # SUFFIX's (None: its default), refused for other algorithms
            suffix_decoding_max_tree_depth=suffix_decoding_max_tree_depth,
            suffix_decoding_max_cached_requests=suffix_decoding_max_cached_requests,
            suffix_decoding_max_spec_factor=suffix_decoding_max_spec_factor,
            suffix_decoding_min_token_prob=suffix_decoding_min_token_prob)
        shape = tree_shape(speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens)
        if shape[1] > 1 and spec.name is None:
            raise ValueError("speculative_eagle_topk > 1 needs a speculative_algorithm (EAGLE, STANDALONE or NGRAM)")
        if drafting.parts is not None:
            round_graphs = _hybrid_round_graphs(shape, tp_size, round_graphs, disable_graphs)
        self._dist = None  # a distributed.Lockstep when tp_size or dp_size > 1
        if tp_size != 1 or dp_size != 1:
            from specswap.distributed.lockstep import Lockstep, join
            self._dist = Lockstep(join(tp_size, dp_size, dist_timeout, device, eager=disable_graphs))
        elif dist_timeout is not None or min_dwell_rounds is not None:
            raise ValueError("dist_timeout and min_dwell_rounds apply to distributed engines; pass tp_size or "
                             "dp_size > 1 (under torchrun) or leave them unset")
        if tp_draft is not None and tp_size == 1:
            raise ValueError("tp_draft places the drafts of a tensor-parallel engine; pass tp_size > 1 (under "
                             "torchrun) or leave it unset")
        tp_draft = self.tp_draft = spec.tp_draft(tp_draft)
        if speculative_adaptive_config is not None and not speculative_adaptive:
            raise ValueError("speculative_adaptive_config was given but speculative_adaptive is False; pass "
                             "speculative_adaptive=True to use it (the config is never silently ignored)")
        if speculative_adaptive and spec.name is None:
            raise ValueError("speculative_adaptive=True needs a speculative_algorithm ('EAGLE', 'STANDALONE' or "
                             "'NGRAM'); got None")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1; got {max_batch_size!r}")
        adaptive = None  # adaptive_config.AdaptiveSetting: its "auto" tiers are chosen once the row costs are known
        if speculative_adaptive:  # validated before any weights load; None: the default policy for this drafter
            from specswap.adaptive_config import engine_adaptive_config
            adaptive = engine_adaptive_config(speculative_adaptive_config, model_drafter=spec.needs_draft)
        from specswap.worker.row_cost import check_request
        check_request(row_costs)
        target, draft, self.tokenizer, self.weights = self._load(model, draft, speculative_algorithm, device, dtype,
                                                                 tokenizer, draft_quantization, weights)
        max_positions = target.config.max_position_embeddings
        if max_seq_len is None:
            max_seq_len = min(max_positions, DEFAULT_MAX_SEQ_LEN)
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or not 2 <= max_seq_len <= max_positions:
            raise ValueError(f"max_seq_len must be an int in 2..{max_positions} (the model's max_position_embeddings); "
                             f"got {max_seq_len!r}")
        self.speculative_algorithm = spec.name
        self.max_seq_len = max_seq_len
        self.max_batch_size = max_batch_size
        self.target, self.draft = target, draft
        if self._dist is None:  # CPU weights before costs are measured and graphs captured (distributed: sharded)
            place_on_huge_pages(target, draft)
        self.row_costs = None  # worker.row_cost.RowCosts: the goodput policy's prior and "auto" trees
        adaptive_config = None if adaptive is None else adaptive.config
        if adaptive_config is not None and adaptive_config.policy == "goodput":
            adaptive_config = self._follow_row_costs(row_costs, adaptive)

        self.controller = None
        tiers = () if adaptive_config is None else (  # the chains and the trees the policy chooses among, by key
            *adaptive_config.candidate_steps, *(tier_key(*tree) for tree in adaptive_config.candidate_trees))
        if self._dist is not None:  # every rank's configuration checked, then the target sharded (in place)
            self._dist.prepare(self, tiers=tiers, start_tier=tier_key(*shape), adaptive_config=adaptive_config,
                               disable_graphs=disable_graphs, tp_draft=tp_draft)
            target, draft = self.target, self.draft
            place_on_huge_pages(target, draft)  # the shards (no rank measures row costs: they are given)
        # graphs: every stage of every tier captured once here (specswap.graphs); disable_graphs runs eagerly
        numbers = None  # NGRAM drafts extrapolate counters where the tokenizer writes digits one per token
        if spec.number_tokens and ngram_numbers and self.tokenizer is not None:
            numbers = NumberTokens.from_tokenizer(self.tokenizer)
        with contextlib.nullcontext() if self._dist is None else self._dist.starting(self, tp_draft):  # barrier
            self.worker = SpeculativeWorker(target, draft, drafting.name, speculative_num_steps, max_batch_size,
                                            max_seq_len, tiers=tiers, graphs=not disable_graphs,
                                            round_graphs=None if disable_graphs else round_graphs,
                                            number_tokens=numbers, speculative_eagle_topk=shape[1],
                                            speculative_num_draft_tokens=shape[2], drafter_options=drafter_options)
        if speculative_adaptive:
            from specswap.controller import AdaptiveController
            self.controller = AdaptiveController(self.worker.pool, adaptive_config,
                                                 shadows=bool(self.worker.drafter.shadow_steps),
                                                 row_costs=None if self.row_costs is None else self.row_costs.costs)
            if self._dist is not None:  # fed the merged observations of every rank, once a step
                self.controller = self._dist.agree(self.controller, self.worker, min_dwell_rounds)

        eos = set(getattr(self.tokenizer, "eos_token_ids", None) or ()) or set(target.config.eos_token_id or ())
        self.eos_token_ids = frozenset(eos)
        self.worker.slots.eos_token_ids = tuple(sorted(eos))  # what min_new_tokens masks
        self._ids = itertools.count()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._free_slots = list(range(max_batch_size - 1, -1, -1))
        # finished outputs no step() has returned yet: requests that finished inside generate() for another caller
        self._finished: dict[int, RequestOutput] = {}
        self._rounds_per_tier: Counter[int] = Counter()
        self._accepted_total = 0
        self._verified_total = 0
        self._generated_tokens = 0
        self._busy_seconds = 0.0
        self._request_faults = 0  # requests ended by a fault of their own (_fail)

    def _follow_row_costs(self, request, adaptive):
        """The verify's row costs (measured, cached or given; None when skipped or failed, said once) into
        ``self.row_costs``, and the config with its "auto" chains and trees chosen from them (one log line)."""
        from specswap.worker.row_cost import resolve_row_costs
        self.row_costs = resolve_row_costs(request, self.target, self.weights, distributed=self._dist is not None)
        config = adaptive.for_machine(self.row_costs)
        logger.info("specswap: %s", adaptive.describe(config, self.row_costs))
        return config

    # ---- loading ---------------------------------------------------------------------------------

    @staticmethod
    def _load(model, draft, algorithm, device, dtype, tokenizer, draft_quantization, weights):
        from specswap.loading import load_models, prepare_built
        if isinstance(model, torch.nn.Module):
            draft, built_weights = prepare_built(model, draft, algorithm, weights, draft_quantization)
            return model, draft, tokenizer, built_weights
        loaded = load_models(model, draft, algorithm or "NONE", dtype, device, draft_quantization, weights, tokenizer)
        return loaded.target, loaded.draft, loaded.tokenizer, loaded.weights

    # ---- requests --------------------------------------------------------------------------------

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids for a prompt: a string is tokenized (with BOS when the tokenizer has one)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("string prompts need a tokenizer; pass token ids or Engine(..., tokenizer=...)")
            return encode_text(self.tokenizer, prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt):
            raise ValueError(f"a prompt must be a string or a list of token ids; got {type(prompt).__name__}")
        return list(prompt)

    def _make_request(self, prompt, params: SamplingParams) -> _Request:
        """Validate everything up front so that a bad request never reaches the running batch."""
        prompt_ids = self.encode(prompt)
        self.check_prompt(prompt_ids)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.worker.device)
            if params.seed is None:
                generator.seed()
            else:
                generator.manual_seed(params.seed)
        max_tokens = min(params.max_new_tokens, self.max_seq_len - len(prompt_ids))
        return _Request(next(self._ids), prompt_ids, params, max_tokens, generator)

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kwargs) -> int:
        """Queue a request; returns its id. Sampling settings come as a SamplingParams or as keywords
        (max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos)."""
        if not self.is_leader:
            raise RuntimeError("a tensor-parallel follower takes no requests: call follow() (the leader's "
                               "requests reach it)")
        if params is None:
            params = SamplingParams(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either params or sampling keywords, not both; got keywords {sorted(kwargs)}")
        request = self._make_request(prompt, params)
        self._waiting.append(request)
        return request.request_id

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a queued or running request (finish_reason "abort"); returns its final output, or None if it is
        unknown or done."""
        for request in self._waiting:
            if request.request_id == request_id:
                self._waiting.remove(request)
                self._finish(request, "abort")
                return self._finished.pop(request_id)
        if self._dist is not None:
            self._dist.note_abort(request_id)
        for request in self._running:
            if request.request_id == request_id:
                self._finish(request, "abort")
                self._running.remove(request)
                return self._finished.pop(request_id)
        return None

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise ValueError naming the problem if a prompt (token ids) cannot be served."""
        self.worker.check_prompt(prompt_ids)

    # what callers read of the worker: the tier the next round runs, the largest tier, whether sampled tokens
    # are keyed by (seed, output position) (NGRAM, target-only), each tier's graph and buffer bytes
    current_steps = property(lambda self: self.worker.active_steps)
    max_steps = property(lambda self: self.worker.max_steps)
    keyed_sampling = property(lambda self: self.worker.keyed_sampling)

    def tier_memory_bytes(self) -> dict[int | str, int]:
        return self.worker.tier_memory_bytes()

    def tier_report(self) -> list[dict[str, Any]]:
        """What each built tier adds, as SGLang reports its graphs: its shape, the bytes its buffers and graph
        runners hold beyond the shared weights and caches, and the seconds its build (graph capture) took."""
        memory = self.worker.tier_memory_bytes()
        return [{"tier": key, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
                 "speculative_num_draft_tokens": nodes, "memory_bytes": memory[key],
                 "build_seconds": round(self.worker.tier_build_seconds[key], 4)}
                for key, (steps, topk, nodes) in sorted(self.worker.tier_shapes().items())]

    def has_unfinished(self) -> bool:
        """Whether a request is queued or running (distributed with an adaptive policy: on any rank, since every
        rank takes part in every step's agreement)."""
        return bool(self._waiting or self._running) or (self._dist is not None and self._dist.peers_busy)

    # ---- distributed (tp_size / dp_size > 1) ----------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether this rank takes requests (always, unless a tensor-parallel follower)."""
        return self._dist is None or self._dist.leader

    def follow(self) -> None:
        """A tensor-parallel follower's loop: run every step the leader runs, until its ``shutdown()`` (with an
        adaptive policy: until every data-parallel leader's); then leave the group (``DistributedGroup.close``)."""
        from specswap.distributed.lockstep import Stopped
        if self.is_leader:
            raise RuntimeError("follow() is for tensor-parallel followers (ranks with tp_rank > 0); this rank leads")
        try:
            while not self._dist.finished:
                self._step()
        except Stopped:
            pass
        self._dist.close()

    def keepalive_due(self) -> bool:
        """Whether an idle owner of this engine should still call ``step()``: a distributed engine's ranks take
        every step together (a tensor-parallel follower waits for its leader's, every rank for the agreement), so
        an idle loop steps, cheaply, rather than leave its peers waiting past their timeout."""
        return self._dist is not None and self._dist.lockstep_steps

    def shutdown(self) -> None:
        """A leader ends its group's part in the job and leaves it (a no-op in one process): its followers return
        from ``follow()``; with an adaptive policy it steps (idle) until every data-parallel leader shut down, and
        every rank leaves after the same step (``Lockstep.stop``)."""
        if self._dist is not None:
            try:
                self._dist.stop(self)
            finally:
                self._dist.close()

    # ---- the loop --------------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """Admit waiting requests into free slots (prefill), run one decode round, retire finished ones.

        Returns the outputs of every request that changed in this step, each finished one exactly once (with
        any that finished inside another caller's generate()), and the tier the round ran for.
        """
        tier = self.worker.active_steps
        outputs = [self._finished.pop(r.request_id, None) or self._output(r) for r in self._step()]
        outputs.extend(self._finished.values())
        self._finished.clear()
        return StepOutput(outputs, tier)

    def _step(self) -> list[_Request]:
        if self._dist is not None:  # a tensor-parallel leader announces, its followers apply
            self._dist.begin_step(self)
        start = time.perf_counter()
        updated: list[_Request] = []
        admitted = []
        while self._waiting and self._free_slots:
            request = self._waiting.popleft()
            request.slot = self._free_slots.pop()
            admitted.append(request)
        for group in prefill_groups(admitted, PREFILL_TOKEN_BUDGET):
            first_tokens = self._forward(self.worker.prefill, [r.slot for r in group], [r.prompt_ids for r in group],
                                         [r.params for r in group], [r.generator for r in group])
            for request, token in zip(group, first_tokens):
                self._running.append(request)
                self._guarded(request, self._append, request, [token])
                updated.append(request)
        decoding = [r for r in self._running if r.finish_reason is None]
        result = None
        if decoding:
            result = self._forward(self.worker.decode_round, [r.slot for r in decoding])
            self._rounds_per_tier[result.ran_tier] += 1  # by key: a chain's steps, a tree's encoded shape
            if self.controller is not None and self._dist is None:
                self.controller.observe(result)  # may switch the pool's tier: the next round runs it
            for request, tokens, accepted, drafts, speculating in zip(
                    decoding, result.new_tokens, result.accept_lengths, result.drafts_verified, result.speculating):
                request.accept_lengths.append(accepted)
                request.num_draft_tokens += drafts
                if speculating:  # a request with speculation off is no acceptance observation
                    self._accepted_total += accepted
                    self._verified_total += 1
                self._guarded(request, self._append, request, tokens)
                if request not in updated:
                    updated.append(request)
        for request in [r for r in self._running if r.finish_reason is not None]:
            self._running.remove(request)
            self._free_slot(request)
        if self._dist is not None:  # every rank, busy or not: the step's agreement
            self._dist.end_step(result, bool(self._waiting or self._running))
        self._busy_seconds += time.perf_counter() - start
        return updated

    def _forward(self, fn, *args):
        """``fn(*args)``; a tensor-parallel rank's failure inside it (a replayed graph's collective) diagnosed."""
        return fn(*args) if self._dist is None else self._dist.forward(fn, *args)

    def _guarded(self, request: _Request, fn, *args) -> None:
        """``fn(*args)``, a part of serving ``request`` alone (its stop checks, its detokenization): a fault there
        ends that request (finish_reason "error", slot freed at the step's end) and the batch goes on."""
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - the fault stays with its request
            self._fail(request, error)

    def _output(self, request: _Request) -> RequestOutput:
        """A running request's output (its text decoded so far), or, if decoding it fails, its failure's."""
        self._guarded(request, lambda: self._finished.setdefault(request.request_id, request.output(self.tokenizer)))
        return self._finished.pop(request.request_id)

    def _fail(self, request: _Request, error: Exception) -> None:
        """End ``request`` for a fault of its own: logged in one line, counted (``stats()["request_faults"]``), its
        final output carries the error; a tensor-parallel leader's followers drop it too (as an abort)."""
        message = f"{type(error).__name__}: {error}"
        logger.error("specswap: request %d failed and was ended, the batch goes on: %s", request.request_id, message)
        self._request_faults += 1
        request.finish_reason, request.error = "error", message
        if self._dist is not None:
            self._dist.note_abort(request.request_id)
        if request in self._waiting:
            self._waiting.remove(request)
        if request in self._running:
            self._running.remove(request)
            self._free_slot(request)
        self._finished[request.request_id] = RequestOutput(
            request.request_id, list(request.prompt_ids), list(request.token_ids), request.text, "error",
            len(request.accept_lengths), list(request.accept_lengths), request.num_draft_tokens, message)

    def _append(self, request: _Request, tokens: list[int]) -> None:
        self._generated_tokens += request.append(tokens, self.eos_token_ids, self.tokenizer)
        if request.finish_reason is not None:
            self._finish(request, request.finish_reason)

    def _finish(self, request: _Request, reason: str) -> None:
        request.finish_reason = reason
        if self.tokenizer is not None and not request.stop_string_hit:
            request.text = self.tokenizer.decode(request.token_ids)
        if request.slot is not None and reason == "abort":
            self._free_slot(request)
        self._finished[request.request_id] = request.output(self.tokenizer)

    def _free_slot(self, request: _Request) -> None:
        if request.slot is not None:
            self.worker.release(request.slot)
            self._free_slots.append(request.slot)
            request.slot = None

    # ---- convenience -----------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, max_new_tokens: int = 16,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, ignore_eos: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (one result each, in order). Prompt i is seeded with seed + i.
        ``ignore_eos``: run every prompt to ``max_new_tokens`` (for benchmarks that compare equal work).

        All prompts and settings are validated before any is queued.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not self.is_leader:
            raise RuntimeError("a tensor-parallel follower takes no requests: call follow() (the leader's "
                               "requests reach it)")
        requests = []
        for index, prompt in enumerate(prompts):
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                    top_k=top_k, seed=None if seed is None else seed + index, stop=stop or (),
                                    ignore_eos=ignore_eos)
            requests.append(self._make_request(prompt, params))
        self._waiting.extend(requests)
        wanted = [r.request_id for r in requests]
        while any(rid not in self._finished for rid in wanted) or (self._dist is not None and self._dist.peers_busy):
            self._step()  # no per-step outputs: running requests' text is not decoded every round
        return [self._finished.pop(rid) for rid in wanted]

    def flush_cache(self) -> None:
        """Forget what drafts learnt across requests: SUFFIX's global tree of recent outputs (a no-op for the
        other drafters). Running requests keep their own trees. Refused (ValueError) under tensor parallelism with
        ``tp_draft="replicate"``, where every rank holds trees that a flush on one rank would set apart (at
        "leader" only the leader holds them)."""
        from specswap.worker.drafter import Drafter
        if (self._dist is not None and self._dist.group.tp_size > 1 and self.tp_draft == "replicate"
                and type(self.worker.drafter).flush_cache is not Drafter.flush_cache):
            raise ValueError("flush_cache is refused under tensor parallelism with tp_draft 'replicate' (every rank "
                             "holds its own suffix trees, which must stay alike); use tp_draft 'leader' to flush")
        self.worker.drafter.flush_cache()

    def stats(self) -> dict[str, Any]:
        """Tier, EMA, switches, rounds per tier, acceptance and throughput since start."""
        stats: dict[str, Any] = {
            "speculative_algorithm": self.speculative_algorithm,
            "weights": self.weights,
            "current_steps": self.current_steps,  # the active tier's key (a tree's is its packed shape)
            "tier": {**(tier := Tier.from_key(self.current_steps)).as_dict(), "label": tier.label},
            "adaptive": self.controller is not None,
            "ema": None,
            "num_switches": 0,
            "rounds_per_tier": dict(sorted(self._rounds_per_tier.items())),
            "num_verify_rounds": sum(self._rounds_per_tier.values()),
            "mean_accept_length": self._accepted_total / self._verified_total if self._verified_total else 0.0,
            "generated_tokens": self._generated_tokens,
            "busy_seconds": self._busy_seconds,
            "tokens_per_second": self._generated_tokens / self._busy_seconds if self._busy_seconds else 0.0,
            "running": len(self._running),
            "waiting": len(self._waiting),
            # SGLang's load figure (/get_load): tokens of running requests (prompt and output) and waiting prompts
            "num_tokens": sum(len(r.prompt_ids) + len(r.token_ids) for r in self._running)
            + sum(len(r.prompt_ids) for r in self._waiting),
            "request_faults": self._request_faults,
        }
        if self.controller is not None:
            controller_stats = self.controller.stats()
            stats["ema"] = controller_stats["ema"]
            stats["num_switches"] = controller_stats["num_switches"]
            stats["tiers"] = controller_stats["tiers"]
            for key in ("policy", "alpha", "cost_estimates", "measured_costs", "row_costs", "switches_per_hour",
                        "min_dwell_rounds", "agreement_seconds", "agreement_steps"):
                if key in controller_stats:
                    stats[key] = controller_stats[key]
        stats.update(self.worker.drafter.stats())  # SUFFIX: its global tree's requests, tokens and bytes
        return stats
