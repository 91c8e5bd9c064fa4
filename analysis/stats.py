"""Small pure statistics for the run reports: percentiles, frames per second, utilisation."""

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


def fps(count: int, start_s: float, end_s: float) -> float | None:
    """Frames per second over [start_s, end_s]; None (not 0) when the window is empty or holds
    no frame: there is no rate to report."""
    return count / (end_s - start_s) if end_s > start_s and count > 0 else None


def utilisation(busy_s: float, wall_s: float) -> float:
    """Busy fraction of the wall time; 0 when no wall time passed."""
    return busy_s / wall_s if wall_s > 0 else 0.0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator
