"""The HTTP server: FastAPI routes over the scheduler that owns the engine.

    POST /v1/completions, POST /v1/chat/completions   OpenAI's API (streaming SSE or not; usage counts)
    POST /generate                                     SGLang's native API (native.py)
    POST /abort_request; GET|POST /flush_cache         SGLang's request control
    GET  /v1/models, /health, /health_generate, /get_model_info (also /model_info), /server_info (also
         /get_server_info), /metrics (Prometheus text format)

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``. A request is parsed,
validated and tokenized on the event loop; only a valid one reaches the scheduler, so a bad request never
disturbs the running batch. Admission is bounded (``limits.ServerLimits``): past ``--max-running-requests +
--max-queued-requests`` a request gets 503 with Retry-After. A client that disconnects, streaming or not, has its
requests aborted, which frees their slots; so does a request past its deadline. ``serve`` runs the app under
uvicorn with a graceful drain on SIGTERM / SIGINT (``drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import socket
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specswap.capability import cpu_capability
from specswap.sampling import SamplingParams
from specswap.server import native, protocol, router_routes
from specswap.server.limits import RETRY_AFTER_SECONDS, ServerLimits
from specswap.server.metrics import CONTENT_TYPE, ServerMetrics
from specswap.server.protocol import APIError, ParsedRequest
from specswap.server.scheduler import Scheduler, Update
from specswap.tier import Tier

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT = 20.0          # /health_generate: seconds the engine may take to show it is alive
SHUTDOWN_GRACE = 15            # seconds uvicorn waits for responses still being sent after the drain
CLIENT_GONE = "the client disconnected"
PROBES = ("/health", "/health_generate", "/metrics")   # open under --api-key unless --api-key-probes


def _error_response(error: APIError) -> Response:
    """The error's JSON body, written in ASCII: whatever it echoes (a lone surrogate included) cannot fail it."""
    headers = dict(error.headers or {})
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return Response(json.dumps(error.body(), ensure_ascii=True), status_code=error.status, headers=headers or None,
                    media_type="application/json")


async def _read_json(request: Request, limits: ServerLimits, closing: asyncio.Event) -> Any:
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


class _BearerKey:
    """Every request must carry ``Authorization: Bearer <api_key>``, else 401; the probes (``PROBES``: load balancers'
    health checks and Prometheus send no key) only with ``probes`` (--api-key-probes). A plain ASGI middleware, not
    ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware hides the client's ``http.disconnect`` from the
    route, so ``request.is_disconnected()`` would never turn true and a dropped request would keep its slot."""

    def __init__(self, app, api_key: str, probes: bool = False):
        self.app, self.api_key, self.probes = app, api_key.encode(), probes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (self.probes or scope["path"] not in PROBES):
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("latin-1"), self.api_key):
                response = _error_response(APIError(401, "missing or invalid API key: send 'Authorization: Bearer "
                                                    "<key>'", None, "invalid_api_key", "authentication_error"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _failure(update: Update) -> APIError | None:
    """The 500 an update ends with: the engine loop died (every request's), or this request's own fault (it alone
    ended; the server goes on); None otherwise."""
    if update.error is not None:
        return APIError(500, update.error, None, "engine_error", "server_error")
    if update.finish_reason == "error":
        return APIError(500, f"the request failed and was ended (the server goes on): {update.abort_message}", None,
                        "request_failed", "server_error")
    return None


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def create_app(engine, model_name: str, api_key: str | None = None, max_body_bytes: int | None = None,
               max_prompt_chars: int | None = None, server_args: dict[str, Any] | None = None,
               limits: ServerLimits | None = None) -> FastAPI:
    """The app serving ``engine`` (which it owns from now on: only the scheduler thread may touch it).
    ``limits``: admission and drain settings; ``max_body_bytes`` / ``max_prompt_chars`` override its fields.
    The engine's ``max_batch_size`` is ``--max-running-requests``."""
    limits = limits or ServerLimits()
    if max_body_bytes is not None:
        limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)
    if max_prompt_chars is not None:
        limits = dataclasses.replace(limits, max_prompt_chars=max_prompt_chars)
    max_body_bytes, max_prompt_chars = limits.max_body_bytes, limits.max_prompt_chars
    metrics = ServerMetrics()
    tier_report = engine.tier_report()  # fixed at start-up: no route touches the engine once the scheduler owns it
    scheduler = Scheduler(engine, on_round=metrics.on_round)
    metrics.attach(scheduler)
    started = time.time()
    capacity = engine.max_batch_size + limits.max_queued_requests
    live_rids: dict[str, int] = {}   # rid (/generate's, or an OpenAI response id) -> scheduler request id
    drain_state = {"cut": False, "report": None}
    closing = asyncio.Event()   # set when the server stops: body reads still waiting answer 503 at once

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        if getattr(app.state, "ready_message", None):  # the CLI's one line at any log level: it takes requests now
            print(app.state.ready_message, flush=True)
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="specswap", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    app.state.limits = limits

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return _error_response(APIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                                        None, None, kind))

    if api_key is not None:
        app.add_middleware(_BearerKey, api_key=api_key, probes=limits.api_key_probes)

    def _admitting() -> None:
        """503 while draining or once the engine loop died."""
        if metrics.draining:
            metrics.reject("draining")
            raise APIError(503, "the server is shutting down and admits no new requests; send it to another "
                                "replica", None, "server_draining", "server_error",
                           {"Retry-After": str(RETRY_AFTER_SECONDS)})
        if not scheduler.alive:
            raise APIError(503, f"the engine loop has stopped: {scheduler.error!r}", None, "engine_dead",
                           "server_error")

    def _submit_checks(parsed: ParsedRequest, param: str) -> list[int]:
        try:
            prompt_ids = engine.encode(parsed.prompt)  # reads only the tokenizer: safe off the scheduler thread
        except ValueError as error:
            raise APIError(400, str(error), param) from error
        limit = engine.max_seq_len
        if not 1 <= len(prompt_ids) < limit:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server takes "
                                f"1..{limit - 1} (max_seq_len {limit})", param, "context_length_exceeded")
        try:
            engine.check_prompt(prompt_ids)  # pure (vocabulary, length): a batch is whole before it queues
        except ValueError as error:
            raise APIError(400, str(error), param) from error
        wanted = parsed.params.max_new_tokens
        if parsed.max_tokens_param is not None and len(prompt_ids) + wanted > limit:
            # as OpenAI-compatible servers answer; a default max_tokens is capped to fit instead
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(prompt_ids) + wanted} tokens ({len(prompt_ids)} in the prompt, {wanted} in "
                                f"the completion). Please reduce the length of the prompt or "
                                f"'{parsed.max_tokens_param}' (at most {limit - len(prompt_ids)} here).",
                           parsed.max_tokens_param, "context_length_exceeded")
        return prompt_ids

    async def _admit(items: list[ParsedRequest], param: str, arrived: float,
                     rids: list[str] | None = None) -> list[tuple[Update, asyncio.Queue]]:
        """Queue every prompt of a request (all checked first, so a bad one queues none); the first update of
        each, which carries its request id, and its update queue. ``rids`` are registered for /abort_request
        (the caller unregisters them with ``_forget``)."""
        _admitting()
        for rid in rids or ():
            if rid in live_rids:
                raise APIError(400, f"rid {rid!r} belongs to a request that is still running", "rid", "duplicate_rid")
        prompt_ids = [_submit_checks(item, param) for item in items]
        limit = (f"--max-running-requests {engine.max_batch_size} + --max-queued-requests "
                 f"{limits.max_queued_requests}")
        if len(items) > capacity:
            raise APIError(400, f"the batch has {len(items)} prompts; this server holds at most {capacity} requests "
                                f"({limit})", param, "too_many_prompts")
        if not scheduler.reserve(len(items), capacity):
            metrics.reject("queue_full")
            raise APIError(503, f"the server is at capacity: {scheduler.inflight} requests running or queued, at "
                                f"most {capacity} ({limit}); retry after {RETRY_AFTER_SECONDS} s", None,
                           "server_overloaded", "server_error", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        queues = []
        for ids, item in zip(prompt_ids, items):
            timeouts = [t for t in (limits.request_timeout, item.request_timeout) if t is not None]
            queues.append(scheduler.submit(ids, item.params, min(timeouts) if timeouts else None, arrived))
        firsts = [await updates.get() for updates in queues]
        for first in firsts:
            if first.finish_reason == "error":  # the engine loop died meanwhile
                raise _failure(first)
        errors = [first.error for first in firsts if first.error is not None]
        if errors:
            for first in firsts:
                if first.request_id is not None:
                    scheduler.abort(first.request_id)
            raise APIError(400, errors[0], param)
        for rid, first in zip(rids or (), firsts):
            live_rids[rid] = first.request_id
        return list(zip(firsts, queues))

    def _forget(rids) -> None:
        for rid in rids or ():
            live_rids.pop(rid, None)

    async def _finals(request: Request, admitted: list[tuple[Update, asyncio.Queue]]) -> list[Update] | None:
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
                    scheduler.abort(first.request_id, "abort", CLIENT_GONE)
        for update in finals or ():
            if (failure := _failure(update)) is not None:
                raise failure
        return finals

    async def _generate(request: Request, parsed: ParsedRequest, chat: bool, arrived: float):
        param = "messages" if chat else "prompt"
        response_id = protocol.new_id("chatcmpl" if chat else "cmpl")
        [(first, updates)] = await _admit([parsed], param, arrived, [response_id])
        request_id, prompt_tokens = first.request_id, first.prompt_tokens
        created = protocol.now()
        kind = "chat.completion" if chat else "text_completion"
        if not parsed.stream:
            try:
                finals = await _finals(request, [(first, updates)])
            finally:
                _forget([response_id])
            if finals is None:
                return Response(status_code=499)
            update = finals[0]
            reason = protocol.finish_reason(update.finish_reason)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": update.text}, "logprobs": None,
                          "finish_reason": reason}
            else:
                choice = {"index": 0, "text": update.text, "logprobs": None, "finish_reason": reason}
            return JSONResponse({"id": response_id, "object": kind, "created": created, "model": model_name,
                                 "choices": [choice], "usage": protocol.usage(prompt_tokens, update.num_tokens)})
        return StreamingResponse(_stream(request_id, updates, parsed, chat, response_id, created, prompt_tokens),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _stream(request_id, updates, parsed: ParsedRequest, chat: bool, response_id, created, prompt_tokens):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, reason: str | None = None, role: bool = False) -> str:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if text:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            return _sse({"id": response_id, "object": kind, "created": created, "model": model_name,
                         "choices": [choice]})

        finished = False
        sent = 0
        try:
            if chat:
                yield chunk(None, role=True)
            while True:
                update = await updates.get()
                if (failure := _failure(update)) is not None:
                    finished = True
                    yield _sse(failure.body())
                    break
                done = update.finish_reason is not None
                safe = protocol.stream_safe_length(update.text, parsed.params.stop, done)
                if safe > sent:
                    yield chunk(update.text[sent:safe])
                    sent = safe
                if done:
                    finished = True
                    yield chunk(None, protocol.finish_reason(update.finish_reason))
                    if parsed.include_usage:
                        yield _sse({"id": response_id, "object": kind, "created": created, "model": model_name,
                                    "choices": [], "usage": protocol.usage(prompt_tokens, update.num_tokens)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            _forget([response_id])
            if not finished:  # the client went away (or the server is stopping): free the slot
                scheduler.abort(request_id, "abort", CLIENT_GONE)

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrived = time.monotonic()
        body = await _read_json(request, limits, closing)
        return await _generate(request, protocol.parse_completion(body, max_prompt_chars), False, arrived)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrived = time.monotonic()
        body = await _read_json(request, limits, closing)
        return await _generate(request, protocol.parse_chat(body, engine.tokenizer, max_prompt_chars), True, arrived)

    decode = engine.tokenizer.decode if engine.tokenizer is not None else None
    speculative = engine.speculative_algorithm is not None
    max_steps = engine.max_steps  # the largest tier: the acceptance histogram's last bin

    def _native_output(update: Update, item: ParsedRequest, rid: str, started: float, text: str | None = None):
        reason = native.finish_reason(update.finish_reason, update.token_ids, update.text, item.params,
                                      engine.eos_token_ids, decode, update.abort_message)
        return {"text": update.text if text is None else text, "output_ids": list(update.token_ids),
                "meta_info": native.meta_info(rid, update, reason, time.monotonic() - started, speculative,
                                              max_steps)}

    async def _native_stream(admitted, parsed: native.GenerateRequest, rids: list[str], started: float):
        """SGLang's stream: ``data: {output}`` lines with the text so far (a batch's carry ``index``), then
        ``data: [DONE]``. Prompts of a batch are interleaved as their updates arrive."""
        running = set(range(len(admitted)))
        sent = [0] * len(admitted)
        waits: dict[int, asyncio.Future] = {}
        try:
            while running:
                for index in running - waits.keys():
                    waits[index] = asyncio.ensure_future(admitted[index][1].get())
                await asyncio.wait(waits.values(), return_when=asyncio.FIRST_COMPLETED)
                for index in [index for index, wait in waits.items() if wait.done()]:
                    update = waits.pop(index).result()
                    if update.error is not None:  # the engine loop died; every request got this error
                        running.clear()
                        yield _sse(_failure(update).body())
                        break
                    if update.finish_reason == "error":  # this prompt's own fault: the batch's others go on
                        running.discard(index)
                        failure = _failure(update).body()
                        if parsed.batched:
                            failure["index"] = index
                        yield _sse(failure)
                        continue
                    item = parsed.items[index]
                    done = update.finish_reason is not None
                    safe = protocol.stream_safe_length(update.text, item.params.stop, done)
                    if safe > sent[index] or done:
                        sent[index] = safe
                        output = _native_output(update, item, rids[index], started, update.text[:safe])
                        if parsed.batched:
                            output["index"] = index
                        yield _sse(output)
                    if done:
                        running.discard(index)
            yield "data: [DONE]\n\n"
        finally:
            _forget(rids)
            for wait in waits.values():
                wait.cancel()
            for index in running:  # the client went away (or the server is stopping): free the slots
                scheduler.abort(admitted[index][0].request_id, "abort", CLIENT_GONE)

    @app.post("/generate")
    async def generate(request: Request):
        started = time.monotonic()
        body = await _read_json(request, limits, closing)
        parsed = native.parse_generate(body, max_prompt_chars, limits.max_prompts_per_request)
        rids = parsed.rids or [uuid.uuid4().hex for _ in parsed.items]
        admitted = await _admit(parsed.items, parsed.param, started, rids)
        if parsed.stream:
            return StreamingResponse(_native_stream(admitted, parsed, rids, started), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            finals = await _finals(request, admitted)
        finally:
            _forget(rids)
        if finals is None:
            return Response(status_code=499)
        outputs = [_native_output(update, item, rid, started) for update, item, rid in zip(finals, parsed.items, rids)]
        return JSONResponse(outputs if parsed.batched else outputs[0])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(started),
                                            "owned_by": "specswap", "max_model_len": engine.max_seq_len}]}

    def _unhealthy() -> JSONResponse | None:
        if metrics.draining:
            return JSONResponse({"status": "draining"}, status_code=503,
                                headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        if not scheduler.alive:
            return JSONResponse({"status": "error", "error": repr(scheduler.error)}, status_code=503)
        return None

    @app.get("/health")
    async def health():
        return _unhealthy() or {"status": "ok"}

    probe_ids = (engine.encode("") if engine.tokenizer is not None else []) or [0]

    @app.get("/health_generate")
    async def health_generate():
        """SGLang's deep health check: 200 once the engine has shown it generates (a running engine that went
        round its loop recently counts; an idle one decodes one token of a probe that no metric counts)."""
        if (unhealthy := _unhealthy()) is not None:
            return unhealthy
        if scheduler.inflight and time.monotonic() - scheduler.last_loop < HEALTH_TIMEOUT:
            return {"status": "ok"}
        updates = scheduler.submit(probe_ids, SamplingParams(max_new_tokens=1), reserved=False, counted=False)
        first = None

        async def finished():
            nonlocal first
            first = await updates.get()
            update = first
            while update.finish_reason is None and update.error is None:
                update = await updates.get()
            return update

        try:
            update = await asyncio.wait_for(finished(), HEALTH_TIMEOUT)
        except asyncio.TimeoutError:
            if first is not None and first.request_id is not None:
                scheduler.abort(first.request_id)
            return JSONResponse({"status": "error", "error": f"no token in {HEALTH_TIMEOUT:g} s"}, status_code=503)
        if update.error is not None:
            return JSONResponse({"status": "error", "error": update.error}, status_code=503)
        return {"status": "ok"}

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        path = (server_args or {}).get("model") or model_name
        return {**router_routes.worker_identity(engine, model_name, server_args),  # what sglang-router reads
                "model_path": path, "tokenizer_path": path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "served_model_name": model_name, "max_seq_len": engine.max_seq_len}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        """SGLang's abort: ``{"rid": ...}`` ends that request (finish reason "abort"), ``{"abort_all": true}``
        every request; an unknown or finished rid is no error (it may have just finished)."""
        body = await _read_json(request, limits, closing)
        if not isinstance(body, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        for key in body:
            if key not in ("rid", "abort_all", "abort_message"):
                raise APIError(400, f"unknown field '{key}'; /abort_request takes rid, abort_all, abort_message", key)
        rid, abort_all = body.get("rid"), protocol.flag(body, "abort_all")
        message = body.get("abort_message") or "aborted by /abort_request"
        if not isinstance(message, str):
            raise APIError(400, f"'abort_message' must be a string, got {message!r:.80}", "abort_message")
        if abort_all:
            aborted = scheduler.inflight
            scheduler.abort_all("abort", message)
            return {"success": True, "aborted": aborted}
        if not isinstance(rid, str) or not rid:
            raise APIError(400, f"'rid' must be a non-empty string (or send abort_all: true), got {rid!r:.80}", "rid")
        request_id = live_rids.get(rid)
        if request_id is not None:
            scheduler.abort(request_id, "abort", message)
        return {"success": True, "aborted": int(request_id is not None)}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        """SGLang's cache flush: this server keeps no prefix cache, so a no-op that succeeds while nothing runs
        (SGLang refuses to flush then too: 400)."""
        busy = scheduler.inflight + scheduler.snapshot.get("running", 0)
        if busy:
            raise APIError(400, f"{scheduler.inflight} requests are running or queued; the cache is flushed only "
                                f"while the server is idle", None, "server_busy")
        return {"success": True, "message": "Cache flushed (this server keeps no prefix cache)."}

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's older name, which its benchmark reads
    async def server_info():
        info = {**router_routes.worker_identity(engine, model_name, server_args),
                **server_info_dict(scheduler, model_name, engine, server_args, started)}
        info.update(max_running_requests=engine.max_batch_size, max_queued_requests=limits.max_queued_requests,
                    request_timeout=limits.request_timeout, max_prompts_per_request=limits.max_prompts_per_request,
                    max_prompt_chars=limits.max_prompt_chars, drain_timeout=limits.drain_timeout,
                    draining=metrics.draining, num_requests_admitted=scheduler.inflight,
                    requests_rejected=dict(metrics.rejected),
                    requests_speculation_disabled=scheduler.counters.speculation_disabled,
                    speculative_tiers=tier_report)
        return info

    async def drain(timeout: float | None = None) -> dict[str, Any]:
        """Stop admitting (new requests and /health answer 503), let every admitted request finish within
        ``timeout`` seconds (default ``--drain-timeout``; ``cut_drain`` ends the wait early), then abort the rest
        with finish reason "shutdown" and wait until each has its answer. Returns what happened."""
        timeout = limits.drain_timeout if timeout is None else timeout
        metrics.draining = True
        began, admitted = time.monotonic(), scheduler.inflight
        print(f"specswap serve: draining: {admitted} request(s) admitted; new requests get 503 "
              f"(--drain-timeout {timeout:g} s)", flush=True)
        while scheduler.inflight and time.monotonic() - began < timeout and not drain_state["cut"]:
            await asyncio.sleep(0.02)
        aborted = scheduler.inflight
        if aborted:
            scheduler.abort_all("shutdown", f"the server shut down: the request did not finish within "
                                            f"--drain-timeout ({timeout:g} s)")
            end = time.monotonic() + 10
            while scheduler.inflight and time.monotonic() < end:
                await asyncio.sleep(0.02)
        report = {"admitted": admitted, "aborted": aborted, "seconds": round(time.monotonic() - began, 3)}
        print(f"specswap serve: drained in {report['seconds']:.1f} s: {admitted - aborted} finished, {aborted} "
              f"aborted (finish reason 'shutdown')", flush=True)
        drain_state["report"] = report
        return report

    def cut_drain() -> None:
        """End the drain's wait now (a second signal): what still runs is aborted. Safe in a signal handler."""
        drain_state["cut"] = True

    app.state.drain = drain
    app.state.cut_drain = cut_drain
    app.state.closing = closing
    app.state.drain_state = drain_state

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    router_routes.add_router_routes(app, scheduler=scheduler)  # what SGLang's router reads (docs/scale-out.md)
    return app


ENGINE_DEATH_GRACE = 1.0   # seconds between the engine loop's death and the exit: its clients get their 500s


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful drain: the first SIGTERM or SIGINT runs the app's ``drain`` while the
    server keeps listening (so new requests and /health get 503, not a refused connection), then exits normally
    (status 0; the signal is not re-raised). A second signal cuts the drain's wait short; a third exits at once.
    When the engine loop dies (a fault in shared state), it exits ``ENGINE_DEATH_GRACE`` seconds later, for a
    supervisor to restart the process (``serve`` callers exit non-zero: ``app.state.scheduler.error``)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI):
        super().__init__(config)
        self.app = app
        self.signals = 0
        self._drain: asyncio.Future | None = None

    def handle_exit(self, sig, frame) -> None:  # a signal handler: only sets flags
        self.signals += 1
        if self.signals == 2:
            self.app.state.cut_drain()
        elif self.signals >= 3:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        state = self.app.state
        if self.signals and self._drain is None:
            self._drain = asyncio.ensure_future(state.drain())
        died = state.scheduler.died_at
        if (self._drain is not None and self._drain.done()) or \
                (died is not None and time.monotonic() - died > ENGINE_DEATH_GRACE):
            state.closing.set()  # body reads still waiting answer 503 now: nothing holds the exit up
            self.should_exit = True
        return await super().on_tick(counter)


def _timed_protocol(header_timeout: float):
    """uvicorn's h11 protocol with a header timeout: a connection that has not sent a whole request's headers
    ``header_timeout`` seconds after it opened (or after its last response) gets a JSON 408 and is closed, so slow
    clients (slowloris) cannot hold connections open."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: PLC0415

    body = json.dumps(APIError(408, f"the request headers did not arrive within --header-timeout "
                                    f"({header_timeout:g} s)", None, "request_timeout").body()).encode()
    reply = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n" % len(body)) + body

    class TimedH11Protocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def _arm(self):
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def handle_events(self):
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers arrived
                self._disarm()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _headers_late(self):
            self._header_timer = None
            if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
                return
            self.transport.write(reply)
            self.transport.close()

    return TimedH11Protocol


class _QuietCancel:
    """A request task cancelled at shutdown (uvicorn cancels what outlives its grace) logs one line, not
    uvicorn's traceback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if scope["type"] == "http":
                logger.warning("specswap serve: %s %s cancelled at shutdown", scope.get("method"), scope.get("path"))


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so that a taken port is an error at once (OSError)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(app: FastAPI, host: str, port: int, log_level: str = "warning",
          sock: socket.socket | None = None) -> dict[str, Any] | None:
    """Run ``app`` (on ``sock`` when given, bound by ``bind``) until SIGTERM / SIGINT or the engine's death, and
    return the drain's report (None if it never drained)."""
    config = uvicorn.Config(_QuietCancel(app), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE,
                            http=_timed_protocol(app.state.limits.header_timeout))
    DrainingServer(config, app).run(sockets=[sock] if sock is not None else None)
    return app.state.drain_state["report"]


def server_info_dict(scheduler: Scheduler, model_name: str, engine, server_args: dict | None,
                     started: float) -> dict[str, Any]:
    """Tier, EMA, acceptance, switches and per-tier rounds, from the scheduler's snapshot."""
    stats = dict(scheduler.snapshot)
    rounds = stats.get("num_verify_rounds", 0)
    speculative = stats.get("speculative_algorithm") is not None
    # the active tier's shape (the engine's Tier), never its packed key
    shape = stats["tier"] if speculative else {**Tier(0).as_dict(), "speculative_num_draft_tokens": 0}
    steps, topk, tokens = (shape["speculative_num_steps"], shape["speculative_eagle_topk"],
                           shape["speculative_num_draft_tokens"])
    info = {
        "model": model_name,
        "speculative_algorithm": stats.get("speculative_algorithm"),
        "speculative_adaptive": stats.get("adaptive", False),
        "weights": stats.get("weights"),
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": tokens,
        "candidate_steps": None,
        "ema": stats.get("ema"),
        "avg_spec_accept_length": stats["mean_accept_length"] + 1 if rounds else None,
        "mean_accepted_draft_tokens": stats["mean_accept_length"] if rounds else None,
        "num_switches": stats.get("num_switches", 0),
        "rounds_per_tier": {Tier.from_key(k).label: v for k, v in stats.get("rounds_per_tier", {}).items()},
        "num_verify_rounds": rounds,
        "generated_tokens": stats.get("generated_tokens", 0),
        "tokens_per_second": stats.get("tokens_per_second", 0.0),
        "num_requests_running": stats.get("running", 0),
        "num_requests_waiting": stats.get("waiting", 0) + scheduler.pending(),
        "requests_finished": dict(scheduler.counters.requests_finished),
        "max_batch_size": engine.max_batch_size,
        "max_seq_len": engine.max_seq_len,
        "uptime_s": time.time() - started,
        "server_args": server_args or {},
        # SGLang's per-scheduler state, where its clients read the live tier
        "internal_states": [{"speculative_num_steps": steps, "speculative_eagle_topk": topk,
                             "speculative_num_draft_tokens": tokens, "avg_spec_accept_length": stats["mean_accept_length"] + 1 if rounds else None,
                             "last_gen_throughput": stats.get("tokens_per_second", 0.0)}],
        "cpu": cpu_capability().as_dict(),  # what the dtype and kernel choices saw (docs/engine.md)
    }
    if "tiers" in stats:  # the candidates, each with its shape (a row's "key" is the pool's)
        rows = [{**row, "key": row["speculative_num_steps"], **(tier := Tier.from_key(row["speculative_num_steps"]))
                 .as_dict(), "tier": tier.label} for row in stats["tiers"] if isinstance(row, dict)]
        info["candidate_steps"] = [row["tier"] if row["speculative_eagle_topk"] > 1 else row["speculative_num_steps"]
                                   for row in rows] or None
        info["tiers"] = rows
    return info
