"""The state every route reads, and the admission every generating route goes through.

``ModelFacts`` is what routes may know of the engine: read once when the app is made, before the scheduler thread
owns the engine, so no route touches the engine from the event loop (the prompt checks call only the tokenizer and
pure vocabulary checks). ``ServerState`` holds the scheduler, metrics, limits and the drain's flags; ``Admission``
checks, reserves and queues a request's prompts and waits for their answers (one class for both APIs).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from specswap.server import protocol
from specswap.server.limits import RETRY_AFTER_SECONDS, ServerLimits
from specswap.server.metrics import ServerMetrics
from specswap.server.protocol import APIError, ParsedRequest
from specswap.server.scheduler import Scheduler, Update

CLIENT_GONE = "the client disconnected"


@dataclass(frozen=True)
class ModelFacts:
    """What the routes know of the served engine, fixed at start-up."""

    name: str                                  # the model id clients see
    max_seq_len: int
    max_batch_size: int
    tokenizer: Any                             # for chat templates and SGLang's matched stop strings (or None)
    eos_token_ids: frozenset[int]
    speculative: bool
    max_steps: int                             # the largest tier's depth: the acceptance histogram's last bin
    tier_report: list[dict[str, Any]]          # each built tier's shape, bytes and build seconds
    identity: dict[str, Any]                   # the keys SGLang's router reads (router_routes.worker_identity)
    encode: Callable[[Any], list[int]]         # the engine's prompt encoding (the tokenizer only)
    check_prompt: Callable[[list[int]], None]  # pure: vocabulary and length

    @classmethod
    def of(cls, engine, name: str, identity: dict[str, Any]) -> ModelFacts:
        return cls(name, engine.max_seq_len, engine.max_batch_size, engine.tokenizer, engine.eos_token_ids,
                   engine.speculative_algorithm is not None, engine.max_steps, engine.tier_report(), identity,
                   engine.encode, engine.check_prompt)


@dataclass
class ServerState:
    facts: ModelFacts
    scheduler: Scheduler
    metrics: ServerMetrics
    limits: ServerLimits
    server_args: dict[str, Any]
    started: float = field(default_factory=time.time)
    live_rids: dict[str, int] = field(default_factory=dict)  # rid (/generate's, or a response id) -> request id
    drain_state: dict[str, Any] = field(default_factory=lambda: {"cut": False, "report": None})
    closing: asyncio.Event = field(default_factory=asyncio.Event)  # the server stops: body reads answer 503

    async def read_json(self, request: Request) -> Any:
        return await read_json(request, self.limits, self.closing)


# ---- the wire: bodies in, errors and events out ------------------------------------------------------------

def error_response(error: APIError) -> Response:
    """The error's JSON body, written in ASCII: whatever it echoes (a lone surrogate included) cannot fail it."""
    headers = dict(error.headers or {})
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return Response(json.dumps(error.body(), ensure_ascii=True), status_code=error.status, headers=headers or None,
                    media_type="application/json")


def failure(update: Update) -> APIError | None:
    """The 500 an update ends with: the engine loop died (every request's), or this request's own fault (it alone
    ended; the server goes on); None otherwise."""
    if update.error is not None:
        return APIError(500, update.error, None, "engine_error", "server_error")
    if update.finish_reason == "error":
        return APIError(500, f"the request failed and was ended (the server goes on): {update.abort_message}", None,
                        "request_failed", "server_error")
    return None


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def read_json(request: Request, limits: ServerLimits, closing: asyncio.Event) -> Any:
    """The body as JSON: 413 past ``max_body_bytes`` (checked before and while reading), 408 when it takes longer
    than ``body_timeout`` to arrive, 503 once the server is closing (a stalled upload never holds a drain up), 400
    if it is not JSON, nests too deep or holds text that is not Unicode (``protocol.check_json_body``)."""
    max_body_bytes = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise APIError(413, f"request body of {declared} bytes is larger than the limit of {max_body_bytes} bytes",
                       None, "request_too_large")
    chunks, size, more = [], 0, True
    deadline = time.monotonic() + limits.body_timeout
    while more:
        message = await _receive_before(request, deadline, closing)
        if message["type"] == "http.disconnect":
            raise APIError(400, CLIENT_GONE, None, "client_disconnected")
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > max_body_bytes:
            raise APIError(413, f"request body is larger than the limit of {max_body_bytes} bytes", None,
                           "request_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except RecursionError as error:
        raise APIError(400, f"the request body is nested deeper than {protocol.MAX_JSON_DEPTH} levels", None,
                       "too_deep") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}", None, "invalid_json") from error
    protocol.check_json_body(body)
    return body


async def _receive_before(request: Request, deadline: float, closing: asyncio.Event) -> dict:
    """The next ASGI message of ``request``'s body, or 408 past ``deadline`` / 503 once ``closing`` is set."""
    receive = asyncio.ensure_future(request.receive())
    stop = asyncio.ensure_future(closing.wait())
    try:
        done, _ = await asyncio.wait({receive, stop}, timeout=max(deadline - time.monotonic(), 0),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if receive in done:
        return receive.result()
    receive.cancel()
    if stop in done:
        raise APIError(503, "the server is shutting down; the request body had not arrived", None, "server_draining",
                       "server_error", {"Connection": "close"})
    raise APIError(408, "the request body did not arrive within --body-timeout", None, "request_timeout",
                   headers={"Connection": "close"})


# ---- admission -----------------------------------------------------------------------------------------------

class Admission:
    """Every generating route's way in and out: checks, bounded reservation, queueing, the answers."""

    def __init__(self, state: ServerState):
        self.state = state
        self.capacity = state.facts.max_batch_size + state.limits.max_queued_requests

    def admitting(self) -> None:
        """503 while draining or once the engine loop died."""
        state = self.state
        if state.metrics.draining:
            state.metrics.reject("draining")
            raise APIError(503, "the server is shutting down and admits no new requests; send it to another "
                                "replica", None, "server_draining", "server_error",
                           {"Retry-After": str(RETRY_AFTER_SECONDS)})
        if not state.scheduler.alive:
            raise APIError(503, f"the engine loop has stopped: {state.scheduler.error!r}", None, "engine_dead",
                           "server_error")

    def prompt_ids(self, parsed: ParsedRequest, param: str) -> list[int]:
        """The prompt's token ids, checked against the context (a 400 naming ``param`` or the max-tokens field)."""
        facts = self.state.facts
        limit, wanted = facts.max_seq_len, parsed.params.max_new_tokens
        try:
            prompt_ids = facts.encode(parsed.prompt)
        except ValueError as error:
            raise APIError(400, str(error), param) from error
        except Exception as error:  # noqa: BLE001 - a tokenizer's own error is this prompt's 400
            raise APIError(400, f"the prompt cannot be tokenized: {type(error).__name__}: {error}", param) from error
        if not 1 <= len(prompt_ids) < limit:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server takes 1..{limit - 1} "
                                f"(max_seq_len {limit})", param, "context_length_exceeded")
        try:
            facts.check_prompt(prompt_ids)  # pure (vocabulary, length): a batch is whole before it queues
        except ValueError as error:
            raise APIError(400, str(error), param) from error
        if parsed.max_tokens_param is not None and len(prompt_ids) + wanted > limit:
            # as OpenAI-compatible servers answer; a default max_tokens is capped to fit instead
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(prompt_ids) + wanted} tokens ({len(prompt_ids)} in the prompt, {wanted} in "
                                f"the completion). Please reduce the length of the prompt or "
                                f"'{parsed.max_tokens_param}' (at most {limit - len(prompt_ids)} here).",
                           parsed.max_tokens_param, "context_length_exceeded")
        return prompt_ids

    def _reserve(self, count: int, param: str) -> None:
        state, capacity = self.state, self.capacity
        limit = (f"--max-running-requests {state.facts.max_batch_size} + --max-queued-requests "
                 f"{state.limits.max_queued_requests}")
        if count > capacity:
            raise APIError(400, f"the batch has {count} prompts; this server holds at most {capacity} requests "
                                f"({limit})", param, "too_many_prompts")
        if not state.scheduler.reserve(count, capacity):
            state.metrics.reject("queue_full")
            raise APIError(503, f"the server is at capacity: {state.scheduler.inflight} requests running or queued, "
                                f"at most {capacity} ({limit}); retry after {RETRY_AFTER_SECONDS} s", None,
                           "server_overloaded", "server_error", {"Retry-After": str(RETRY_AFTER_SECONDS)})

    async def admit(self, items: list[ParsedRequest], param: str, arrived: float,
                    rids: list[str] | None = None) -> list[tuple[Update, asyncio.Queue]]:
        """Queue every prompt of a request (all checked first, so a bad one queues none); the first update of
        each, which carries its request id, and its update queue. ``rids`` are registered for /abort_request
        (the caller unregisters them with ``forget``)."""
        state = self.state
        self.admitting()
        for rid in rids or ():
            if rid in state.live_rids:
                raise APIError(400, f"rid {rid!r} belongs to a request that is still running", "rid", "duplicate_rid")
        prompt_ids = [self.prompt_ids(item, param) for item in items]
        self._reserve(len(items), param)
        queues = []
        for ids, item in zip(prompt_ids, items):
            timeouts = [t for t in (state.limits.request_timeout, item.request_timeout) if t is not None]
            queues.append(state.scheduler.submit(ids, item.params, min(timeouts) if timeouts else None, arrived))
        firsts = [await updates.get() for updates in queues]
        for first in firsts:
            if first.finish_reason == "error":  # the engine loop died meanwhile
                raise failure(first)
        errors = [first.error for first in firsts if first.error is not None]
        if errors:
            for first in firsts:
                if first.request_id is not None:
                    state.scheduler.abort(first.request_id)
            raise APIError(400, errors[0], param)
        for rid, first in zip(rids or (), firsts):
            state.live_rids[rid] = first.request_id
        return list(zip(firsts, queues))

    def forget(self, rids) -> None:
        for rid in rids or ():
            self.state.live_rids.pop(rid, None)

    def abort(self, request_id: int) -> None:
        """The client went away (or the server is stopping): free the request's slot."""
        self.state.scheduler.abort(request_id, "abort", CLIENT_GONE)

    async def finals(self, request: Request, admitted: list[tuple[Update, asyncio.Queue]]) -> list[Update] | None:
        """The final update of each admitted request, or None when the client hung up first: then (and if the
        server stops meanwhile) every request still running is aborted, which frees its slot at once."""

        async def all_finished():
            finals = []
            for _, updates in admitted:
                while (update := await updates.get()).finish_reason is None and update.error is None:
                    pass
                finals.append(update)
            return finals

        async def hang_up():  # the body is read: the next ASGI message is the disconnect
            while (await request.receive())["type"] != "http.disconnect":
                pass

        done, gone = asyncio.ensure_future(all_finished()), asyncio.ensure_future(hang_up())
        finals = None
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
            if done.done():
                finals = done.result()
        finally:
            done.cancel()
            gone.cancel()
            if finals is None:
                for first, _ in admitted:
                    self.abort(first.request_id)
        for update in finals or ():
            if (error := failure(update)) is not None:
                raise error
        return finals
