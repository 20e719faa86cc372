"""Start N ranks of ``tests/distributed/scenarios.py SCENARIO`` as separate processes on this machine (gloo over
localhost, one thread each), the way torchrun would: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Each rank writes
its result as JSON to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("scenarios.py")


def package_path() -> str:
    """PYTHONPATH for a rank: the folder holding the specswap these tests import (the installed package in CI, a
    source checkout with its built extension locally), ahead of whatever the caller had."""
    import specswap

    return str(Path(specswap.__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(scenario: str, world: int, out: Path, timeout_s: float = 10.0, extra_env: dict | None = None,
          args: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", SPECSWAP_DIST_TIMEOUT=str(timeout_s),
                   PYTHONPATH=package_path())
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, str(SCENARIOS), scenario, str(out), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def wait(procs: list[subprocess.Popen], timeout_s: float) -> list[tuple[int, str]]:
    """Every rank's (exit code, output); a rank still running after ``timeout_s`` is killed (code None)."""
    deadline = time.monotonic() + timeout_s
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append((proc.returncode, out))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            results.append((None, out))
    return results


def run(scenario: str, world: int, out: Path, timeout_s: float = 120.0, timeout_s_collectives: float = 10.0,
        **kwargs) -> list[dict]:
    """Run a scenario on ``world`` ranks (``timeout_s_collectives``: their ``SPECSWAP_DIST_TIMEOUT``); every rank
    must exit 0; their JSON results in rank order."""
    results = wait(start(scenario, world, out, timeout_s_collectives, **kwargs), timeout_s)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]
