"""The engine: requests in, tokens out, with continuous batching over a speculative worker.

A request waits in a FIFO queue until a cache slot is free, joins the running batch with a prefill, takes part in
one decode round per ``step()``, and leaves when it hits EOS, a stop string, its token budget or ``abort()``.
Requests never share randomness: each has its own seeded generator. The engine is a facade over its collaborators:
``engine_builder`` makes it (options, loading, row costs, graphs, controller), ``batch.RequestBatch`` runs its
requests and steps, ``distributed.Lockstep`` (``dist``) joins it to other ranks. It never imports a server.
"""

from __future__ import annotations

from typing import Any, Sequence

from specswap.batch import RequestBatch
from specswap.engine_builder import DEFAULT_MAX_SEQ_LEN, EngineOptions, build
from specswap.loading import resolve_checkpoint, resolve_dtype  # re-exported: callers import them from here
from specswap.requests import PREFILL_TOKEN_BUDGET, Request, RequestOutput, StepOutput, encode_text, prefill_groups
from specswap.sampling import SamplingParams
from specswap.tier import Tier

__all__ = ["Engine", "RequestOutput", "StepOutput", "resolve_dtype", "resolve_checkpoint", "encode_text",
           "DEFAULT_MAX_SEQ_LEN", "PREFILL_TOKEN_BUDGET", "prefill_groups", "Request"]

_CONTROLLER_KEYS = ("policy", "alpha", "cost_estimates", "measured_costs", "row_costs", "switches_per_hour",
                    "min_dwell_rounds", "agreement_seconds", "agreement_steps")


class Engine:
    """Serve generate() / add_request()+step() over one target, with EAGLE, EAGLE3, a standalone draft, NGRAM
    (prompt lookup), SUFFIX (suffix trees) or no speculation. Keywords (``engine_builder.EngineOptions``):

    ``model``: a checkpoint directory or ``.gguf``, a zoo or registry name ("tiny", "gemma-3-270m"), or a built
    LlamaForCausalLM (then ``draft`` is a built model too, ``tokenizer`` may be given, dtype/device are not applied).
    A zoo name without ``draft`` takes "<name>-eagle" (EAGLE) or "<name>-draft" (STANDALONE).
    ``speculative_adaptive=True`` lets a policy pick the tier each round: ``speculative_adaptive_config`` (a path or
    dict, docs/policy.md), else the default, goodput with tier 0 and tiers chosen for this machine. ``row_costs``
    ("auto", "off" or {rows: cost}): the verify's cost per row count, measured once and cached, the goodput
    policy's prior. ``speculative_eagle_topk`` > 1 drafts trees of depth ``speculative_num_steps`` verifying
    ``speculative_num_draft_tokens`` tokens (docs/trees.md). ``disable_graphs`` runs eagerly instead of replaying the
    graphs captured at start-up; ``round_graphs`` (None: on up to 50M parameters) records each tier's whole greedy
    round. ``weights`` ("auto", "native", "bf16", "fp32") and ``draft_quantization`` ("auto", "none", "int8",
    "q8_0"): docs/engine.md. ``ngram_numbers``: NGRAM extrapolates counters written one digit per token.
    ``tp_size`` / ``dp_size`` (> 1 under torchrun): tensor- and data-parallel groups, ``dist_timeout`` before a
    ``RankFailure`` names a rank, ``min_dwell_rounds`` between agreed switches, ``tp_draft`` ("replicate", "shard",
    "leader") where drafts come from. ``suffix_decoding_*`` (vLLM's names) and ``hybrid_drafter="SUFFIX"``:
    docs/suffix.md.
    """

    def __init__(self, model: Any, draft: Any = None, speculative_algorithm: str | None = "EAGLE", **keywords):
        options = EngineOptions.of(speculative_algorithm, keywords)  # checked before anything loads
        build(self, model, draft, options)
        self.batch = RequestBatch(self.worker, self.tokenizer, self.eos_token_ids, self.max_seq_len,
                                  self.max_batch_size, self._forward,
                                  controller=self.controller if self.dist is None else None, dist=self.dist)

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

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise ValueError naming the problem if a prompt (token ids) cannot be served."""
        self.worker.check_prompt(prompt_ids)

    def _request(self, prompt, params: SamplingParams) -> Request:
        """Validated up front, so that a bad request never reaches the running batch."""
        if not self.is_leader:
            raise RuntimeError("a tensor-parallel follower takes no requests: call follow() (the leader's "
                               "requests reach it)")
        prompt_ids = self.encode(prompt)
        self.check_prompt(prompt_ids)
        return self.batch.make_request(prompt_ids, params)

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kwargs) -> int:
        """Queue a request; returns its id. Sampling settings come as a SamplingParams or as keywords
        (max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, ...)."""
        if params is None:
            params = SamplingParams(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either params or sampling keywords, not both; got keywords {sorted(kwargs)}")
        request = self._request(prompt, params)
        self.batch.enqueue([request])
        return request.request_id

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a queued or running request (finish_reason "abort"); returns its final output, or None if it is
        unknown or done."""
        return self.batch.abort(request_id)

    def has_unfinished(self) -> bool:
        """Whether a request is queued or running (distributed with an adaptive policy: on any rank, since every
        rank takes part in every step's agreement)."""
        return self.batch.busy or (self.dist is not None and self.dist.peers_busy)

    # what callers read of the worker: the tier the next round runs, the largest tier, whether sampled tokens
    # are keyed by (seed, output position) (NGRAM, target-only), each tier's graph and buffer bytes
    current_tier = property(lambda self: self.worker.active_tier)
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

    # ---- distributed (tp_size / dp_size > 1) ----------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether this rank takes requests (always, unless a tensor-parallel follower)."""
        return self.dist is None or self.dist.leader

    @property
    def group(self):
        """The distributed group (``distributed.group.DistributedGroup``: ranks, sizes), or None in one process."""
        return None if self.dist is None else self.dist.group

    def follow(self) -> None:
        """A tensor-parallel follower's loop: run every step the leader runs, until its ``shutdown()`` (with an
        adaptive policy: until every data-parallel leader's); then leave the group (``DistributedGroup.close``)."""
        from specswap.distributed.lockstep import Stopped
        if self.is_leader:
            raise RuntimeError("follow() is for tensor-parallel followers (ranks with tp_rank > 0); this rank leads")
        try:
            while not self.dist.finished:
                self.batch.step()
        except Stopped:
            pass
        self.dist.close()

    def keepalive_due(self) -> bool:
        """Whether an idle owner of this engine should still call ``step()``: a distributed engine's ranks take
        every step together, so an idle loop steps, cheaply, rather than leave its peers waiting past their
        timeout."""
        return self.dist is not None and self.dist.lockstep_steps

    def shutdown(self) -> None:
        """A leader ends its group's part in the job and leaves it (a no-op in one process): its followers return
        from ``follow()``; with an adaptive policy it steps (idle) until every data-parallel leader shut down, and
        every rank leaves after the same step (``Lockstep.stop``)."""
        if self.dist is not None:
            try:
                self.dist.stop(self.batch)
            finally:
                self.dist.close()

    def _forward(self, fn, *args):
        """``fn(*args)``; a tensor-parallel rank's failure inside it (a replayed graph's collective) diagnosed."""
        return fn(*args) if self.dist is None else self.dist.forward(fn, *args)

    # ---- the loop --------------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """Admit waiting requests into free slots (prefill), run one decode round, retire finished ones.

        Returns the outputs of every request that changed in this step, each finished one exactly once (with
        any that finished inside another caller's generate()), and the tier the round ran for.
        """
        tier = self.worker.active_tier
        outputs = [self.batch.output(request) for request in self.batch.step()]
        return StepOutput(outputs + self.batch.take_finished(), tier)

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, max_new_tokens: int = 16,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, ignore_eos: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (one result each, in order). Prompt i is seeded with seed + i.
        ``ignore_eos``: run every prompt to ``max_new_tokens`` (for benchmarks that compare equal work).
        All prompts and settings are validated before any is queued."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        requests = [self._request(prompt, SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=None if seed is None else seed + index, stop=stop or (), ignore_eos=ignore_eos))
            for index, prompt in enumerate(prompts)]
        self.batch.enqueue(requests)
        wanted, finished = [r.request_id for r in requests], self.batch.finished
        while any(rid not in finished for rid in wanted) or (self.dist is not None and self.dist.peers_busy):
            self.batch.step()  # no per-step outputs: running requests' text is not decoded every round
        return [finished.pop(rid) for rid in wanted]

    def flush_cache(self) -> None:
        """Forget what drafts learnt across requests: SUFFIX's global tree of recent outputs (a no-op for the
        other drafters). Running requests keep their own trees. Refused (ValueError) under tensor parallelism with
        ``tp_draft="replicate"``, where every rank holds trees that a flush on one rank would set apart (at
        "leader" only the leader holds them)."""
        from specswap.worker.drafter import Drafter
        if (self.dist is not None and self.dist.group.tp_size > 1 and self.tp_draft == "replicate"
                and type(self.worker.drafter).flush_cache is not Drafter.flush_cache):
            raise ValueError("flush_cache is refused under tensor parallelism with tp_draft 'replicate' (every rank "
                             "holds its own suffix trees, which must stay alike); use tp_draft 'leader' to flush")
        self.worker.drafter.flush_cache()

    def stats(self) -> dict[str, Any]:
        """Tier, EMA, switches, rounds per tier, acceptance and throughput since start."""
        tier = Tier.from_key(self.current_tier)
        stats: dict[str, Any] = {
            "speculative_algorithm": self.speculative_algorithm, "weights": self.weights,
            "current_steps": self.current_tier,  # the active tier's key (a tree's is its packed shape)
            "tier": {**tier.as_dict(), "label": tier.label},
            "adaptive": self.controller is not None, "ema": None, "num_switches": 0, **self.batch.stats()}
        if self.controller is not None:
            controller_stats = self.controller.stats()
            stats.update(ema=controller_stats["ema"], num_switches=controller_stats["num_switches"],
                         tiers=controller_stats["tiers"])
            stats.update((key, controller_stats[key]) for key in _CONTROLLER_KEYS if key in controller_stats)
        stats.update(self.worker.drafter.stats())  # SUFFIX: its global tree's requests, tokens and bytes
        return stats
