"""The per-step cost of the distributed tier agreement: one rank's observation packed, the all-gather over every
rank, the merge (``specswap.distributed.agreement``), against the bare all-gather of the same bytes.

    PYTHONPATH=python python bench/bench_agreement.py [--world 2] [--steps 2000] [--warmup 200] [--max-steps 7]
        [--batch 8] [--json results/agreement.json]

The script starts ``--world`` ranks of itself on this machine (gloo over localhost, one thread each); rank 0
writes the JSON: microseconds per step (median, p90, p99) for the agreement and for the bare all-gather, and the
vector's size in bytes. On one machine the figure is the collective's local latency plus scheduling noise; across
hosts it is bounded below by the network's round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(seconds: list[float]) -> dict[str, float]:
    micro = [s * 1e6 for s in seconds]
    return {"median_us": statistics.median(micro), "p90_us": _percentile(micro, 0.9),
            "p99_us": _percentile(micro, 0.99)}


def rank_main(args: argparse.Namespace) -> None:
    from specswap.distributed import init_group
    from specswap.distributed.agreement import Observation, merge
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    group = init_group(dp_size=world, timeout_s=60)
    bins = args.max_steps + 1
    mine = torch.zeros(Observation.width(bins), dtype=torch.float64)
    everyone = torch.zeros(world * mine.numel(), dtype=torch.float64)
    generator = torch.Generator().manual_seed(group.rank)
    agreement, bare = [], []
    for step in range(args.warmup + args.steps):
        accepted = torch.randint(0, args.max_steps + 1, (args.batch,), generator=generator).tolist()
        start = time.perf_counter()
        Observation(3, True, True, 0.01, False, args.batch, tuple(accepted), busy=True).pack(mine, bins)
        group.all_gather_into(everyone, mine, group="world")
        merge(everyone.view(world, -1), 1, bins, group.rank)
        middle = time.perf_counter()
        group.all_gather_into(everyone, mine, group="world")
        end = time.perf_counter()
        if step >= args.warmup:
            agreement.append(middle - start)
            bare.append(end - middle)
    if group.rank == 0:
        Path(args.rank_out).write_text(json.dumps({"agreement": _summary(agreement), "bare_all_gather": _summary(bare),
                                                   "vector_bytes": mine.numel() * mine.element_size()}))
    group.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--max-steps", type=int, default=7, help="the largest tier (the histogram's size)")
    parser.add_argument("--batch", type=int, default=8, help="requests per rank per step")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rank-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_out is not None:  # a rank
        rank_main(args)
        return 0
    from specswap.bench.provenance import stamp, write_report
    from specswap.distributed.spawn import run_local
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        run_local([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--rank-out", str(out)],
                  args.world, env={"PYTHONPATH": os.pathsep.join(sys.path)})
        measured = json.loads(out.read_text())
    report = {**stamp(), "world": args.world, "steps": args.steps, "warmup": args.warmup, "batch": args.batch,
              "max_steps": args.max_steps, "backend": "gloo", **measured}
    print(json.dumps(report, indent=2))
    if args.json:
        write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
