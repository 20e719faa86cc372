"""The engine's requests and its step: ``RequestBatch`` keeps the FIFO of waiting requests, the running batch in
its cache slots and the outputs no caller has taken yet; ``step()`` admits waiting requests into free slots
(prefill), runs one decode round through the worker, hands its result to the adaptive controller, and retires
finished requests. A fault in serving one request alone (its stop checks, its detokenization) ends that request
(finish_reason "error") and the batch goes on. Its public methods are what a distributed step (``Lockstep``) uses.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, deque
from typing import Any, Callable

import torch

from specswap.requests import PREFILL_TOKEN_BUDGET, Request, RequestOutput, prefill_groups
from specswap.sampling import SamplingParams

logger = logging.getLogger(__name__)


class RequestBatch:
    """``worker``: the SpeculativeWorker; ``forward(fn, *args)`` runs a prefill or round (a distributed engine
    diagnoses a peer's failure inside it); ``controller``: the adaptive policy fed each round (None: static, or
    fed by the distributed agreement instead); ``dist``: the engine's ``Lockstep`` (None in one process)."""

    def __init__(self, worker, tokenizer: Any, eos_token_ids: frozenset[int], max_seq_len: int, max_batch_size: int,
                 forward: Callable, controller=None, dist=None):
        self.worker, self.tokenizer, self.eos_token_ids = worker, tokenizer, eos_token_ids
        self.max_seq_len, self.forward, self.controller, self.dist = max_seq_len, forward, controller, dist
        self._ids = itertools.count()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots = list(range(max_batch_size - 1, -1, -1))
        # finished outputs no step() has returned yet: requests that finished inside generate() for another caller
        self.finished: dict[int, RequestOutput] = {}
        self.rounds_per_tier: Counter[int] = Counter()
        self.accepted_total = self.verified_total = self.generated_tokens = self.request_faults = 0
        self.busy_seconds = 0.0

    # ---- requests ----------------------------------------------------------------------------------

    def make_request(self, prompt_ids: list[int], params: SamplingParams, request_id: int | None = None) -> Request:
        """A request over checked prompt ids, with its own generator (seeded from ``params.seed``, else fresh)."""
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.worker.device)
            if params.seed is None:
                generator.seed()
            else:
                generator.manual_seed(params.seed)
        max_tokens = min(params.max_new_tokens, self.max_seq_len - len(prompt_ids))
        return Request(next(self._ids) if request_id is None else request_id, prompt_ids, params, max_tokens,
                       generator)

    def enqueue(self, requests: list[Request]) -> None:
        self.waiting.extend(requests)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a queued or running request (finish_reason "abort"); its final output, or None if unknown or done."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                self.finish(request, "abort")
                return self.finished.pop(request_id)
        if self.dist is not None:
            self.dist.note_abort(request_id)
        for request in self.running:
            if request.request_id == request_id:
                self.finish(request, "abort")
                self.running.remove(request)
                return self.finished.pop(request_id)
        return None

    def output(self, request: Request) -> RequestOutput:
        """A request's output: its final one if it finished, else its text so far (decoding it may fail: then
        the request ends with that fault)."""
        if request.request_id not in self.finished:
            self.guarded(request, lambda: self.finished.setdefault(request.request_id,
                                                                     request.output(self.tokenizer)))
        return self.finished.pop(request.request_id)

    def take_finished(self) -> list[RequestOutput]:
        outputs = list(self.finished.values())
        self.finished.clear()
        return outputs

    # ---- one step ----------------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """Admit, prefill, one decode round, retire; the requests that changed."""
        if self.dist is not None:  # a tensor-parallel leader announces, its followers apply
            self.dist.begin_step(self)
        start = time.perf_counter()
        updated = self._prefill()
        decoding = [r for r in self.running if r.finish_reason is None]
        result = self._decode(decoding) if decoding else None
        updated.extend(r for r in decoding if r not in updated)
        for request in [r for r in self.running if r.finish_reason is not None]:
            self.running.remove(request)
            self.free_slot(request)
        if self.dist is not None:  # every rank, busy or not: the step's agreement
            self.dist.end_step(result, self.busy)
        self.busy_seconds += time.perf_counter() - start
        return updated

    def _prefill(self) -> list[Request]:
        admitted = []
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            admitted.append(request)
        for group in prefill_groups(admitted, PREFILL_TOKEN_BUDGET):
            first_tokens = self.forward(self.worker.prefill, [r.slot for r in group], [r.prompt_ids for r in group],
                                        [r.params for r in group], [r.generator for r in group])
            for request, token in zip(group, first_tokens):
                self.running.append(request)
                self.guarded(request, self.append, request, [token])
        return admitted

    def _decode(self, decoding: list[Request]):
        result = self.forward(self.worker.decode_round, [r.slot for r in decoding])
        self.rounds_per_tier[result.ran.key] += 1  # by key: a chain's steps, a tree's encoded shape
        if self.controller is not None:
            self.controller.observe(result)  # may switch the pool's tier: the next round runs it
            self.worker.drafter.pause_checks(not self.controller.checks_pay)
        for request, tokens, accepted, drafts, speculating in zip(
                decoding, result.new_tokens, result.accept_lengths, result.drafts_verified, result.speculating):
            request.accept_lengths.append(accepted)
            request.num_draft_tokens += drafts
            if speculating:  # a request with speculation off is no acceptance observation
                self.accepted_total += accepted
                self.verified_total += 1
            self.guarded(request, self.append, request, tokens)
        return result

    def guarded(self, request: Request, fn, *args) -> None:
        """``fn(*args)``, a part of serving ``request`` alone: a fault there ends that request and the batch goes
        on."""
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - the fault stays with its request
            self.fail(request, error)

    def fail(self, request: Request, error: Exception) -> None:
        """End ``request`` for a fault of its own: logged in one line, counted (``request_faults``), its final
        output carries the error; a tensor-parallel leader's followers drop it too (as an abort)."""
        message = f"{type(error).__name__}: {error}"
        logger.error("specswap: request %d failed and was ended, the batch goes on: %s", request.request_id, message)
        self.request_faults += 1
        request.finish_reason, request.error = "error", message
        if self.dist is not None:
            self.dist.note_abort(request.request_id)
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self.free_slot(request)
        self.finished[request.request_id] = RequestOutput(
            request.request_id, list(request.prompt_ids), list(request.token_ids), request.text, "error",
            len(request.accept_lengths), list(request.accept_lengths), request.num_draft_tokens, message)

    def append(self, request: Request, tokens: list[int]) -> None:
        """A round's tokens for ``request``: its stop checks, and its final output if it finished."""
        self.generated_tokens += request.append(tokens, self.eos_token_ids, self.tokenizer)
        if request.finish_reason is not None:
            self.finish(request, request.finish_reason)

    def finish(self, request: Request, reason: str) -> None:
        request.finish_reason = reason
        if self.tokenizer is not None and not request.stop_string_hit:
            request.text = self.tokenizer.decode(request.token_ids)
        if request.slot is not None and reason == "abort":
            self.free_slot(request)
        self.finished[request.request_id] = request.output(self.tokenizer)

    def free_slot(self, request: Request) -> None:
        if request.slot is not None:
            self.worker.release(request.slot)
            self.free_slots.append(request.slot)
            request.slot = None

    def stats(self) -> dict[str, Any]:
        """Rounds per tier, acceptance, throughput and load since start."""
        rounds = self.rounds_per_tier
        return {
            "rounds_per_tier": dict(sorted(rounds.items())),
            "num_verify_rounds": sum(rounds.values()),
            "mean_accept_length": self.accepted_total / self.verified_total if self.verified_total else 0.0,
            "generated_tokens": self.generated_tokens,
            "busy_seconds": self.busy_seconds,
            "tokens_per_second": self.generated_tokens / self.busy_seconds if self.busy_seconds else 0.0,
            "running": len(self.running),
            "waiting": len(self.waiting),
            # SGLang's load figure (/get_load): tokens of running requests (prompt and output) and waiting prompts
            "num_tokens": sum(len(r.prompt_ids) + len(r.token_ids) for r in self.running)
            + sum(len(r.prompt_ids) for r in self.waiting),
            "request_faults": self.request_faults,
        }
