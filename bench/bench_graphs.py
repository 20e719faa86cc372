"""Graph replay vs eager: one decode round of the worker, side by side in one run.

    python bench/bench_graphs.py [--model tiny] [--steps 1 3 7] [--batch 1 4] [--rounds 400] [--bursts 40]

Reports the median wall time (and thread CPU time, steadier on a shared
machine) per decode round for each tier and batch, eager and graphed, and
their ratio (and, where round graphs are on, the ratio with stage graphs
only); plus the start-up capture time and the memory each tier's graphs
add. Greedy, fp32 by default (--dtype bfloat16: the engine's default on
CPUs with native bf16, specswap.capability). The workers run the same loaded weights; their rounds
alternate in short bursts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(model, steps: int, batch: int, graphs: bool, dtype: torch.dtype, max_seq_len: int, device: str,
          draft=None, round_graphs: bool | None = None):
    """A worker (specswap.worker.SpeculativeWorker: what a decode round is) over a model name, loaded as the engine
    loads it, or over an already loaded target and draft (``model``, ``draft``)."""
    from specswap.engine import Engine
    from specswap.worker import SpeculativeWorker

    if not isinstance(model, torch.nn.Module):
        loaded = Engine(model, draft, speculative_algorithm="EAGLE", speculative_num_steps=steps, dtype=dtype,
                        max_batch_size=1, max_seq_len=max_seq_len, device=device, disable_graphs=True)
        model, draft = loaded.target, loaded.draft
    return SpeculativeWorker(model, draft, "EAGLE", steps, max_batch_size=max(batch, 1), max_seq_len=max_seq_len,
                       graphs=graphs, round_graphs=round_graphs if graphs else None)


def time_rounds(worker, batch: int, rounds: int, prompt_len: int = 24, prefill: bool = True):
    """Median (wall, thread CPU) seconds of ``rounds`` greedy decode rounds of ``batch`` requests."""
    prompts = [[(7 * i + j) % 200 + 3 for j in range(prompt_len)] for i in range(batch)]
    from specswap.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=10_000)
    slots = list(range(batch))
    if prefill:
        worker.prefill(slots, prompts, [params] * batch)
    wall, cpu = [], []
    for i in range(rounds):
        if max(worker.slots.host_seq_lens[slot] for slot in slots) > worker.max_seq_len - 16:  # restart before it fills
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
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bursts", type=int, default=40,
                        help="alternate eager/graph this many times, so both see the same machine load")
    parser.add_argument("--round-graphs", choices=["auto", "on", "off"], default="auto",
                        help="whole greedy rounds as one graph (auto: on for targets up to 50M parameters); "
                             "off: stage graphs only")
    args = parser.parse_args()
    round_graphs = {"auto": None, "on": True, "off": False}[args.round_graphs]
    torch.set_num_threads(args.threads)
    from specswap.graphs import capture_count

    print(f"{'tier':>4} {'batch':>5} {'eager ms':>9} {'graph ms':>9} {'ratio':>6}  {'eager cpu':>9} {'graph cpu':>9} "
          f"{'ratio':>6}  {'stage-only cpu ratio':>20}  {'capture s':>9} {'captures':>8} {'tier MB':>7}")
    for steps in args.steps:
        for batch in args.batch:
            eager = build(args.model, steps, batch, False, args.dtype, args.max_seq_len, args.device)
            # the same loaded weights for every engine, as in one deployment (copies would compete for the cache)
            before, start = capture_count(), time.perf_counter()
            graphed = build(eager.target, steps, batch, True, args.dtype, args.max_seq_len, args.device,
                            draft=eager.draft, round_graphs=round_graphs)
            capture_seconds, captures = time.perf_counter() - start, capture_count() - before
            memory = graphed.tier_memory_bytes()
            tier_mb = memory.get(steps, 0) / 2**20
            engines = [("eager", eager), ("graph", graphed)]
            if graphed.round_graphs_enabled:  # the stage graphs alone, for what the round graphs add
                engines.append(("stage", build(eager.target, steps, batch, True, args.dtype, args.max_seq_len,
                                               args.device, draft=eager.draft, round_graphs=False)))
            # alternate short bursts (each request carries on where its last burst stopped) so all see the
            # same machine load; a ratio is the median over bursts of eager / graph of adjacent bursts
            results = {name: [] for name, _ in engines}
            for burst in range(args.bursts):
                for name, worker in engines:
                    results[name].append(time_rounds(worker, batch, max(1, args.rounds // args.bursts),
                                                     prefill=burst == 0))

            def ratio(name, i):
                return statistics.median(e[i] / g[i] for e, g in zip(results["eager"], results[name]))

            ew, ec = (statistics.median(r[i] for r in results["eager"]) for i in (0, 1))
            gw, gc = (statistics.median(r[i] for r in results["graph"]) for i in (0, 1))
            stage = f"{ratio('stage', 1):>20.2f}" if "stage" in results else f"{'-':>20}"
            print(f"{steps:>4} {batch:>5} {ew * 1e3:>9.3f} {gw * 1e3:>9.3f} {ratio('graph', 0):>6.2f}  "
                  f"{ec * 1e3:>9.3f} {gc * 1e3:>9.3f} {ratio('graph', 1):>6.2f}  {stage}  {capture_seconds:>9.2f} "
                  f"{captures:>8} {tier_mb:>7.2f}")


if __name__ == "__main__":
    main()
