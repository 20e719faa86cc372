"""Graph replay vs eager: one decode round of the worker, side by side in one run.

    python bench/bench_graphs.py [--model tiny] [--steps 1 3 7] [--batch 1 4] [--rounds 200]

Reports the median wall time (and thread CPU time, steadier on a shared
machine) per decode round for each tier and batch, eager and graphed, and
their ratio; plus the start-up capture time and the memory each tier's
graphs add. Greedy, fp32 by default.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(model_name: str, steps: int, batch: int, graphs: bool, dtype: torch.dtype, max_seq_len: int, device: str):
    from specswap.engine import Engine

    engine = Engine(model_name, speculative_algorithm="EAGLE", speculative_num_steps=steps, dtype=dtype,
                    max_batch_size=max(batch, 1), max_seq_len=max_seq_len, device=device,
                    disable_graphs=not graphs)
    return engine


def time_rounds(engine, batch: int, rounds: int, prompt_len: int = 24):
    worker = engine.worker
    prompts = [[(7 * i + j) % 200 + 3 for j in range(prompt_len)] for i in range(batch)]
    from specswap.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=10_000)
    slots = list(range(batch))
    worker.prefill(slots, prompts, [params] * batch)
    wall, cpu = [], []
    for i in range(rounds):
        if worker.host_seq_lens[0] > worker.max_seq_len - 16:  # restart before the cache fills
            worker.prefill(slots, prompts, [params] * batch)
        w, c = time.perf_counter(), time.thread_time()
        worker.decode_round(slots)
        wall.append(time.perf_counter() - w)
        cpu.append(time.thread_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 3, 7])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bursts", type=int, default=10,
                        help="alternate eager/graph this many times, so both see the same machine load")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from specswap.graphs import capture_count

    print(f"{'tier':>4} {'batch':>5} {'eager ms':>9} {'graph ms':>9} {'ratio':>6}  {'eager cpu':>9} {'graph cpu':>9} "
          f"{'ratio':>6}  {'capture s':>9} {'captures':>8} {'tier MB':>7}")
    for steps in args.steps:
        for batch in args.batch:
            eager = build(args.model, steps, batch, False, args.dtype, args.max_seq_len, args.device)
            before, start = capture_count(), time.perf_counter()
            graphed = build(args.model, steps, batch, True, args.dtype, args.max_seq_len, args.device)
            capture_seconds, captures = time.perf_counter() - start, capture_count() - before
            memory = graphed.worker.tier_memory_bytes()
            tier_mb = memory.get(steps, 0) / 2**20
            # interleave short bursts so both see the same machine load
            results = {"eager": [], "graph": []}
            for _ in range(args.bursts):
                for name, engine in (("eager", eager), ("graph", graphed)):
                    results[name].append(time_rounds(engine, batch, max(1, args.rounds // args.bursts)))
            ew = statistics.median(r[0] for r in results["eager"]); ec = statistics.median(r[1] for r in results["eager"])
            gw = statistics.median(r[0] for r in results["graph"]); gc = statistics.median(r[1] for r in results["graph"])
            print(f"{steps:>4} {batch:>5} {ew * 1e3:>9.3f} {gw * 1e3:>9.3f} {ew / gw:>6.2f}  {ec * 1e3:>9.3f} "
                  f"{gc * 1e3:>9.3f} {ec / gc:>6.2f}  {capture_seconds:>9.2f} {captures:>8} {tier_mb:>7.2f}")


if __name__ == "__main__":
    main()
