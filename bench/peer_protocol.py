"""The line protocol of the benchmark's peer workers (bench/llamacpp_worker.py, bench/openvino_worker.py), each in
a process (and a venv) of its own: standard library only, so either venv's python imports it from beside the
worker script."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, TextIO


def answer_channel() -> TextIO:
    """The answer channel, a copy of file descriptor 1; 1 itself then points at stderr, so whatever the peer
    prints (from C, C++ or Python) stays off it."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(out: TextIO, answer: Callable[[dict], Any]) -> None:
    """Each request line on stdin answered with ``{"result": ...}``, or ``{"error": "..."}`` (the worker goes
    on), until the end of input."""
    for line in sys.stdin:
        try:
            reply = {"result": answer(json.loads(line))}
        except Exception as error:  # noqa: BLE001  (reported to the parent, which raises it)
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
