"""Gemma 3 270M forward cost at batch 1: bf16 vs fp32, T = 1, 2, 4, 8, 16 new tokens, and the LM head's share.

    PYTHONPATH=python python bench/bench_gemma_forward.py [--repeats 20] [--context 64] [--threads N]

Also times start-up from the converted cache (resolve + load_model + load_tokenizer), which should be < 10 s.
Figures are medians over ``--repeats`` runs after warm-up, measured side by side in one process; the ratios
(bf16/fp32, head share, T=8 vs T=1) are what to compare across machines, not the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--context", type=int, default=64, help="tokens already in the KV cache")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from specswap.models import load_model, load_tokenizer
    from specswap.zoo.gemma import resolve

    resolve("gemma-3-270m", torch.bfloat16)  # builds the cache on the very first run (not timed)
    start = time.perf_counter()
    directory = resolve("gemma-3-270m", torch.bfloat16)
    resolved = time.perf_counter()
    model = load_model(directory, torch.bfloat16)
    loaded = time.perf_counter()
    load_tokenizer(directory)
    ready = time.perf_counter()
    print(f"start-up from cache: resolve {resolved - start:.2f} s, load_model bf16 {loaded - resolved:.2f} s, "
          f"tokenizer {ready - loaded:.2f} s, total {ready - start:.2f} s")

    print(f"threads {torch.get_num_threads()}, context {args.context} tokens, median of {args.repeats}")
    print(f"{'dtype':>8} {'T':>3} {'forward ms':>11} {'lm_head ms':>11} {'head share':>11}")
    results = {}
    for dtype in (torch.bfloat16, torch.float32):
        model = load_model(resolve("gemma-3-270m", dtype), dtype)
        cache = model.make_cache(1, args.context + 16)
        slots = torch.tensor([0])
        with torch.inference_mode():
            model(torch.full((1, args.context), 100), torch.arange(args.context)[None], cache, slots)
            for length in (1, 2, 4, 8, 16):
                ids = torch.full((1, length), 100)
                positions = torch.arange(args.context, args.context + length)[None]
                hidden = torch.randn(1, length, model.config.hidden_size, dtype=dtype)
                forward = median_ms(lambda: model(ids, positions, cache, slots, args.context + length), args.repeats)
                head = median_ms(lambda: model.lm_head(hidden), args.repeats)
                results[dtype, length] = forward
                print(f"{str(dtype).removeprefix('torch.'):>8} {length:>3} {forward:>11.1f} {head:>11.1f} "
                      f"{head / forward:>10.0%}")
        del model, cache
    for length in (1, 8):
        print(f"fp32 / bf16 at T={length}: {results[torch.float32, length] / results[torch.bfloat16, length]:.2f}x")
    print(f"bf16 T=8 / T=1: {results[torch.bfloat16, 8] / results[torch.bfloat16, 1]:.2f}x")
    print(f"bf16 T=16 / T=1: {results[torch.bfloat16, 16] / results[torch.bfloat16, 1]:.2f}x")


if __name__ == "__main__":
    main()
