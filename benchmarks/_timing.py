"""Shared timing helper for the benchmark scripts.

Candidates are timed round-robin (A, B, C, A, B, C, ...) so that load from other
processes on a shared machine hits them alike; the median of each is reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(
    fns: dict[str, Callable[[], object]], repeats: int = 15, warmup: int = 2
) -> dict[str, float]:
    """Median wall time of each ``fn()`` (each must block until its result is ready)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
