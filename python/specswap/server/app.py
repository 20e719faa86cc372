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
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specswap.capability import cpu_capability
from specswap.sampling import SamplingParams
from specswap.server import native, protocol
from specswap.server.limits import RETRY_AFTER_SECONDS, ServerLimits
from specswap.server.metrics import CONTENT_TYPE, ServerMetrics
from specswap.server.protocol import APIError, ParsedRequest
from specswap.server.scheduler import Scheduler, Update

HEALTH_TIMEOUT = 20.0          # /health_generate: seconds the engine may take to show it is alive
SHUTDOWN_GRACE = 15            # seconds uvicorn waits for responses still being sent after the drain
CLIENT_GONE = "the client disconnected"


def _error_response(error: APIError) -> JSONResponse:
    headers = dict(error.headers or {})
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error.body(), status_code=error.status, headers=headers or None)


async def _read_json(request: Request, max_body_bytes: int) -> Any:
    """The body as JSON: 413 past ``max_body_bytes`` (checked before and while reading), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise APIError(413, f"request body of {declared} bytes is larger than the limit of {max_body_bytes} bytes",
                       None, "request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise APIError(413, f"request body is larger than the limit of {max_body_bytes} bytes", None,
                           "request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}", None, "invalid_json") from error


class _BearerKey:
    """Every request must carry ``Authorization: Bearer <api_key>``, else 401. A plain ASGI middleware, not
    ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware hides the client's ``http.disconnect`` from the
    route, so ``request.is_disconnected()`` would never turn true and a dropped request would keep its slot."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("latin-1"), self.api_key):
                response = _error_response(APIError(401, "missing or invalid API key: send 'Authorization: Bearer "
                                                    "<key>'", None, "invalid_api_key", "authentication_error"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
    scheduler = Scheduler(engine, on_round=metrics.on_round)
    metrics.attach(scheduler)
    started = time.time()
    capacity = engine.max_batch_size + limits.max_queued_requests
    live_rids: dict[str, int] = {}   # rid (/generate's, or an OpenAI response id) -> scheduler request id
    drain_state = {"cut": False, "report": None}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
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
        app.add_middleware(_BearerKey, api_key=api_key)

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
            if update.error is not None:
                raise APIError(500, update.error, None, "engine_error", "server_error")
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
                if update.error is not None:
                    finished = True
                    yield _sse(APIError(500, update.error, None, "engine_error", "server_error").body())
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
        body = await _read_json(request, max_body_bytes)
        return await _generate(request, protocol.parse_completion(body, max_prompt_chars), False, arrived)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrived = time.monotonic()
        body = await _read_json(request, max_body_bytes)
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
                        yield _sse(APIError(500, update.error, None, "engine_error", "server_error").body())
                        break
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
        body = await _read_json(request, max_body_bytes)
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
        return {"model_path": path, "tokenizer_path": path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "served_model_name": model_name, "max_seq_len": engine.max_seq_len}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        """SGLang's abort: ``{"rid": ...}`` ends that request (finish reason "abort"), ``{"abort_all": true}``
        every request; an unknown or finished rid is no error (it may have just finished)."""
        body = await _read_json(request, max_body_bytes)
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
        info = server_info_dict(scheduler, model_name, engine, server_args, started)
        info.update(max_running_requests=engine.max_batch_size, max_queued_requests=limits.max_queued_requests,
                    request_timeout=limits.request_timeout, max_prompts_per_request=limits.max_prompts_per_request,
                    max_prompt_chars=limits.max_prompt_chars, drain_timeout=limits.drain_timeout,
                    draining=metrics.draining, num_requests_admitted=scheduler.inflight,
                    requests_rejected=dict(metrics.rejected),
                    requests_speculation_disabled=scheduler.counters.speculation_disabled,
                    speculative_tiers=engine.tier_report())
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
    app.state.drain_state = drain_state

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful drain: the first SIGTERM or SIGINT runs the app's ``drain`` while the
    server keeps listening (so new requests and /health get 503, not a refused connection), then exits normally
    (status 0; the signal is not re-raised). A second signal cuts the drain's wait short; a third exits at once."""

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
        if self.signals and self._drain is None:
            self._drain = asyncio.ensure_future(self.app.state.drain())
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)


def serve(app: FastAPI, host: str, port: int, log_level: str = "warning") -> dict[str, Any] | None:
    """Run ``app`` until SIGTERM / SIGINT, drain it, and return the drain's report (None if it never drained)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=SHUTDOWN_GRACE)
    DrainingServer(config, app).run()
    return app.state.drain_state["report"]


def server_info_dict(scheduler: Scheduler, model_name: str, engine, server_args: dict | None,
                     started: float) -> dict[str, Any]:
    """Tier, EMA, acceptance, switches and per-tier rounds, from the scheduler's snapshot."""
    stats = dict(scheduler.snapshot)
    rounds = stats.get("num_verify_rounds", 0)
    speculative = stats.get("speculative_algorithm") is not None
    steps = stats.get("current_steps", 0) if speculative else 0
    _, topk, tokens = engine.worker.tier_shapes().get(steps, (steps, 1, steps + 1)) if speculative else (0, 1, 0)
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
        "rounds_per_tier": {str(k): v for k, v in stats.get("rounds_per_tier", {}).items()},
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
    if "tiers" in stats:
        info["candidate_steps"] = [row.get("speculative_num_steps") for row in stats["tiers"]
                                   if isinstance(row, dict)] or None
        info["tiers"] = stats["tiers"]
    return info
