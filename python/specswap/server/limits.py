"""The server's admission limits and drain settings, and the ``specswap serve`` flags that set them (no fastapi
import: the CLI builds its parser from this module).

``--max-running-requests`` is the engine's batch (cache slots), so it is passed to the engine, not kept here.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

DEFAULT_MAX_QUEUED_REQUESTS = 128
DEFAULT_MAX_PROMPTS_PER_REQUEST = 64
DEFAULT_MAX_PROMPT_CHARS = 200_000
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_HEADER_TIMEOUT = 10.0  # seconds a connection may take to send a request's headers (then 408 and closed)
DEFAULT_BODY_TIMEOUT = 30.0    # seconds a request may take to send its body (then 408)
RETRY_AFTER_SECONDS = 1     # the Retry-After header of a 503


@dataclass(frozen=True)
class ServerLimits:
    """What the server admits. ``request_timeout`` None: no deadline unless a request sets its own."""

    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    request_timeout: float | None = None
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    api_key_probes: bool = False  # --api-key also guards /health, /health_generate and /metrics

    def __post_init__(self):
        for name in ("max_prompts_per_request", "max_prompt_chars", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_queued_requests, bool) or not isinstance(self.max_queued_requests, int) \
                or self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be an integer >= 0, got {self.max_queued_requests!r}")
        if self.request_timeout is not None and not (isinstance(self.request_timeout, (int, float))
                                                     and math.isfinite(self.request_timeout)
                                                     and self.request_timeout > 0):
            raise ValueError(f"--request-timeout must be a number of seconds > 0, got {self.request_timeout!r}")
        if not (isinstance(self.drain_timeout, (int, float)) and math.isfinite(self.drain_timeout)
                and self.drain_timeout >= 0):
            raise ValueError(f"--drain-timeout must be a number of seconds >= 0, got {self.drain_timeout!r}")
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a number of seconds > 0, got {value!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerLimits:
        return cls(max_queued_requests=args.max_queued_requests, request_timeout=args.request_timeout,
                   max_prompts_per_request=args.max_prompts_per_request, max_prompt_chars=args.max_prompt_chars,
                   max_body_bytes=args.max_body_bytes, drain_timeout=args.drain_timeout,
                   header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                   api_key_probes=args.api_key_probes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The admission and drain flags of ``specswap serve`` (SGLang's names where it has them)."""
    parser.add_argument("--max-running-requests", type=int, default=None,
                        help="requests decoded together (the engine's batch, cache slots); the same as "
                             "--max-batch-size, which it overrides")
    parser.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS,
                        help="admitted requests waiting for a slot; past it a request gets 503 with Retry-After "
                             f"(default {DEFAULT_MAX_QUEUED_REQUESTS})")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="seconds from arrival after which a request is aborted (finish reason 'timeout'); "
                             "a request's own 'request_timeout' may only shorten it (default: none)")
    parser.add_argument("--max-prompts-per-request", type=int, default=DEFAULT_MAX_PROMPTS_PER_REQUEST,
                        help=f"prompts in one /generate batch; more is a 400 "
                             f"(default {DEFAULT_MAX_PROMPTS_PER_REQUEST})")
    parser.add_argument("--max-prompt-chars", type=int, default=DEFAULT_MAX_PROMPT_CHARS,
                        help=f"characters (or token ids) in one prompt; more is a 400 "
                             f"(default {DEFAULT_MAX_PROMPT_CHARS})")
    parser.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT,
                        help="on SIGTERM / SIGINT: seconds to let admitted requests finish before the rest are "
                             f"aborted (finish reason 'shutdown') and the server exits 0 "
                             f"(default {DEFAULT_DRAIN_TIMEOUT:g})")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
                        help="seconds a connection may take to send a request's headers; a slower one gets 408 and is "
                             f"closed (default {DEFAULT_HEADER_TIMEOUT:g})")
    parser.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
                        help="seconds a request may take to send its body; a slower one gets 408 "
                             f"(default {DEFAULT_BODY_TIMEOUT:g})")


def max_running_requests(args: argparse.Namespace) -> int:
    """The engine batch: --max-running-requests when given, else --max-batch-size."""
    running = args.max_running_requests
    if running is None:
        return args.max_batch_size
    if running < 1:
        raise ValueError(f"--max-running-requests must be >= 1, got {running}")
    return running
