"""Pure statistics for the run reports."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def summarise_ms(values: Sequence[float]) -> dict:
    """count, mean, min, max and the 50/90/95/99th percentiles (linear interpolation)."""
    if len(values) == 0:
        return {"count": 0, "mean": 0.0, "min": 0.0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = np.percentile(a, (50, 90, 95, 99))
    return {"count": int(a.size), "mean": float(a.mean()), "min": float(a.min()), "p50": float(p50),
            "p90": float(p90), "p95": float(p95), "p99": float(p99), "max": float(a.max())}


def measured_window(frames: Sequence[dict], warmup_ids: int, started_s: float) -> tuple[float, float, int]:
    """(start, end, frames): from the last warm-up frame's completion (or the run's start) to the
    last completion, counting the non-warm-up frames completed inside it."""
    if not frames:
        return started_s, started_s, 0
    warm = [f["t"]["post_end"] for f in frames if f["id"] < warmup_ids]
    start = max(warm) if warm else started_s
    end = max(f["t"]["post_end"] for f in frames)
    count = sum(1 for f in frames if f["id"] >= warmup_ids and f["t"]["post_end"] > start)
    return start, end, count


def fps(count: int, start_s: float, end_s: float) -> float:
    return count / (end_s - start_s) if end_s > start_s else 0.0


def utilisation(busy_s: float, wall_s: float) -> float:
    return busy_s / wall_s if wall_s > 0 else 0.0
