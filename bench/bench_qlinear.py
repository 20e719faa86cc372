"""Cost of one quantized linear per number of rows, on Gemma 3 270M's shapes, against torch's fp32 and bf16 linear.

    PYTHONPATH=python python bench/bench_qlinear.py [--threads 1] [--repeats 20] [--rows 1,2,4,8,16]
        [--shapes gate_up,down,q,o,lm_head | OUTxIN:TYPE,...] [--bf16 auto|on|off] [--quick] [--json PATH]

Speculation pays only when verifying k + 1 rows costs little more than one row, so the figure to read is each
row count's time relative to one row ("x1"). Backends, side by side in one process on the same random weights
(quantized with ggml's own quantizer):

- ``interleaved``: Q8_0 / Q5_0 / Q4_1 / Q4_K / Q6_K weights repacked by eight rows (``Q8_0x8`` ...), as the models
  hold them where the CPU has AVX2 (``specswap.models.quantized.REPACKED``);
- ``ggml``: ``torch.ops.specswap.ggml_linear`` over the file's blocks (our multi-row kernels for Q8_0 / Q5_0 /
  Q4_0 / Q4_1 / Q4_K / Q6_K where the CPU has AVX2, with the AVX-512 VNNI integer dot for the first four where
  the capability has it, ggml's vec_dot for every other type); the models run this for every type not repacked;
- ``ggml vec_dot``: the same op with our kernels switched off (ggml's one-row vec_dot), only for the types our
  kernels cover;
- ``torch fp32``, ``torch bf16``: ``F.linear`` over the dequantized weight. bf16 only where the CPU has native
  bf16 dot products (``specswap.capability``); elsewhere torch emulates it and it is not a contender. ``--bf16 on``
  measures it anyway.

Medians over ``--repeats`` rounds after warm-up, each backend's row counts timed once a round. The machine this runs on may be shared: compare ratios measured
in one run, not milliseconds across runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from specswap.bench.provenance import stamp, write_report
from specswap.capability import cpu_capability
from specswap.bench.timing import interleaved_medians_ms

REPOSITORY = Path(__file__).resolve().parents[1]

# Gemma 3 270M: (out_features, in_features, the type its Q4_K_M GGUF stores that matrix in)
GEMMA_SHAPES: dict[str, tuple[int, int, str]] = {
    "gate_up": (2048, 640, "Q5_0"),
    "down": (640, 2048, "Q6_K"),
    "q": (1024, 640, "Q5_0"),
    "o": (640, 1024, "Q4_K"),
    "lm_head": (262144, 640, "Q8_0"),  # the tied embedding
}
QUICK_SHAPES = "64x256:Q8_0,32x256:Q4_K,32x256:Q5_K"
FAST_TYPES = ("Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")  # the types our multi-row kernels cover


def parse_shapes(text: str) -> list[tuple[str, int, int, str]]:
    """'gate_up,lm_head' (names of GEMMA_SHAPES) and/or 'OUTxIN:TYPE' entries -> (name, out, in, type)."""
    from specswap.models.quantized import GGML_TYPES  # noqa: PLC0415

    shapes = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        if entry in GEMMA_SHAPES:
            shapes.append((entry, *GEMMA_SHAPES[entry]))
            continue
        try:
            dims, kind = entry.split(":")
            out_features, in_features = (int(v) for v in dims.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes entry {entry!r} is neither a Gemma shape ({', '.join(GEMMA_SHAPES)}) "
                             "nor OUTxIN:TYPE (e.g. 2048x640:Q5_0)") from None
        if kind.upper() not in GGML_TYPES:
            raise SystemExit(f"--shapes entry {entry!r}: type {kind!r} is not one of {', '.join(GGML_TYPES)}")
        shapes.append((entry, out_features, in_features, kind.upper()))
    if not shapes:
        raise SystemExit("--shapes names no shape")
    return shapes


def parse_rows(text: str) -> list[int]:
    try:
        rows = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--rows must be comma-separated positive integers, got {text!r}") from None
    if not rows or min(rows) < 1:
        raise SystemExit(f"--rows must be comma-separated positive integers, got {text!r}")
    return sorted(set(rows) | {1})  # every ratio is to one row


def native_bf16() -> tuple[bool | None, str]:
    """(whether this CPU has native bf16 dot products, or None where nothing here can tell; a note)."""
    try:
        from specswap.capability import cpu_capability  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        return None, "specswap.capability is not in this build: bf16 not measured (--bf16 on measures it)"
    capability = cpu_capability()
    if capability.native_bf16:
        return True, "native bf16 (specswap.capability)"
    return False, "no native bf16 here (specswap.capability): torch emulates it, not measured (--bf16 on measures it)"


def bench_shape(name: str, out_features: int, in_features: int, kind: str, rows: list[int], repeats: int,
                with_bf16: bool) -> list[dict[str, Any]]:
    from specswap._core import _C  # noqa: PLC0415
    from specswap.models import quantized  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator) * in_features ** -0.5
    blocks = quantized.quantize(weight, kind)
    weight = quantized.dequantize(blocks, kind, in_features)  # torch computes with what ggml holds
    type_id = quantized.ggml_type(kind)
    backends: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], torch.dtype, int]] = {}
    layer = quantized.QuantizedLinear(blocks, kind, in_features)
    if layer.repacked:
        backends["interleaved"] = (layer, torch.float32, layer.weight.numel())
    backends["ggml"] = (lambda x: torch.ops.specswap.ggml_linear(x, blocks, type_id), torch.float32, blocks.numel())
    if kind in FAST_TYPES and _C.ggml_fast_kernels_available():
        backends["ggml vec_dot"] = backends["ggml"]
    backends["torch fp32"] = (lambda x: F.linear(x, weight), torch.float32, weight.numel() * 4)
    if with_bf16:
        weight_bf16 = weight.to(torch.bfloat16)
        backends["torch bf16"] = (lambda x: F.linear(x, weight_bf16), torch.bfloat16, weight_bf16.numel() * 2)

    results = []
    for backend, (fn, dtype, weight_bytes) in backends.items():
        # one backend's row counts timed round-robin (its weights stay as warm in cache as with one count at a time)
        inputs = {count: torch.randn(count, in_features, generator=generator).to(dtype) for count in rows}
        previous = _C.ggml_set_fast_kernels(backend != "ggml vec_dot")
        try:
            with torch.inference_mode():
                timings = interleaved_medians_ms({count: (lambda x=x: fn(x)) for count, x in inputs.items()}, repeats)
        finally:
            _C.ggml_set_fast_kernels(previous)
        base = timings[1]
        for count in rows:
            results.append({"shape": name, "out_features": out_features, "in_features": in_features,
                            "weight_type": kind, "backend": backend, "rows": count, "ms": round(timings[count], 6),
                            "ratio_to_one_row": round(timings[count] / base, 3), "weight_bytes": weight_bytes})
    return results


def print_table(results: list[dict[str, Any]], rows: list[int]) -> None:
    header = f"{'shape':>22} {'backend':>13} " + " ".join(f"{f'{r} row' + ('s' if r > 1 else ''):>16}" for r in rows)
    print(header)
    keys = dict.fromkeys((r["shape"], r["backend"]) for r in results)
    for shape, backend in keys:
        cells = {r["rows"]: r for r in results if r["shape"] == shape and r["backend"] == backend}
        first = cells[1]
        label = f"{shape} {first['out_features']}x{first['in_features']} {first['weight_type']}"
        text = " ".join(f"{cells[r]['ms']:>8.3f} ({cells[r]['ratio_to_one_row']:>4.2f}x)" for r in rows)
        print(f"{label:>22} {backend:>13} {text}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch (and so ggml_linear) threads (default 1)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per cell; the median is reported")
    parser.add_argument("--rows", default="1,2,4,8,16", help="activation row counts, comma-separated (1 always)")
    parser.add_argument("--shapes", default=",".join(GEMMA_SHAPES),
                        help=f"Gemma shapes ({', '.join(GEMMA_SHAPES)}) and/or OUTxIN:TYPE entries")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="torch bf16: auto = only where the CPU has native bf16")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: shapes {QUICK_SHAPES}, rows 1,2, 2 repeats (overrides those options)")
    parser.add_argument("--json", type=Path, default=None, help="write the results (with command, cpu, commit)")
    args = parser.parse_args(argv)
    command = list(sys.argv) if argv is None else [str(Path(__file__).relative_to(REPOSITORY)), *argv]
    if args.threads < 1:
        raise SystemExit(f"--threads must be at least 1, got {args.threads}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")
    if args.quick:
        args.shapes, args.rows, args.repeats = QUICK_SHAPES, "1,2", 2
    rows = parse_rows(args.rows)
    shapes = parse_shapes(args.shapes)
    torch.set_num_threads(args.threads)

    from specswap.models import quantized  # noqa: PLC0415
    quantized.load_ggml()  # errors name the extra that brings ggml
    from specswap._core import _C  # noqa: PLC0415

    native, bf16_note = native_bf16()
    with_bf16 = args.bf16 == "on" or (args.bf16 == "auto" and bool(native))
    if args.bf16 == "on":
        bf16_note = "measured (--bf16 on); native bf16 " + {True: "yes", False: "no", None: "unknown"}[native]
    elif args.bf16 == "off":
        bf16_note = "not measured (--bf16 off)"
    vnni = _C.ggml_vnni_available() and cpu_capability().avx512_vnni
    fast_note = ("our multi-row kernels for " + ", ".join(FAST_TYPES) + (" (VNNI)" if vnni else " (AVX2)")
                 if _C.ggml_fast_kernels_available() else "no AVX2/FMA/F16C: every type on ggml's vec_dot")
    print(f"threads {torch.get_num_threads()}, median of {args.repeats}; ggml: {fast_note}; torch bf16: {bf16_note}")

    results = []
    for name, out_features, in_features, kind in shapes:
        results.extend(bench_shape(name, out_features, in_features, kind, rows, args.repeats, with_bf16))
    print_table(results, rows)
    report = {**stamp(command), "threads": torch.get_num_threads(), "repeats": args.repeats, "rows": rows,
              "torch": torch.__version__, "fast_kernels": fast_note, "bf16": bf16_note, "results": results}
    if args.json is not None:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
