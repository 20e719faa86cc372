"""``specswap serve``: an HTTP server over the engine (OpenAI's API and SGLang's native one), with live adaptive
metrics.

    protocol.py   request validation, OpenAI error bodies (pure)
    chat.py       the model's own chat template, rendered in transformers' jinja2 sandbox
    native.py     SGLang's /generate: request bodies in, its output objects out (pure)
    scheduler.py  the one thread that owns the engine (continuous batching through add_request/step)
    metrics.py    Prometheus registry: tier, draft tokens, accept-length histogram, switches, tokens, queues
    app.py        FastAPI routes: /v1/completions, /v1/chat/completions, /generate, /v1/models, /health,
                  /server_info, /metrics
    router_routes.py, router_launch.py   what SGLang's router reads; ``--dp-size`` behind it (docs/scale-out.md)

The server imports the engine; the engine never imports the server. Needs ``pip install "specswap[serve]"``.
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str):
    if name == "create_app":  # lazy: importing the package must not need fastapi
        from specswap.server.app import create_app
        return create_app
    raise AttributeError(name)
