"""How much `specswap bench`'s schedule alone moves a ratio: two identical target-only engines (an A/A pair) over
the same loaded weights run the same phases, once phase after phase (each engine's whole phase in turn) and once
step by step (one engine step of each in turn, the schedule bench/cli.py uses). A perfect schedule gives a ratio
of 1.000 in every phase; the spread of the per-phase ratios is the noise the schedule leaves to the machine.

    PYTHONPATH=python python bench/bench_interleave_aa.py [--repeats 4] [--prompt-set tune]
        [--json results/bench-interleave-aa.json]

Gemma 3 270M, native weights, one thread, concurrency 2, 80 new tokens, the transition workload's phases.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from specswap.bench import provenance
from specswap.bench.runner import EngineRunner, run_interleaved
from specswap.bench.workloads import PROMPT_SETS, build_workload


def throughput(runner: EngineRunner) -> float:
    phase = runner.run["phases"][-1]
    return sum(r["tokens"] for r in phase["requests"]) / (phase["end_s"] - phase["start_s"])


def one_phase(engines, phase_index, phase, step_by_step: bool, concurrency: int, new_tokens: int) -> float:
    """Throughput of engine A over engine B on one phase under one schedule."""
    runners = [EngineRunner(engine, concurrency, new_tokens) for engine in engines]
    if step_by_step:
        run_interleaved(runner.phase_steps(phase_index, phase) for runner in runners)
    else:
        for runner in runners:
            runner.run_phase(phase_index, phase)
    return throughput(runners[0]) / throughput(runners[1])


def spread(ratios: list[float]) -> dict[str, float]:
    return {"ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_median": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--prompt-set", default="tune", choices=list(PROMPT_SETS))
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=80)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(1)
    from specswap.cli_flags import build_engine
    from specswap.loading import load_models
    models = load_models("gemma-3-270m", None, None, "float32", "cpu", "auto", "native")
    phases = build_workload("transition", 8, 1.0, args.prompt_set)
    engines = [build_engine(models, None, max_batch_size=args.concurrency) for _ in range(2)]
    for engine in engines:  # warm both alike
        engine.generate([phases[0].prompts[0]], max_new_tokens=16)
    rows = []
    for repeat in range(args.repeats):
        for phase_index, phase in enumerate(phases):
            for schedule in ("phase_after_phase", "step_by_step"):
                ratio = one_phase(engines, phase_index, phase, schedule == "step_by_step", args.concurrency,
                                  args.new_tokens)
                rows.append({"repeat": repeat, "phase": phase_index, "schedule": schedule, "a_over_b": ratio})
                print(f"repeat {repeat} phase {phase_index} ({phase.name}) {schedule}: A/B {ratio:.3f}", flush=True)
    report = {
        **provenance.stamp(),
        "what": f"an A/A pair of target-only gemma-3-270m engines (native weights, 1 thread, concurrency "
                f"{args.concurrency}, {args.new_tokens} new tokens, {args.prompt_set} prompts, transition phases, "
                f"{args.repeats} repeats): per-phase throughput ratio under each bench schedule",
        **{schedule: spread([row["a_over_b"] for row in rows if row["schedule"] == schedule])
           for schedule in ("phase_after_phase", "step_by_step")},
        "rows": rows,
    }
    for schedule in ("phase_after_phase", "step_by_step"):
        figures = report[schedule]
        print(f"{schedule}: A/B {figures['ratio_min']:.3f}-{figures['ratio_max']:.3f} "
              f"(median {figures['ratio_median']:.3f})")
    if args.json:
        provenance.write_report(args.json, report)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
