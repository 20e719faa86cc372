"""Two checkouts of specswap side by side: the same engines (tiny and Gemma 3 270M, static and adaptive) on the
same report prompts, each configuration run in a child process per checkout, alternating A, B, A, B over
repeats, so a slow minute of the machine hurts both alike. Reports tokens/s per checkout and B over A.

    python bench/bench_ab.py --a /path/to/old --b . --repeats 3 --json results/refactor-ab.json
    python bench/bench_ab.py --a /path/to/old --b . --configs --forward 1,2,4,6,8 --json results/forward-ab.json

``--forward T,...``: Gemma 3 270M's native forward at T new tokens (bench/bench_gemma_forward.py's measurement, in
each checkout's child, alternating as above): milliseconds, each T's time over T = 1, and B over A. A kernel change
shows there. ``SPECSWAP_CPU_CAPS`` reaches the children (``-avx512`` measures the AVX2 kernels on a CPU with
AVX-512).

A checkout is a directory with ``python/specswap`` and its built ``_C`` beside it (``tools/build_inplace.sh``, or
the installed extension linked in). The children import only the public Engine API.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
PROMPTS_VARIABLE = "SPECSWAP_AB_PROMPTS"  # the parent's prompts, as JSON, for children of either checkout


def report_prompts() -> list[str]:
    """Two code and two repeated-lines prompts of the report set (bench/bench_engine.py, this checkout's)."""
    sys.path.insert(0, str(HERE.parent))
    from bench_engine import REPORT_CODE_PROMPTS, REPORT_REPEAT_PROMPTS
    return REPORT_CODE_PROMPTS[:2] + REPORT_REPEAT_PROMPTS[:2]
CONFIGS = {  # name -> Engine keyword arguments
    "tiny eagle static-3": dict(model="tiny", speculative_algorithm="EAGLE", speculative_num_steps=3),
    "tiny eagle adaptive": dict(model="tiny", speculative_algorithm="EAGLE", speculative_adaptive=True),
    "tiny ngram adaptive": dict(model="tiny", speculative_algorithm="NGRAM", speculative_adaptive=True,
                                speculative_adaptive_config="configs/goodput.json"),
    "gemma target-only": dict(model="gemma-3-270m", speculative_algorithm=None),
    "gemma ngram static-3": dict(model="gemma-3-270m", speculative_algorithm="NGRAM", speculative_num_steps=3),
    "gemma ngram adaptive": dict(model="gemma-3-270m", speculative_algorithm="NGRAM", speculative_adaptive=True,
                                 speculative_adaptive_config="configs/goodput.json"),  # the main job's engine
    "gemma eagle adaptive": dict(model="gemma-3-270m", speculative_algorithm="EAGLE", speculative_adaptive=True,
                                 speculative_adaptive_config="configs/goodput-eagle.json"),
}


def child(config: str, new_tokens: int) -> None:
    """One configuration in this process: warm up, then decode every prompt at batch 1; prints tokens/s."""
    import torch

    import specswap
    torch.set_num_threads(1)
    kwargs = dict(CONFIGS[config])
    model = kwargs.pop("model")
    prompts = json.loads(os.environ[PROMPTS_VARIABLE])
    engine = specswap.Engine(model, max_batch_size=1, max_seq_len=256, **kwargs)
    engine.generate(prompts[:1], 8)  # warm-up
    tokens, start = 0, time.perf_counter()
    for prompt in prompts:
        tokens += len(engine.generate([prompt], new_tokens, ignore_eos=True)[0].token_ids)
    print(json.dumps({"tokens_per_second": tokens / (time.perf_counter() - start), "tokens": tokens}))


def child_forward(lengths: list[int], repeats: int) -> None:
    """Gemma's native forward per length in this process (this checkout's specswap); prints {T: ms}."""
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE.parent))
    from bench_gemma_forward import measure
    rows = measure("native", lengths, 64, repeats)
    print(json.dumps({str(row["tokens"]): row["forward_ms"] for row in rows}))


def _child(checkout: Path, arguments: list[str], what: str, prompts: list[str],
           extra_env: dict[str, str] | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout / "python"), OMP_NUM_THREADS="1",
               **{PROMPTS_VARIABLE: json.dumps(prompts)}, **(extra_env or {}))
    done = subprocess.run([sys.executable, str(HERE), *arguments], env=env, cwd=checkout, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{what} in {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(checkout: Path, config: str, new_tokens: int, prompts: list[str],
        extra_env: dict[str, str] | None = None) -> float:
    return _child(checkout, ["--child", config, "--new-tokens", str(new_tokens)], config, prompts,
                  extra_env)["tokens_per_second"]


def side_env(args, side: str) -> dict[str, str]:
    """--a-env / --b-env KEY=VALUE pairs: one side's extra environment."""
    pairs = getattr(args, f"{side}_env", None) or []
    return dict(pair.split("=", 1) for pair in pairs)


def alternating(repeats: int, measure) -> dict[str, list]:
    """``measure(side)`` for side a and b, ``repeats`` times each, the order alternating (A B, B A, ...)."""
    results = {"a": [], "b": []}
    for repeat in range(repeats):
        for side in ("a", "b") if repeat % 2 == 0 else ("b", "a"):
            results[side].append(measure(side))
    return results


def forward_rows(args, lengths: list[int]) -> list[dict]:
    """Per length: each side's median forward over its runs (each run a median of ``--forward-repeats``), its ratio
    to one token, and B over A."""
    runs = alternating(args.repeats, lambda side: _child(
        getattr(args, side).resolve(), ["--child-forward", ",".join(map(str, lengths)),
                                        "--forward-repeats", str(args.forward_repeats)], "forward", [],
        side_env(args, side)))
    medians = {side: {t: statistics.median(run[str(t)] for run in runs[side]) for t in lengths} for side in runs}
    rows = []
    for t in lengths:
        a, b = medians["a"][t], medians["b"][t]
        rows.append({"tokens": t, "a_forward_ms": round(a, 3), "b_forward_ms": round(b, 3),
                     "a_ratio_to_one": round(a / medians["a"][1], 3), "b_ratio_to_one": round(b / medians["b"][1], 3),
                     "b_over_a": round(b / a, 3), "a_runs_ms": [run[str(t)] for run in runs["a"]],
                     "b_runs_ms": [run[str(t)] for run in runs["b"]]})
        print(f"forward T={t:<3d} A {a:7.2f} ms ({a / medians['a'][1]:.2f}x)  B {b:7.2f} ms "
              f"({b / medians['b'][1]:.2f}x)  B/A {b / a:.3f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, help="the first checkout (the baseline)")
    parser.add_argument("--b", type=Path, help="the second checkout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--forward", default="", help="also Gemma's native forward at these new-token counts, "
                        "comma-separated (1 is always measured)")
    parser.add_argument("--forward-repeats", type=int, default=20, help="timed forwards per length in one child")
    for side in ("a", "b"):
        parser.add_argument(f"--{side}-env", nargs="*", default=[], metavar="KEY=VALUE",
                            help=f"extra environment of {side.upper()}'s children (the same checkout twice, one "
                                 f"knob apart: --a . --b . --a-env SPECSWAP_HUGE_PAGES=off)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--child-forward", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.new_tokens)
        return
    if args.child_forward:
        child_forward([int(t) for t in args.child_forward.split(",")], args.forward_repeats)
        return
    if args.a is None or args.b is None:
        parser.error("--a and --b name the two checkouts")
    for side in ("a", "b"):
        bad = [pair for pair in getattr(args, f"{side}_env") if "=" not in pair or pair.startswith("=")]
        if bad:
            parser.error(f"--{side}-env {bad}: each entry is KEY=VALUE")
    sys.path.insert(0, str(HERE.parent))
    from bench_gemma_forward import parse_lengths
    try:
        lengths = parse_lengths(args.forward) if args.forward else []
    except ValueError as error:
        parser.error(f"--forward {error}")
    prompts, rows = report_prompts(), []
    for config in args.configs:
        speeds = alternating(args.repeats, lambda side: run(getattr(args, side).resolve(), config, args.new_tokens,
                                                            prompts, side_env(args, side)))
        a, b = statistics.median(speeds["a"]), statistics.median(speeds["b"])
        rows.append({"config": config, "a_tokens_per_second": a, "b_tokens_per_second": b, "b_over_a": b / a,
                     "a_runs": speeds["a"], "b_runs": speeds["b"]})
        print(f"{config:24s} A {a:7.1f} tok/s  B {b:7.1f} tok/s  B/A {b / a:.3f}", flush=True)
    forward = forward_rows(args, lengths) if lengths else []
    if args.json:
        from specswap.bench.provenance import git_commit, stamp, write_report
        write_report(args.json, {**stamp(), "a": str(args.a), "b": str(args.b), "a_commit": git_commit(args.a),
                                 "b_commit": git_commit(args.b), "a_env": side_env(args, "a"),
                                 "b_env": side_env(args, "b"), "prompts": prompts,
                                 "new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows,
                                 **({"forward_repeats": args.forward_repeats,
                                     "forward": forward} if lengths else {})})


if __name__ == "__main__":
    main()
