"""Start, serve and stop a distributed server under torchrun, N times: two data-parallel groups of a tensor-parallel
pair (4 ranks, ``serve --tp-size 2 --dp-size 2``, adaptive so every step holds the agreement), each leader answers
one completion, then every rank gets SIGTERM (what torchrun passes on to its workers). A loop passes when torchrun
exits 0, which it does only when every rank exited 0, and no rank printed an abort.

    python bench/loop_distributed_start_stop.py --loops 50 [--output results.json]

Prints (and writes with ``--output``) a JSON summary: loops, passed, each failure's exit status and output tail,
and the seconds each phase took (start-up to both leaders healthy, the two completions, stop).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABORTS = ("terminate called", "Aborted", "Fatal Python error")


def _free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 free."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = sock.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            taken = []
            for port in range(first, first + count):
                sock = socket.socket()
                taken.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
    raise RuntimeError("no run of free ports")


def _get(url: str, timeout: float = 2.0, body: dict | None = None) -> tuple[int, dict | None]:
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        text = answer.read()
        return answer.status, (json.loads(text) if body is not None else None)


def leader_ports(port: int) -> list[int]:
    """Where the two data-parallel leaders serve: behind sglang-router (the router extra) on ``port`` + 1 and + 2,
    the router on ``port``; else ``port`` and ``port`` + 1 (``server.router_launch.place_groups``)."""
    sys.path.insert(0, str(ROOT / "python"))
    from specswap.server.router_launch import router_installed
    return [port + 1, port + 2] if router_installed() else [port, port + 1]


def one_loop(args: argparse.Namespace) -> dict:
    port, master = _free_ports(4), _free_ports(1)  # the router, two groups, the router's metrics
    leaders = leader_ports(port)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(master),
               "-m", "specswap.cli", "serve", "--tp-size", "2", "--dp-size", "2", "--model", args.model, "--dtype",
               "float32", "--speculative-algorithm", "NGRAM", "--speculative-adaptive", "--port", str(port),
               "--dist-timeout", str(args.dist_timeout)]
    began = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    record: dict = {}
    try:
        healthy = set()
        while len(healthy) < 2:  # both data-parallel leaders, each on its own port
            if proc.poll() is not None:
                raise RuntimeError("torchrun exited during start-up")
            if time.monotonic() - began > args.start_timeout:
                raise RuntimeError(f"the leaders were not healthy within {args.start_timeout} s")
            for leader in leaders:
                try:
                    if _get(f"http://127.0.0.1:{leader}/health")[0] == 200:
                        healthy.add(leader)
                except (OSError, http.client.HTTPException):
                    # not listening yet; a poll of a free port in the ephemeral range can even connect to itself
                    # (TCP simultaneous open) and read its own request back as the status line
                    pass
            time.sleep(0.2)
        record["start_seconds"] = time.monotonic() - began
        served = time.monotonic()
        for leader in leaders:
            _, answer = _get(f"http://127.0.0.1:{leader}/v1/completions", timeout=60,
                             body={"model": args.model, "prompt": "def fibonacci(n):\n    ", "max_tokens": 16,
                                   "temperature": 0})
            assert answer["choices"][0]["text"], answer
        record["serve_seconds"] = time.monotonic() - served
        stopping = time.monotonic()
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in workers:
            os.kill(int(pid), signal.SIGTERM)
        output, _ = proc.communicate(timeout=args.stop_timeout)
        record["stop_seconds"] = time.monotonic() - stopping
        record["status"] = proc.returncode
        record["workers"] = len(workers)
    except Exception as error:  # noqa: BLE001 - a failed loop is recorded, the next one runs
        record["error"] = f"{type(error).__name__}: {error}"
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        record["status"] = proc.returncode
    record["aborts"] = sum(output.count(word) for word in ABORTS)
    record["passed"] = record["status"] == 0 and "error" not in record and not record["aborts"]
    if not record["passed"]:
        record["output_tail"] = output[-4000:]
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=50)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dist-timeout", type=float, default=10.0, help="--dist-timeout of the ranks")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--stop-timeout", type=float, default=120.0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    records = []
    for index in range(args.loops):
        record = one_loop(args)
        records.append(record)
        print(f"loop {index + 1}/{args.loops}: {'ok' if record['passed'] else 'FAILED'} (status {record['status']}"
              f"{', ' + record['error'] if 'error' in record else ''})", file=sys.stderr, flush=True)
    passed = [r for r in records if r["passed"]]

    def median(key):
        values = [r[key] for r in passed if key in r]
        return round(statistics.median(values), 2) if values else None
    summary = {"loops": len(records), "passed": len(passed), "layout": "tp_size=2 x dp_size=2 (4 ranks), torchrun",
               "model": args.model, "dist_timeout": args.dist_timeout,
               "median_seconds": {phase: median(f"{phase}_seconds") for phase in ("start", "serve", "stop")},
               "failures": [dict(r, loop=i + 1) for i, r in enumerate(records) if not r["passed"]]}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0 if len(passed) == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
