"""Interleaved rounds, shared by the benchmarks: every variant runs once per round, the order
rotating each round, so a slow drift of the machine (these shared machines drift by tens of
percent between separate runs) hits every variant alike; results are medians over rounds."""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` in the order of round ``round_index``: rotated left by the round's index."""
    if not items:
        return []
    shift = round_index % len(items)
    return list(items[shift:]) + list(items[:shift])


def rounds_within(rounds: int, budget_s: float, started_s: float) -> Iterator[int]:
    """Round indices 0 .. rounds - 1 while one more round, as long as the mean round so far,
    still ends within ``budget_s`` of ``started_s`` (a perf_counter reading)."""
    for r in range(rounds):
        elapsed = time.perf_counter() - started_s
        if r and elapsed / r * (r + 1) > budget_s:
            print(f"stopping after {r} rounds: another would end past --budget-s {budget_s:g}", flush=True)
            return
        yield r


def round_robin(variants: dict[str, Callable[[], object]], rounds: int, warmup: int,
                sync: Callable[[], None]) -> dict[str, np.ndarray]:
    """Milliseconds of each in-process variant per measured round (``sync`` before and after
    each call, for devices that run asynchronously); the first ``warmup`` rounds are not kept."""
    times: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(warmup + rounds):
        for name in rotated(list(variants), r):
            sync()
            t0 = time.perf_counter()
            variants[name]()
            sync()
            if r >= warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {n: np.asarray(t) for n, t in times.items()}


def paired_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """Median over rounds of a / b: both ran in the same round, so slow drifts of the machine
    cancel out."""
    return float(np.median(np.asarray(a, dtype=np.float64) / np.asarray(b, dtype=np.float64)))
