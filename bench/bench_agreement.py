"""The per-step cost of the distributed tier agreement: one rank's observation packed, the all-gather over every
rank, the merge (``specswap.distributed.agreement``), against the bare all-gather of the same bytes.

    PYTHONPATH=python python bench/bench_agreement.py [--world 2] [--steps 2000] [--warmup 200] [--max-steps 7]
        [--batch 8] [--veth] [--delay-ms 0.5 5] [--json results/agreement.json]

The script starts ``--world`` ranks of itself on this machine (gloo over localhost, one thread each); rank 0
writes the JSON: microseconds per step (median, p90, p99) for the agreement and for the bare all-gather, and the
vector's size in bytes. On one machine the figure is the collective's local latency plus scheduling noise; across
hosts it is bounded below by the network's round trip.

``--veth`` (root; 2 ranks) measures it again with a rank in each of two network namespaces joined by a veth pair
(tools/netns_hosts.sh: two "hosts", gloo on the veth interface), and once per ``--delay-ms`` with that much
added to each direction of the link (``tc netem``); ``links`` lists every measurement, a link that could not be
made with its error (a kernel without netem).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


NETNS = Path(__file__).resolve().parents[1] / "tools" / "netns_hosts.sh"


def _netns(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(NETNS), *args], env=env, capture_output=True, text=True, timeout=60)


def _veth_links(rank_argv: list[str], delays_ms: list[float]) -> list[dict]:
    """The agreement with rank 0 and rank 1 in namespaces of their own, joined by a veth pair: with the link as it
    is, then with each of ``delays_ms`` added (a delay the kernel cannot add: its error instead)."""
    env = dict(os.environ, NETNS_HOSTS_NAME=f"ssbench{os.getpid()}")
    made = _netns("up", env=env)
    if made.returncode:
        raise SystemExit(f"--veth: tools/netns_hosts.sh up failed: {made.stderr.strip()}")
    links = []
    try:
        rank_env = dict(env, WORLD_SIZE="2", MASTER_ADDR=_netns("addr", "0", env=env).stdout.strip(),
                        MASTER_PORT="29500", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path),
                        GLOO_SOCKET_IFNAME=_netns("ifname", env=env).stdout.strip())
        rank_env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        for delay in [0.0, *delays_ms]:
            if delay:
                added = _netns("delay", str(delay), env=env)
                if added.returncode:
                    links.append({"link": "veth", "delay_ms": delay, "error": added.stderr.strip()})
                    continue
            links.append({"link": "veth", "delay_ms": delay, **_measure_across(rank_argv, rank_env)})
            _netns("delay", "0", env=env)
    finally:
        _netns("down", env=env)
    return links


def _measure_across(rank_argv: list[str], env: dict[str, str]) -> dict:
    """Rank r in namespace r (tools/netns_hosts.sh exec); rank 0's measurement."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = [subprocess.Popen(["bash", str(NETNS), "exec", str(rank), *rank_argv, "--rank-out", str(out)],
                                  env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
        for rank, proc in enumerate(procs):
            try:
                output, _ = proc.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                output = "(ran past 600 s)"
            if proc.returncode != 0:
                for other in procs:
                    other.kill()
                raise RuntimeError(f"rank {rank} across the veth link exited {proc.returncode}:\n{output[-4000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--max-steps", type=int, default=7, help="the largest tier (the histogram's size)")
    parser.add_argument("--batch", type=int, default=8, help="requests per rank per step")
    parser.add_argument("--veth", action="store_true",
                        help="also across two network namespaces joined by a veth pair (root; --world 2)")
    parser.add_argument("--delay-ms", type=float, nargs="*", default=[],
                        help="with --veth: also with this much added to each direction of the link (tc netem)")
    parser.add_argument("--note", default=None, help="a line saying how the machine was (kept in the JSON)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rank-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_out is not None:  # a rank
        rank_main(args)
        return 0
    if (args.veth or args.delay_ms) and (args.world != 2 or not args.veth):
        parser.error("--veth measures 2 ranks (--world 2), one per namespace; --delay-ms needs --veth")
    from specswap.bench.provenance import stamp, write_report
    from specswap.distributed.spawn import run_local
    rank_argv = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        run_local([*rank_argv, "--rank-out", str(out)], args.world, env={"PYTHONPATH": os.pathsep.join(sys.path)})
        measured = json.loads(out.read_text())
    report = {**stamp(), "world": args.world, "steps": args.steps, "warmup": args.warmup, "batch": args.batch,
              "max_steps": args.max_steps, "backend": "gloo", **measured}
    report["load_average"] = list(os.getloadavg())  # 1, 5, 15 minutes, at the end: how busy the machine was
    if args.note:
        report["note"] = args.note
    if args.veth:
        report["links"] = [{"link": "loopback", "delay_ms": 0.0, **measured}, *_veth_links(rank_argv, args.delay_ms)]
    print(json.dumps(report, indent=2))
    if args.json:
        write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
