"""Sustained load on ``specswap serve``: N closed-loop clients for M minutes against a server this script starts on
127.0.0.1, reporting latency percentiles, the 503 rate and the server's memory before and after.

    PYTHONPATH=python python bench/bench_serving_load.py [--clients 16] [--minutes 2] [--max-tokens 64]
        [--stream-fraction 0.5] [--deadline-fraction 0.1] [--deadline 2.0] [--seed 0] [--json PATH]
        [-- SERVE FLAGS]

The server is ``python -m specswap.cli serve`` with the flags after ``--`` (default: the tiny EAGLE pair, adaptive,
``--max-running-requests 4 --max-queued-requests 8``; ``--host`` / ``--port`` are this script's). Each client
sends one request at a time, over both APIs (``/v1/completions`` and ``/generate``), streaming or not, greedy, with
a prompt drawn from a fixed set; a ``--deadline-fraction`` of them carry ``request_timeout`` ``--deadline``. A
503 is counted and the client waits its Retry-After before the next request, as a well-behaved client does.

Reported: attempts by HTTP status, the 503 rate (503s / attempts), end-to-end latency p50 / p95 / p99 of the
answered requests (200s; and time to first chunk of the streams), completed requests and tokens per second,
finish reasons, and the server process's resident memory (VmRSS) after warm-up, after the run, and its peak
(VmHWM). Then the server gets SIGTERM and its drain and exit status are recorded. ``--json`` writes all of it with
the command, the CPU and the commit (``specswap.bench.provenance``). Linux only (memory from /proc).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

from specswap.bench.provenance import stamp, write_report

DEFAULT_SERVE = ["--model", "tiny", "--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--threads", "1",
                 "--disable-cuda-graph", "--max-running-requests", "4", "--max-queued-requests", "8"]
PROMPTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n    ", "The purpose of this module is",
           "for i in range(10):\n    print(", "class Stack:\n    def push(self, item):\n        ",
           "Once upon a time", "SELECT name FROM users WHERE", "x = [i * i for i in"]
CLIENT_TIMEOUT = 120.0    # seconds: bounds every request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mib(pid: int) -> dict[str, float | None]:
    """VmRSS (now) and VmHWM (peak) of a process, in MiB, from /proc; None where unavailable."""
    values: dict[str, float | None] = {"rss": None, "peak": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values["rss" if key == "VmRSS" else "peak"] = round(int(rest.split()[0]) / 1024, 1)
    except OSError:
        pass
    return values


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """Nearest-rank p50 / p95 / p99, the mean and the count."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def rank(p):
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 4)
    return {"n": len(ordered), "p50": rank(50), "p95": rank(95), "p99": rank(99),
            "mean": round(sum(ordered) / len(ordered), 4)}


def one_request(client: httpx.Client, rng: random.Random, args) -> dict[str, Any]:
    """Send one request; what it cost and how it ended."""
    api = rng.choice(("openai", "native"))
    stream = rng.random() < args.stream_fraction
    extra = {"request_timeout": args.deadline} if rng.random() < args.deadline_fraction else {}
    prompt = rng.choice(PROMPTS)
    if api == "openai":
        path, body = "/v1/completions", {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                                         "stream": stream, **extra}
    else:
        path, body = "/generate", {"text": prompt, "stream": stream, **extra,
                                   "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0}}
    record: dict[str, Any] = {"api": api, "stream": stream, "deadline": bool(extra)}
    began = time.perf_counter()
    try:
        if not stream:
            r = client.post(path, json=body)
            record["status"] = r.status_code
            final = r.json()
        else:
            with client.stream("POST", path, json=body) as r:
                record["status"] = r.status_code
                if r.status_code != 200:
                    r.read()
                    final = r.json()
                else:
                    final = None
                    for line in r.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        record.setdefault("ttft_s", time.perf_counter() - began)
                        if line != "data: [DONE]":
                            final = json.loads(line[len("data: "):])
                    record["complete"] = final is not None
        record["latency_s"] = time.perf_counter() - began
        if record["status"] == 503:
            record["retry_after"] = float(r.headers.get("retry-after", 1))
        elif record["status"] == 200 and final is not None:
            if api == "openai":
                record["finish_reason"] = final["choices"][0]["finish_reason"]
                record["tokens"] = (final.get("usage") or {}).get("completion_tokens")
            else:
                reason = final["meta_info"]["finish_reason"]
                record["finish_reason"] = reason["type"] if reason["type"] != "abort" else (
                    "timeout" if "deadline" in reason.get("message", "") else "abort")
                record["tokens"] = final["meta_info"]["completion_tokens"]
    except httpx.HTTPError as error:
        record.update(status=None, error=repr(error), latency_s=time.perf_counter() - began)
    return record


def run_clients(url: str, args) -> tuple[list[dict[str, Any]], float]:
    """``args.clients`` closed-loop clients for ``args.minutes``; every record, and the seconds it took."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.minutes * 60

    def client(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as session:
            while time.monotonic() < stop_at:
                record = one_request(session, rng, args)
                with lock:
                    records.append(record)
                if record.get("status") == 503:
                    time.sleep(min(record["retry_after"], max(0.0, stop_at - time.monotonic())))

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.minutes * 60 + 2 * CLIENT_TIMEOUT)
    return records, time.monotonic() - began


def start_server(serve_flags: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    """``specswap serve <serve_flags>`` on 127.0.0.1 and a free port, importing the same specswap as this script;
    returns once /health answers 200."""
    import specswap  # noqa: PLC0415

    port = free_port()
    package_root = str(Path(specswap.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "specswap.cli", "serve", *serve_flags, "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}):\n{process.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url, command
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the server did not come up in 300 s")
        time.sleep(0.2)


def summarize(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for record in records:
        key = str(record.get("status"))
        statuses[key] = statuses.get(key, 0) + 1
    answered = [r for r in records if r.get("status") == 200]
    reasons: dict[str, int] = {}
    for record in answered:
        reason = str(record.get("finish_reason"))
        reasons[reason] = reasons.get(reason, 0) + 1
    completed = [r for r in answered if r.get("finish_reason") in ("length", "stop")]
    return {
        "attempts": len(records),
        "status_counts": dict(sorted(statuses.items())),
        "rate_503": round(statuses.get("503", 0) / len(records), 4) if records else None,
        "server_errors_5xx": sum(n for status, n in statuses.items() if status.isdigit() and int(status) >= 500
                                 and status != "503"),
        "client_errors": statuses.get("None", 0),
        "incomplete_streams": sum(1 for r in answered if r["stream"] and not r.get("complete")),
        "finish_reasons": dict(sorted(reasons.items())),
        "latency_s": percentiles([r["latency_s"] for r in answered]),
        "latency_completed_s": percentiles([r["latency_s"] for r in completed]),
        "ttft_s": percentiles([r["ttft_s"] for r in answered if r["stream"] and "ttft_s" in r]),
        "rejected_latency_s": percentiles([r["latency_s"] for r in records if r.get("status") == 503]),
        "completed_requests_per_s": round(len(completed) / seconds, 3) if seconds else None,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_flags = DEFAULT_SERVE
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_flags = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients (default 16)")
    parser.add_argument("--minutes", type=float, default=2.0, help="how long the clients send (default 2)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens a request asks for (default 64)")
    parser.add_argument("--stream-fraction", type=float, default=0.5, help="share of streaming requests")
    parser.add_argument("--deadline-fraction", type=float, default=0.1,
                        help="share of requests that carry request_timeout --deadline (default 0.1)")
    parser.add_argument("--deadline", type=float, default=2.0, help="their deadline in seconds (default 2)")
    parser.add_argument("--warmup", type=int, default=4, help="requests sent before the memory baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the report (with command, cpu, commit)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.minutes <= 0 or args.max_tokens < 1:
        parser.error("--clients and --max-tokens must be >= 1 and --minutes > 0")
    if not (0 <= args.stream_fraction <= 1 and 0 <= args.deadline_fraction <= 1) or args.deadline <= 0:
        parser.error("the fractions must be in [0, 1] and --deadline > 0")

    process, url, command = start_server(serve_flags)
    try:
        with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as session:
            for index in range(args.warmup):
                session.post("/generate", json={"text": PROMPTS[index % len(PROMPTS)],
                                                "sampling_params": {"max_new_tokens": args.max_tokens}})
        before = memory_mib(process.pid)
        tokens_before = httpx.get(f"{url}/server_info", timeout=30).json().get("generated_tokens") or 0
        records, seconds = run_clients(url, args)
        after = memory_mib(process.pid)
        info = httpx.get(f"{url}/server_info", timeout=30).json()
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(info.get("drain_timeout", 30) + 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    output = process.stdout.read()

    summary = summarize(records, seconds)
    generated = (info.get("generated_tokens") or 0) - tokens_before  # the server's count: streams carry no usage
    summary["tokens_per_second"] = round(generated / seconds, 1) if seconds else None
    report = {
        **stamp(),
        "server_command": " ".join(command[1:]).replace(url.rsplit(":", 1)[1], "<port>"),
        "clients": args.clients, "minutes": args.minutes, "seconds": round(seconds, 2),
        "max_tokens": args.max_tokens, "stream_fraction": args.stream_fraction,
        "deadline_fraction": args.deadline_fraction, "deadline_s": args.deadline, "seed": args.seed,
        **summary,
        "server_rss_mib": {"before": before["rss"], "after": after["rss"], "peak": after["peak"]},
        "server": {key: info.get(key) for key in ("max_running_requests", "max_queued_requests", "requests_finished",
                                                  "requests_rejected", "num_switches", "generated_tokens",
                                                  "speculative_algorithm", "speculative_adaptive")},
        "exit_code": exit_code,
        "drained": next((line for line in output.splitlines() if "drained in" in line), None),
    }
    latency, rss = report["latency_s"], report["server_rss_mib"]
    print(f"{args.clients} clients, {seconds:.0f} s: {report['attempts']} attempts {report['status_counts']}, "
          f"503 rate {report['rate_503']:.1%}, 5xx {report['server_errors_5xx']}")
    if latency["n"]:
        print(f"latency (answered, n={latency['n']}): p50 {latency['p50']:.3f} s, p95 {latency['p95']:.3f} s, "
              f"p99 {latency['p99']:.3f} s; {report['completed_requests_per_s']} completed/s, "
              f"{report['tokens_per_second']} tok/s; finish {report['finish_reasons']}")
    print(f"server RSS: {rss['before']} MiB after warm-up, {rss['after']} MiB after the run (peak {rss['peak']}); "
          f"exit {exit_code}; {report['drained']}")
    if args.json is not None:
        write_report(args.json, report)
    return report


if __name__ == "__main__":
    main()
