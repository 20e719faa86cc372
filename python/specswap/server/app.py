"""The HTTP server: FastAPI routes over the scheduler that owns the engine.

    POST /v1/completions, POST /v1/chat/completions   OpenAI's API (streaming SSE or not; usage counts)
    POST /generate                                     SGLang's native API (native.py)
    GET  /v1/models, /health, /server_info (also /get_server_info), /metrics (Prometheus text format)

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``. A request is parsed,
validated and tokenized on the event loop; only a valid one reaches the scheduler, so a bad request never
disturbs the running batch. A client that disconnects, streaming or not, has its requests aborted, which frees
their slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specswap.capability import cpu_capability
from specswap.server import native, protocol
from specswap.server.metrics import CONTENT_TYPE, ServerMetrics
from specswap.server.protocol import APIError, ParsedRequest
from specswap.server.scheduler import Scheduler, Update

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_PROMPT_CHARS = 200_000


def _error_response(error: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


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


def create_app(engine, model_name: str, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS, server_args: dict[str, Any] | None = None) -> FastAPI:
    """The app serving ``engine`` (which it owns from now on: only the scheduler thread may touch it)."""
    metrics = ServerMetrics()
    scheduler = Scheduler(engine, on_round=metrics.on_round)
    metrics.attach(scheduler)
    started = time.time()

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

    def _submit_checks(parsed: ParsedRequest, param: str) -> list[int]:
        if not scheduler.alive:
            raise APIError(503, f"the engine loop has stopped: {scheduler.error!r}", None, "engine_dead",
                           "server_error")
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

    async def _admit(items: list[ParsedRequest], param: str) -> list[tuple[Update, asyncio.Queue]]:
        """Queue every prompt of a request (all checked first, so a bad one queues none); the first update of
        each, which carries its request id, and its update queue."""
        prompt_ids = [_submit_checks(item, param) for item in items]
        queues = [scheduler.submit(ids, item.params) for ids, item in zip(prompt_ids, items)]
        firsts = [await updates.get() for updates in queues]
        errors = [first.error for first in firsts if first.error is not None]
        if errors:
            for first in firsts:
                if first.request_id is not None:
                    scheduler.abort(first.request_id)
            raise APIError(400, errors[0], param)
        return list(zip(firsts, queues))

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
                    scheduler.abort(first.request_id)
        for update in finals or ():
            if update.error is not None:
                raise APIError(500, update.error, None, "engine_error", "server_error")
        return finals

    async def _generate(request: Request, parsed: ParsedRequest, chat: bool):
        param = "messages" if chat else "prompt"
        [(first, updates)] = await _admit([parsed], param)
        request_id, prompt_tokens = first.request_id, first.prompt_tokens
        response_id = protocol.new_id("chatcmpl" if chat else "cmpl")
        created = protocol.now()
        kind = "chat.completion" if chat else "text_completion"
        if not parsed.stream:
            finals = await _finals(request, [(first, updates)])
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
            if not finished:  # the client went away (or the server is stopping): free the slot
                scheduler.abort(request_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _read_json(request, max_body_bytes)
        return await _generate(request, protocol.parse_completion(body, max_prompt_chars), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _read_json(request, max_body_bytes)
        return await _generate(request, protocol.parse_chat(body, engine.tokenizer, max_prompt_chars), chat=True)

    decode = engine.tokenizer.decode if engine.tokenizer is not None else None
    speculative = engine.speculative_algorithm is not None
    max_steps = engine.max_steps  # the largest tier: the acceptance histogram's last bin

    def _native_output(update: Update, item: ParsedRequest, rid: str, started: float, text: str | None = None):
        reason = native.finish_reason(update.finish_reason, update.token_ids, update.text, item.params,
                                      engine.eos_token_ids, decode)
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
            for wait in waits.values():
                wait.cancel()
            for index in running:  # the client went away (or the server is stopping): free the slots
                scheduler.abort(admitted[index][0].request_id)

    @app.post("/generate")
    async def generate(request: Request):
        started = time.monotonic()
        body = await _read_json(request, max_body_bytes)
        parsed = native.parse_generate(body, max_prompt_chars)
        admitted = await _admit(parsed.items, parsed.param)
        rids = [uuid.uuid4().hex for _ in admitted]
        if parsed.stream:
            return StreamingResponse(_native_stream(admitted, parsed, rids, started), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        finals = await _finals(request, admitted)
        if finals is None:
            return Response(status_code=499)
        outputs = [_native_output(update, item, rid, started) for update, item, rid in zip(finals, parsed.items, rids)]
        return JSONResponse(outputs if parsed.batched else outputs[0])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(started),
                                            "owned_by": "specswap", "max_model_len": engine.max_seq_len}]}

    @app.get("/health")
    async def health():
        if not scheduler.alive:
            return JSONResponse({"status": "error", "error": repr(scheduler.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's older name, which its benchmark reads
    async def server_info():
        return server_info_dict(scheduler, model_name, engine, server_args, started)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


def server_info_dict(scheduler: Scheduler, model_name: str, engine, server_args: dict | None,
                     started: float) -> dict[str, Any]:
    """Tier, EMA, acceptance, switches and per-tier rounds, from the scheduler's snapshot."""
    stats = dict(scheduler.snapshot)
    rounds = stats.get("num_verify_rounds", 0)
    speculative = stats.get("speculative_algorithm") is not None
    steps = stats.get("current_steps", 0) if speculative else 0
    info = {
        "model": model_name,
        "speculative_algorithm": stats.get("speculative_algorithm"),
        "speculative_adaptive": stats.get("adaptive", False),
        "weights": stats.get("weights"),
        "speculative_num_steps": steps,
        "speculative_num_draft_tokens": steps + 1 if speculative else 0,
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
        "internal_states": [{"speculative_num_steps": steps, "speculative_num_draft_tokens": steps + 1 if speculative
                             else 0, "avg_spec_accept_length": stats["mean_accept_length"] + 1 if rounds else None,
                             "last_gen_throughput": stats.get("tokens_per_second", 0.0)}],
        "cpu": cpu_capability().as_dict(),  # what the dtype and kernel choices saw (docs/engine.md)
    }
    if "tiers" in stats:
        info["candidate_steps"] = [row.get("speculative_num_steps") for row in stats["tiers"]
                                   if isinstance(row, dict)] or None
        info["tiers"] = stats["tiers"]
    return info
