"""OpenAI's API: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as SSE or not, with usage) and
``GET /v1/models``, over the shared admission (``state.Admission``)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specswap.server import protocol
from specswap.server.protocol import ParsedRequest
from specswap.server.state import Admission, ServerState, failure, sse


class _Completion:
    """One admitted completion: its ids, and how its answer is written (text or chat, whole or streamed)."""

    def __init__(self, state: ServerState, parsed: ParsedRequest, chat: bool, response_id: str, first):
        self.state, self.parsed, self.chat, self.response_id = state, parsed, chat, response_id
        self.request_id, self.prompt_tokens = first.request_id, first.prompt_tokens
        self.created = protocol.now()
        self.kind = "chat.completion" if chat else "text_completion"

    def whole(self, update) -> dict[str, Any]:
        reason = protocol.finish_reason(update.finish_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": update.text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": update.text, "logprobs": None, "finish_reason": reason}
        return {"id": self.response_id, "object": self.kind, "created": self.created, "model": self.state.facts.name,
                "choices": [choice], "usage": protocol.usage(self.prompt_tokens, update.num_tokens)}

    def chunk(self, text: str | None, reason: str | None = None, role: bool = False, usage=None) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if usage is not None:
            choices = []
        elif self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]
        payload = {"id": self.response_id, "object": kind, "created": self.created, "model": self.state.facts.name,
                   "choices": choices}
        if usage is not None:
            payload["usage"] = usage
        return sse(payload)

    async def stream(self, updates, admission: Admission):
        finished, sent = False, 0
        try:
            if self.chat:
                yield self.chunk(None, role=True)
            while True:
                update = await updates.get()
                if (error := failure(update)) is not None:
                    finished = True
                    yield sse(error.body())
                    break
                done = update.finish_reason is not None
                safe = protocol.stream_safe_length(update.text, self.parsed.params.stop, done)
                if safe > sent:
                    yield self.chunk(update.text[sent:safe])
                    sent = safe
                if done:
                    finished = True
                    yield self.chunk(None, protocol.finish_reason(update.finish_reason))
                    if self.parsed.include_usage:
                        yield self.chunk(None, usage=protocol.usage(self.prompt_tokens, update.num_tokens))
                    break
            yield "data: [DONE]\n\n"
        finally:
            admission.forget([self.response_id])
            if not finished:
                admission.abort(self.request_id)


def add_openai_routes(app: FastAPI, state: ServerState, admission: Admission) -> None:
    facts = state.facts

    async def generate(request: Request, parsed: ParsedRequest, chat: bool, arrived: float):
        response_id = protocol.new_id("chatcmpl" if chat else "cmpl")
        [(first, updates)] = await admission.admit([parsed], "messages" if chat else "prompt", arrived,
                                                   [response_id])
        completion = _Completion(state, parsed, chat, response_id, first)
        if parsed.stream:
            return StreamingResponse(completion.stream(updates, admission), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            finals = await admission.finals(request, [(first, updates)])
        finally:
            admission.forget([response_id])
        if finals is None:
            return Response(status_code=499)
        return JSONResponse(completion.whole(finals[0]))

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrived = time.monotonic()
        body = await state.read_json(request)
        return await generate(request, protocol.parse_completion(body, state.limits.max_prompt_chars), False, arrived)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrived = time.monotonic()
        body = await state.read_json(request)
        parsed = protocol.parse_chat(body, facts.tokenizer, state.limits.max_prompt_chars)
        return await generate(request, parsed, True, arrived)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": facts.name, "object": "model", "created": int(state.started),
                                            "owned_by": "specswap", "max_model_len": facts.max_seq_len}]}
