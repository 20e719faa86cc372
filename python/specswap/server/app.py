"""The HTTP server: an app over one ``ServerState``, its routes in modules of their own, run by uvicorn.

    openai_routes    POST /v1/completions, POST /v1/chat/completions (SSE or not; usage), GET /v1/models
    native_routes    POST /generate (SGLang's native API), POST /abort_request, GET|POST /flush_cache
    control_routes   GET /health, /health_generate, /model_info (/get_model_info), /server_info (/get_server_info),
                     /metrics (Prometheus); the SIGTERM drain
    router_routes    what SGLang's router reads: /get_load, /v1/responses refused, its gRPC probe answered

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``. A request is parsed,
validated and tokenized on the event loop; only a valid one reaches the scheduler (``state.Admission``), so a bad
request never disturbs the running batch, and no route touches the engine (``state.ModelFacts``). Admission is
bounded (``limits.ServerLimits``): past ``--max-running-requests + --max-queued-requests`` a request gets 503 with
Retry-After. A client that disconnects, streaming or not, has its requests aborted, which frees their slots; so does
a request past its deadline. ``serve`` runs the app under uvicorn with a graceful drain on SIGTERM / SIGINT, header
and body timeouts, and an exit (status 1 for the CLI) when the engine fails in shared state.
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
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException

from specswap.server import router_routes
from specswap.server.control_routes import add_control_routes, drain
from specswap.server.limits import ServerLimits
from specswap.server.metrics import ServerMetrics
from specswap.server.native_routes import add_native_routes
from specswap.server.openai_routes import add_openai_routes
from specswap.server.protocol import APIError
from specswap.server.scheduler import Scheduler
from specswap.server.state import Admission, ModelFacts, ServerState, error_response

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE = 15            # seconds uvicorn waits for responses still being sent after the drain
PROBES = ("/health", "/health_generate", "/metrics")   # open under --api-key unless --api-key-probes


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
                response = error_response(APIError(401, "missing or invalid API key: send 'Authorization: Bearer "
                                                   "<key>'", None, "invalid_api_key", "authentication_error"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
    server_args = server_args or {}
    facts = ModelFacts.of(engine, model_name, router_routes.worker_identity(engine, model_name, server_args))
    metrics = ServerMetrics()
    scheduler = Scheduler(engine, on_round=metrics.on_round)
    metrics.attach(scheduler)
    state = ServerState(facts, scheduler, metrics, limits, server_args)

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
    app.state.server, app.state.scheduler, app.state.metrics, app.state.limits = state, scheduler, metrics, limits
    app.state.closing, app.state.drain_state = state.closing, state.drain_state
    app.state.drain = lambda timeout=None: drain(state, timeout)
    app.state.cut_drain = lambda: state.drain_state.update(cut=True)  # a second signal: safe in a handler

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(APIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                                       None, None, kind))

    if api_key is not None:
        app.add_middleware(_BearerKey, api_key=api_key, probes=limits.api_key_probes)
    admission = Admission(state)
    add_openai_routes(app, state, admission)
    add_native_routes(app, state, admission)
    add_control_routes(app, state)
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
