"""Gemma 3 270M forward cost at batch 1 per weight format, T = 1, 2, 4, 8, 16 new tokens, and the LM head's share.

    PYTHONPATH=python python bench/bench_gemma_forward.py [--weights native,bf16,fp32] [--lengths 1,2,4,8,16]
        [--repeats 20] [--context 64] [--threads N] [--json PATH]

A verify over k drafts is one forward of T = k + 1 tokens, so the figure that decides whether speculation pays is
each T's time relative to T = 1 ("x1"): the issue's bars are T=4 at most 1.6x and T=8 at most 2.5x. ``native``
keeps the GGUF's blocks (``torch.ops.specswap.ggml_linear``); ``bf16`` / ``fp32`` are the dequantized weights.
Also times start-up from the converted cache (resolve + load_model + load_tokenizer). Figures are medians over
``--repeats`` rounds after warm-up, every cell timed once a round (round-robin), side by side in one process: compare the ratios across machines, not the
milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from specswap.bench.provenance import stamp, write_report
from specswap.bench.timing import interleaved_medians_ms

REPOSITORY = Path(__file__).resolve().parents[1]
WEIGHTS = ("native", "bf16", "fp32")


def _csv(text: str, parse=str) -> list:
    return [parse(part) for part in text.split(",") if part.strip()]


def parse_lengths(text: str) -> list[int]:
    """'2,4,8' -> [1, 2, 4, 8]: new-token counts, sorted and unique, 1 always among them (the ratios' base).
    Raises ValueError unless they are comma-separated positive integers."""
    try:
        lengths = sorted(set([1] + _csv(text, int)))
    except ValueError:
        lengths = [0]
    if lengths[0] < 1:
        raise ValueError(f"{text!r}: comma-separated positive integers")
    return lengths


def measure(weights: str, lengths: list[int], context: int, repeats: int) -> list[dict[str, Any]]:
    from specswap.models import load_model
    from specswap.huge_pages import place_on_huge_pages
    from specswap.zoo.gemma import resolve

    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    directory = resolve("gemma-3-270m", "native" if weights == "native" else dtype)
    model = load_model(directory, torch.float32 if weights == "native" else dtype)
    place_on_huge_pages(model)  # as the Engine places its weights (SPECSWAP_HUGE_PAGES=off: not)
    activation = model.dtype
    # resident bytes of the weights: every distinct parameter and buffer (the tied head counted once)
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
    model_bytes = sum(t.numel() * t.element_size() for t in tensors)
    cache = model.make_cache(1, context + max(lengths))
    slots = torch.tensor([0])
    rows = []
    with torch.inference_mode():
        model(torch.full((1, context), 100), torch.arange(context)[None], cache, slots)
        calls = {}
        for length in lengths:  # every length's forward and LM head, timed round-robin
            ids = torch.full((1, length), 100)
            positions = torch.arange(context, context + length)[None]
            hidden = torch.randn(1, length, model.config.hidden_size, dtype=activation)
            calls["forward", length] = lambda ids=ids, p=positions, n=length: model(ids, p, cache, slots, context + n)
            calls["head", length] = lambda hidden=hidden: model.lm_head(hidden)
        medians = interleaved_medians_ms(calls, repeats)
        for length in lengths:
            rows.append({"weights": weights, "activation_dtype": str(activation).removeprefix("torch."),
                         "model_bytes": model_bytes, "tokens": length,
                         "forward_ms": round(medians["forward", length], 3),
                         "lm_head_ms": round(medians["head", length], 3)})
    one = rows[0]
    for row in rows:
        row["forward_ratio_to_one"] = round(row["forward_ms"] / one["forward_ms"], 3)
        row["lm_head_ratio_to_one"] = round(row["lm_head_ms"] / one["lm_head_ms"], 3)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="native,bf16,fp32", help=f"comma-separated, of {', '.join(WEIGHTS)}")
    parser.add_argument("--lengths", default="1,2,4,8,16", help="new tokens per forward (1 is always measured)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--context", type=int, default=64, help="tokens already in the KV cache")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    weights = _csv(args.weights)
    unknown = [w for w in weights if w not in WEIGHTS]
    if unknown or not weights:
        parser.error(f"--weights {args.weights!r}: valid are {', '.join(WEIGHTS)}")
    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as error:
        parser.error(f"--lengths {error}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from specswap.models import load_model, load_tokenizer
    from specswap.zoo.gemma import resolve

    resolve("gemma-3-270m", torch.bfloat16)  # builds the cache on the very first run (not timed)
    start = time.perf_counter()
    directory = resolve("gemma-3-270m", torch.bfloat16)
    resolved = time.perf_counter()
    load_model(directory, torch.bfloat16)
    loaded = time.perf_counter()
    load_tokenizer(directory)
    ready = time.perf_counter()
    print(f"start-up from cache: resolve {resolved - start:.2f} s, load_model bf16 {loaded - resolved:.2f} s, "
          f"tokenizer {ready - loaded:.2f} s, total {ready - start:.2f} s")

    print(f"threads {torch.get_num_threads()}, context {args.context} tokens, median of {args.repeats}")
    print(f"{'weights':>8} {'T':>3} {'forward ms':>11} {'x1':>6} {'lm_head ms':>11} {'x1':>6} {'head share':>11}")
    results = []
    for name in weights:
        for row in measure(name, lengths, args.context, args.repeats):
            results.append(row)
            print(f"{name:>8} {row['tokens']:>3} {row['forward_ms']:>11.2f} {row['forward_ratio_to_one']:>5.2f}x "
                  f"{row['lm_head_ms']:>11.2f} {row['lm_head_ratio_to_one']:>5.2f}x "
                  f"{row['lm_head_ms'] / row['forward_ms']:>10.0%}")
    for name in weights:
        size = next(r["model_bytes"] for r in results if r["weights"] == name)
        print(f"{name}: weights resident {size / 2**20:.0f} MiB")
    command = list(sys.argv) if argv is None else [str(Path(__file__).relative_to(REPOSITORY)), *argv]
    report = {**stamp(command), "threads": torch.get_num_threads(), "context": args.context, "repeats": args.repeats,
              "torch": torch.__version__, "results": results}
    if args.json is not None:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
