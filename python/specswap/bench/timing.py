"""The timers the benchmark scripts share: medians of repeated calls after warm-up, in milliseconds, and the
collector kept out of the clocks.

``median_ms`` times one callable; ``interleaved_medians_ms`` times several round-robin (one call of each per
round), so a burst of load on a shared machine falls on every cell of a table alike instead of skewing the
one cell it happens to hit. ``collect_outside_clocks`` runs the collector between timed runs.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Hashable, Mapping


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, after ``warmup`` untimed calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_medians_ms(fns: Mapping[Hashable, Callable[[], Any]], repeats: int,
                           warmup: int = 3) -> dict[Hashable, float]:
    """Median wall time of each ``fns[key]()`` over ``repeats`` rounds, each round calling every callable once in
    order, after ``warmup`` untimed calls of each."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[Hashable, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[key].append((time.perf_counter() - start) * 1e3)
    return {key: statistics.median(values) for key, values in times.items()}


def collect_outside_clocks() -> None:
    """Between timed runs: what an earlier call froze made collectable again (engines since dropped), everything
    collected, and what is alive now frozen (``gc.freeze``, as ``serve`` does at start-up), so that no
    generation-2 collection over the engines' objects lands in a timed step. One took 100-150 ms when it came on
    its own and 760 ms after engines were dropped (Gemma 3 270M, an AVX-512 EPYC), all charged to the one mode
    whose step it landed in."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
