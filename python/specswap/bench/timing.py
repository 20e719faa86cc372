"""The one timer the benchmark scripts share: the median of repeated calls after warm-up, in milliseconds."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


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
