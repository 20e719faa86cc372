"""``run_local(argv, world)``: ``world`` copies of a command on this machine as ranks of one job (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as torchrun sets them, one thread each unless told), for benchmarks
that compare a multi-process run with a one-process run in one invocation. torchrun is the launcher for
everything else (README, "Several processes")."""

from __future__ import annotations

import os
import socket
import subprocess

__all__ = ["free_port", "run_local"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_local(argv: list[str], world: int, threads: int = 1, timeout_s: float = 3600,
              env: dict[str, str] | None = None) -> list[str]:
    """Run ``argv`` as ranks 0..world-1 and wait; every rank's output (stdout and stderr); a rank that fails
    raises, with its output."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads), **(env or {}))
        rank_env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen(argv, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise RuntimeError(f"rank {rank} ran past {timeout_s} s") from None
        if proc.returncode != 0:
            for other in procs:
                other.kill()
            raise RuntimeError(f"rank {rank} exited {proc.returncode}:\n{out[-4000:]}")
        outputs.append(out)
    return outputs
