"""SGLang's native routes: ``POST /generate`` (bodies and outputs: ``native``), ``POST /abort_request`` and
``GET|POST /flush_cache``, over the shared admission (``state.Admission``)."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specswap.server import native, protocol
from specswap.server.protocol import APIError, ParsedRequest
from specswap.server.scheduler import Update
from specswap.server.state import Admission, ServerState, failure, sse


class _Outputs:
    """SGLang's output objects for one /generate body."""

    def __init__(self, state: ServerState, parsed: native.GenerateRequest, rids: list[str], started: float):
        self.facts, self.parsed, self.rids, self.started = state.facts, parsed, rids, started
        tokenizer = state.facts.tokenizer
        self.decode = tokenizer.decode if tokenizer is not None else None

    def output(self, index: int, update: Update, text: str | None = None) -> dict:
        item: ParsedRequest = self.parsed.items[index]
        reason = native.finish_reason(update.finish_reason, update.token_ids, update.text, item.params,
                                      self.facts.eos_token_ids, self.decode, update.abort_message)
        output = {"text": update.text if text is None else text, "output_ids": list(update.token_ids),
                  "meta_info": native.meta_info(self.rids[index], update, reason, time.monotonic() - self.started,
                                                self.facts.speculative, self.facts.max_steps)}
        if self.parsed.batched and text is not None:
            output["index"] = index
        return output

    async def stream(self, admitted, admission: Admission):
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
                        yield sse(failure(update).body())
                        break
                    if update.finish_reason == "error":  # this prompt's own fault: the batch's others go on
                        running.discard(index)
                        body = failure(update).body()
                        if self.parsed.batched:
                            body["index"] = index
                        yield sse(body)
                        continue
                    done = update.finish_reason is not None
                    safe = protocol.stream_safe_length(update.text, self.parsed.items[index].params.stop, done)
                    if safe > sent[index] or done:
                        sent[index] = safe
                        yield sse(self.output(index, update, update.text[:safe]))
                    if done:
                        running.discard(index)
            yield "data: [DONE]\n\n"
        finally:
            admission.forget(self.rids)
            for wait in waits.values():
                wait.cancel()
            for index in running:
                admission.abort(admitted[index][0].request_id)


def _abort_body(body) -> tuple[str | None, bool, str]:
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    for key in body:
        if key not in ("rid", "abort_all", "abort_message"):
            raise APIError(400, f"unknown field '{key}'; /abort_request takes rid, abort_all, abort_message", key)
    rid, abort_all = body.get("rid"), protocol.flag(body, "abort_all")
    message = body.get("abort_message") or "aborted by /abort_request"
    if not isinstance(message, str):
        raise APIError(400, f"'abort_message' must be a string, got {message!r:.80}", "abort_message")
    if not abort_all and (not isinstance(rid, str) or not rid):
        raise APIError(400, f"'rid' must be a non-empty string (or send abort_all: true), got {rid!r:.80}", "rid")
    return rid, abort_all, message


def add_native_routes(app: FastAPI, state: ServerState, admission: Admission) -> None:
    scheduler = state.scheduler

    @app.post("/generate")
    async def generate(request: Request):
        started = time.monotonic()
        body = await state.read_json(request)
        parsed = native.parse_generate(body, state.limits.max_prompt_chars, state.limits.max_prompts_per_request)
        rids = parsed.rids or [uuid.uuid4().hex for _ in parsed.items]
        admitted = await admission.admit(parsed.items, parsed.param, started, rids)
        outputs = _Outputs(state, parsed, rids, started)
        if parsed.stream:
            return StreamingResponse(outputs.stream(admitted, admission), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            finals = await admission.finals(request, admitted)
        finally:
            admission.forget(rids)
        if finals is None:
            return Response(status_code=499)
        answers = [outputs.output(index, update) for index, update in enumerate(finals)]
        return JSONResponse(answers if parsed.batched else answers[0])

    @app.post("/abort_request")
    async def abort_request(request: Request):
        """SGLang's abort: ``{"rid": ...}`` ends that request (finish reason "abort"), ``{"abort_all": true}``
        every request; an unknown or finished rid is no error (it may have just finished)."""
        rid, abort_all, message = _abort_body(await state.read_json(request))
        if abort_all:
            aborted = scheduler.inflight
            scheduler.abort_all("abort", message)
            return {"success": True, "aborted": aborted}
        request_id = state.live_rids.get(rid)
        if request_id is not None:
            scheduler.abort(request_id, "abort", message)
        return {"success": True, "aborted": int(request_id is not None)}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        """SGLang's cache flush, refused (400) while requests run, as SGLang refuses it: this server keeps no
        prefix cache; SUFFIX's global tree of recent outputs is emptied, on the scheduler thread."""
        busy = scheduler.inflight + scheduler.snapshot.get("running", 0)
        if busy:
            raise APIError(400, f"{scheduler.inflight} requests are running or queued; the cache is flushed only "
                                f"while the server is idle", None, "server_busy")
        try:
            await scheduler.call(lambda engine: engine.flush_cache())
        except ValueError as error:  # the engine refused (and is unchanged)
            raise APIError(400, str(error), None, "flush_failed") from error
        except RuntimeError as error:
            raise APIError(503, f"the engine loop is not running: {error}", None, "engine_dead",
                           "server_error") from error
        return {"success": True, "message": "Cache flushed (no prefix cache; SUFFIX's global tree emptied)."}
