"""Pure statistics for the run reports: percentiles, the measured throughput window, utilisation."""

from __future__ import annotations

from typing import Sequence

import numpy as np

SUMMARY_PERCENTILES = (50, 90, 95, 99)


def percentiles(values: Sequence[float], qs: Sequence[float] = SUMMARY_PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "p90": ...} by numpy's linear interpolation; all zeros for empty ``values``."""
    bad = [q for q in qs if not 0 <= q <= 100]
    if bad:
        raise ValueError(f"percentiles: expected qs in [0, 100], got {bad}")
    keys = [f"p{q:g}" for q in qs]
    if len(values) == 0:
        return {k: 0.0 for k in keys}
    found = np.percentile(np.asarray(values, dtype=np.float64), list(qs), method="linear")
    return {k: float(v) for k, v in zip(keys, found)}


def summarise_ms(values: Sequence[float]) -> dict[str, float | int]:
    """count, mean, p50, p90, p95, p99, max and min of ``values``; count 0 and zeros when empty."""
    if len(values) == 0:
        return {"count": 0, "mean": 0.0, **percentiles(values), "max": 0.0, "min": 0.0}
    a = np.asarray(values, dtype=np.float64)
    return {"count": int(a.size), "mean": float(a.mean()), **percentiles(a), "max": float(a.max()),
            "min": float(a.min())}


def measured_window(frames: Sequence[dict], warmup_ids: int, started_s: float) -> tuple[float, float, int]:
    """(start_s, end_s, count): from the last warm-up frame's completion (frames with id below
    ``warmup_ids``; ``started_s`` when there are none) to the last completion, and the number of
    non-warm-up frames completed inside that window. Frames carry ``id`` and ``t["post_end"]``."""
    if not frames:
        return started_s, started_s, 0
    warm_ends = [f["t"]["post_end"] for f in frames if f["id"] < warmup_ids]
    start = max(warm_ends) if warm_ends else started_s
    end = max(f["t"]["post_end"] for f in frames)
    count = sum(1 for f in frames if f["id"] >= warmup_ids and f["t"]["post_end"] > start)
    return start, end, count


def fps(count: int, start_s: float, end_s: float) -> float:
    """Frames per second over [start_s, end_s]; 0 for an empty window."""
    return count / (end_s - start_s) if end_s > start_s else 0.0


def utilisation(busy_s: float, wall_s: float) -> float:
    """Busy fraction of the wall time; 0 when no wall time passed."""
    return busy_s / wall_s if wall_s > 0 else 0.0
