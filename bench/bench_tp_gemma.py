"""Gemma 3 270M at tensor parallelism 2 (two processes, one thread each) against one process at two threads, on
the same prompts in one invocation: wall time and tokens per second of each, and whether their tokens agree.

    PYTHONPATH=python python bench/bench_tp_gemma.py [--tp 2] [--algorithm NGRAM] [--steps 3] [--adaptive]
        [--weights fp32|bf16|native] [--prompts 8] [--new-tokens 64] [--batch 4] [--json results/tp_gemma.json]
        [--tp-draft replicate shard] [--graphs]

``--tp-draft`` runs the tensor-parallel engine once per draft placement (Engine's ``tp_draft``), one after the
other in the same invocation, and reports each (default: the algorithm's default placement alone).

Both runs are greedy, and both eager or (``--graphs``) both with their graphs captured (each rank its own, the
forwards' collectives recorded), so the comparison is of the parallelism. Each run first generates one
warm-up prompt, then times ``generate`` over every prompt. The one-process run and the ranks run one after the
other, never together.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works, with an example in Python.",
    "List ten facts about the planet Mars.",
    "def quicksort(items):\n    ",
    "The three main causes of the French Revolution were",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "Summarise the plot of Romeo and Juliet in five sentences.",
    "import numpy as np\n\n# compute the moving average of an array\n",
]


def _engine(args, **extra):
    from specswap.engine import Engine
    kwargs = dict(speculative_algorithm=args.algorithm,  # "NONE": target only (algorithms.algorithm)
                  speculative_num_steps=args.steps, max_batch_size=args.batch, max_seq_len=512,
                  dtype={"fp32": "float32", "bf16": "bfloat16"}.get(args.weights, "auto"), weights=args.weights,
                  disable_graphs=not args.graphs)
    if args.adaptive:
        kwargs.update(speculative_adaptive=True, speculative_adaptive_config=str(
            Path(__file__).resolve().parents[1] / "configs" / "goodput.json"))
    return Engine("gemma-3-270m", **kwargs, **extra)


def _timed(engine, prompts, new_tokens) -> dict:
    engine.generate(prompts[:1], 8, ignore_eos=True)  # warm-up
    start = time.perf_counter()
    outputs = engine.generate(prompts, new_tokens, ignore_eos=True)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_second": tokens / seconds,
            "token_ids": [o.token_ids for o in outputs], "num_switches": engine.stats()["num_switches"]}


def rank_main(args) -> None:
    torch.set_num_threads(1)
    engine = _engine(args, tp_size=args.tp, **({"tp_draft": args.placement} if args.placement else {}))
    if not engine.is_leader:
        engine.follow()
        return
    result = _timed(engine, PROMPTS[:args.prompts], args.new_tokens)
    engine.shutdown()
    Path(args.rank_out).write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--algorithm", default="NGRAM", choices=["NONE", "NGRAM", "EAGLE"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--adaptive", action="store_true", help="the goodput policy (configs/goodput.json)")
    parser.add_argument("--weights", default="fp32", choices=["fp32", "bf16", "native"],
                        help="native: the GGUF's blocks, split by rows of blocks at TP")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--graphs", action="store_true", help="both runs capture their graphs (default: eager)")
    parser.add_argument("--tp-draft", nargs="+", default=[None], choices=["replicate", "shard", "leader"],
                        help="draft placements to run at TP, one after the other (default: the algorithm's)")
    parser.add_argument("--rank-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--placement", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be 1..{len(PROMPTS)}")
    if args.rank_out is not None:
        rank_main(args)
        return 0
    from specswap.bench.provenance import stamp, write_report
    from specswap.distributed.spawn import run_local
    threads = torch.get_num_threads()
    torch.set_num_threads(args.tp)  # the one-process run gets the cores the ranks get
    try:
        one = _timed(_engine(args), PROMPTS[:args.prompts], args.new_tokens)
    finally:
        torch.set_num_threads(threads)
    from specswap.algorithms import algorithm
    runs = []
    for placement in args.tp_draft:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "leader.json"
            command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--rank-out", str(out)]
            run_local(command + (["--placement", placement] if placement else []), args.tp, threads=1,
                      env={"PYTHONPATH": os.pathsep.join(sys.path)})
            tp = json.loads(out.read_text())
        tp["tokens_identical"] = tp.pop("token_ids") == one["token_ids"]
        runs.append({"tp_size": args.tp, "threads_per_rank": 1,
                     "tp_draft": algorithm(args.algorithm).tp_draft(placement),
                     **tp, "speedup": one["seconds"] / tp["seconds"]})
    one.pop("token_ids")
    report = {**stamp(), "model": "gemma-3-270m", "weights": args.weights, "algorithm": args.algorithm,
              "steps": args.steps, "adaptive": args.adaptive, "prompts": args.prompts, "new_tokens": args.new_tokens,
              "batch": args.batch, "graphs": args.graphs, "one_process": {"threads": args.tp, **one}}
    if len(runs) == 1:  # the one tensor-parallel run, under the names the single-placement report has always used
        run = runs[0]
        report.update(tensor_parallel={k: v for k, v in run.items() if k not in ("speedup", "tokens_identical")},
                      speedup=run["speedup"], tokens_identical=run["tokens_identical"])
    else:
        report["tensor_parallel_runs"] = runs
        report["tokens_identical"] = all(run["tokens_identical"] for run in runs)
    print(json.dumps(report, indent=2))
    if args.json:
        write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
