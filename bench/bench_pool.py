"""Cost of the state pool and the policy on the decode path, from Python (google-benchmark's Python bindings),
and optionally the C++ microbenchmarks (bench/cpp/bench_state_pool.cpp) in the same run:

    python bench/bench_pool.py --benchmark_min_time=0.2s
    python bench/bench_pool.py --json results/state-pool.json [--cpp build/bench/bench_state_pool]

``acquire_round`` is what a decode round does first: acquire the active state and read its round.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import google_benchmark as benchmark

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams, SpecRuntimeState, StatePool


def _pool():
    pool = StatePool()
    for k in (1, 3, 7):
        pool.register(SpecRuntimeState(k, k + 1, draft=object(), verify=object(), draft_extend=object(),
                                       round=object()))
    pool.activate(3)
    return pool


@benchmark.register
def acquire(state):
    pool = _pool()
    while state:
        pool.acquire()


@benchmark.register
def acquire_round(state):
    pool = _pool()
    while state:
        pool.acquire().round


@benchmark.register
def activate_switch(state):
    pool = _pool()
    tiers = (1, 3)
    i = 0
    while state:
        pool.activate(tiers[i & 1])
        i += 1


@benchmark.register
def policy_update_batch8(state):
    params = AdaptiveSpeculativeParams(3, AdaptiveConfig(warmup_batches=0, update_interval=1))
    batch = [2] * 8
    while state:
        params.update(batch)


def _rows(path: Path) -> list[dict]:
    """name and nanoseconds per iteration of every benchmark in a google-benchmark JSON output."""
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    return [{"name": row["name"], "ns_per_iteration": row["real_time"] * scale[row.get("time_unit", "ns")],
             "iterations": row["iterations"]} for row in json.loads(path.read_text())["benchmarks"]]


def main(argv: list[str]) -> None:
    """``--json PATH``: run the Python benchmarks (and the C++ binary given by ``--cpp``) into one JSON with its
    provenance; otherwise google-benchmark's own command line."""
    if "--json" not in argv:
        benchmark.main()
        return
    out = Path(argv[argv.index("--json") + 1])
    cpp = Path(argv[argv.index("--cpp") + 1]) if "--cpp" in argv else None
    from specswap.bench.provenance import stamp, write_report
    with tempfile.TemporaryDirectory() as scratch:
        python_out, cpp_out = Path(scratch) / "python.json", Path(scratch) / "cpp.json"
        subprocess.run([sys.executable, __file__, "--benchmark_min_time=0.5s", f"--benchmark_out={python_out}",
                        "--benchmark_out_format=json"], check=True)
        report = {**stamp(argv and [sys.argv[0], *argv]), "python": _rows(python_out)}
        if cpp is not None:
            # Debian's libbenchmark takes the seconds as a bare number
            subprocess.run([str(cpp), "--benchmark_min_time=0.5", f"--benchmark_out={cpp_out}",
                            "--benchmark_out_format=json"], check=True)
            report["cpp"] = _rows(cpp_out)
    write_report(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
