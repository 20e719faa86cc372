"""What SGLang's router (``sglang-router``, docs/scale-out.md) reads from a worker, beside the routes it forwards.

    GET /get_load                 SGLang's load list ``[{dp_rank, num_reqs, num_waiting_reqs, num_tokens}]``, from
                                  the scheduler's counts and snapshot (never the engine): power-of-two routing's
                                  signal (the router balances on ``num_tokens``)
    /v1/responses (and below)     refused by name, 501: this server has no Responses API
    ``worker_identity``           the keys the router reads at the top level of /server_info and /model_info

The router probes a worker's HTTP port with gRPC first (an HTTP/2 preface), then falls back to HTTP; uvicorn
would warn "Invalid HTTP request received" for each probe: ``AnswerGrpcProbe`` answers it 505 and closes.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request

from specswap.server.protocol import APIError


def _model_type(target: Any) -> str | None:
    """The checkpoint ``model_type`` whose class built ``target`` (None for a class no checkpoint row names)."""
    from specswap.models.checkpoint import MODEL_ARCHITECTURES  # noqa: PLC0415

    config_type = getattr(getattr(target, "config", None), "model_type", None)
    if isinstance(config_type, str):
        return config_type
    return next((name for name, row in MODEL_ARCHITECTURES.items() if row.model_class is type(target)), None)


def worker_identity(engine, model_name: str, server_args: dict[str, Any] | None) -> dict[str, Any]:
    """The keys sglang-router reads at the top level of /server_info and /model_info. ``dp_size`` is the
    data-parallel ranks behind this URL: 1, since each specswap group serves its own port (``--dp-size`` behind
    the router: ``router_launch``); the job's group count stays in ``server_args``."""
    args = server_args or {}
    target = getattr(engine, "target", None)
    return {"model_path": args.get("model") or model_name, "served_model_name": model_name,
            "tp_size": args.get("tp_size") or 1, "dp_size": 1,
            "model_type": _model_type(target) if target is not None else None,
            "architectures": [type(target).__name__] if target is not None else None}


def load_entry(scheduler) -> dict[str, int]:
    """This worker's line of SGLang's /get_load: requests admitted (``inflight``: queued, waiting or running, counted
    at admission) and the tokens the engine holds (prompt and output of running requests, waiting prompts)."""
    stats = scheduler.snapshot
    running = stats.get("running", 0)
    requests = max(scheduler.inflight, running + stats.get("waiting", 0))
    return {"dp_rank": 0, "num_reqs": requests, "num_waiting_reqs": max(requests - running, 0),
            "num_tokens": int(stats.get("num_tokens", 0))}


class AnswerGrpcProbe:
    """Answers the router's gRPC probe: h11 reads an HTTP/2 preface as a request ``PRI *`` of version 2.0 followed
    by bytes that are no request. Answered 505 (HTTP/1.1 only) with ``Connection: close``, the connection ends
    before those bytes are parsed, so uvicorn warns of no invalid request. A plain ASGI middleware, outermost (no
    API key is asked of a probe)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "PRI" and scope.get("http_version") == "2.0":
            body = json.dumps(APIError(505, "this server speaks HTTP/1.1 only (no HTTP/2, no gRPC)", None,
                                       "http_version_not_supported").body()).encode()
            await send({"type": "http.response.start", "status": 505,
                        "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def add_router_routes(app: FastAPI, *, scheduler) -> None:
    """Add /get_load (over ``scheduler``) and the /v1/responses refusal to ``app``, and answer the router's gRPC
    probes (call it after every other middleware is added: this one must be outermost)."""
    app.add_middleware(AnswerGrpcProbe)

    @app.get("/get_load")
    async def get_load():
        return [load_entry(scheduler)]

    @app.api_route("/v1/responses", methods=["GET", "POST", "DELETE"])
    @app.api_route("/v1/responses/{rest:path}", methods=["GET", "POST", "DELETE"])
    async def responses(request: Request):
        raise APIError(501, f"{request.method} {request.url.path}: this server does not implement OpenAI's "
                            f"Responses API; use /v1/chat/completions or /v1/completions", None,
                       "unsupported_endpoint")
