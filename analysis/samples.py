"""``Samples``: a series of float measurements (e.g. ms per frame) in flat memory however long
the run: the count, sum, min and max are exact; the values kept for percentiles are all of them
up to ``RESERVOIR_SIZE``, then a uniform random sample of that size (reservoir sampling,
Vitter's algorithm R), so percentiles of a long run are estimates with exact extremes.

Workers build one per series and send ``to_dict()``, whose kept values are packed little-endian
float64 bytes: a worker's summary holds up to RESERVOIR_SIZE values per series, and the collector
holds every worker's summary, so 8 bytes a value there rather than a Python float's 32 (a list
slot and the float) keeps its memory flat per frame. The report reads them back with
``as_samples``, which also takes a plain list of floats."""

from __future__ import annotations

import math
import random
from array import array
from typing import Any, Iterable, Sequence

import numpy as np

from analysis.stats import SUMMARY_PERCENTILES, percentiles
from yolo.module_stats import pack_values, unpack_values

RESERVOIR_SIZE = 20_000  # values kept for percentiles: 160 kB per series
SAMPLES_KEYS = ("count", "sum", "min", "max", "values")
HYPERGEOMETRIC_LIMIT = 10**9


class Samples:
    """count, sum, min, max of every value added, and at most ``capacity`` of the values."""

    __slots__ = ("capacity", "count", "sum", "min", "max", "_values", "_rng")

    def __init__(self, values: Iterable[float] = (), capacity: int = RESERVOIR_SIZE, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"Samples: expected a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._values = array("d")
        self._rng = random.Random(seed)
        self.extend(values)

    def add(self, x: float) -> None:
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"Samples: expected a finite value, got {x}")
        self.count += 1
        self.sum += x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if len(self._values) < self.capacity:
            self._values.append(x)
            return
        slot = self._rng.randrange(self.count)  # keep x with probability capacity / count
        if slot < self.capacity:
            self._values[slot] = x

    def extend(self, xs: Iterable[float]) -> None:
        for x in xs:
            self.add(x)

    def merge(self, other: Samples) -> None:
        """Add every value ``other`` counted. When both kept all their values this is exact;
        otherwise the kept values become a uniform sample of the two series together: how many
        come from each is drawn by the hypergeometric law, then that many of each one's kept
        values (themselves a uniform sample of its series) are picked at random."""
        if other.count == 0:
            return
        mine_complete = len(self._values) == self.count
        theirs_complete = len(other._values) == other.count
        total = self.count + other.count
        if mine_complete and theirs_complete and total <= self.capacity:
            self._values.extend(other._values)
        else:
            rng = np.random.default_rng(self._rng.getrandbits(64))
            keep = min(self.capacity, total)
            from_mine = min(_share_of_first(rng, self.count, other.count, keep), len(self._values))
            from_theirs = min(keep - from_mine, len(other._values))
            mine = rng.choice(np.array(self._values), from_mine, replace=False)
            theirs = rng.choice(np.array(other._values), from_theirs, replace=False)
            self._values = array("d", np.concatenate([mine, theirs]).tobytes())
        self.count = total
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def values(self) -> np.ndarray:
        """A copy of the kept values (all of them while count <= capacity)."""
        return np.array(self._values, dtype=np.float64)

    @property
    def mean(self) -> float:
        """Exact mean of every value added; 0 when there are none."""
        return self.sum / self.count if self.count else 0.0

    def percentiles(self, qs: Sequence[float] = SUMMARY_PERCENTILES) -> dict[str, float]:
        """{"p50": ...} of the kept values (exact while count <= capacity); zeros when empty."""
        return percentiles(self.values, qs)

    def summary(self) -> dict[str, float | int]:
        """count, mean, p50, p90, p95, p99, max and min; count 0 and zeros when empty."""
        if self.count == 0:
            return {"count": 0, "mean": 0.0, **self.percentiles(), "max": 0.0, "min": 0.0}
        return {"count": self.count, "mean": self.mean, **self.percentiles(), "max": self.max, "min": self.min}

    def to_dict(self) -> dict[str, Any]:
        """Plain data for msgpack, the kept values packed (see the module's docstring); min and max
        are None when empty."""
        empty = self.count == 0
        return {"count": self.count, "sum": self.sum, "min": None if empty else self.min,
                "max": None if empty else self.max, "values": pack_values(self._values)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Samples:
        missing = [k for k in SAMPLES_KEYS if k not in d]
        if missing:
            raise ValueError(f"Samples.from_dict: expected keys {list(SAMPLES_KEYS)}, got none for {missing}")
        values = d["values"]
        if isinstance(values, (bytes, bytearray, memoryview)):
            values = unpack_values(values)
        if not 0 <= len(values) <= d["count"]:
            raise ValueError(f"Samples.from_dict: expected at most count={d['count']} values, got {len(values)}")
        samples = cls(capacity=max(RESERVOIR_SIZE, len(values)))
        samples._values = array("d", values.tobytes()) if isinstance(values, np.ndarray) else array("d", map(float, values))
        samples.count = int(d["count"])
        samples.sum = float(d["sum"])
        if samples.count:
            samples.min, samples.max = float(d["min"]), float(d["max"])
        return samples

    def __repr__(self) -> str:
        return f"Samples(count={self.count}, mean={self.mean:.4g}, kept={len(self._values)})"


def _share_of_first(rng: np.random.Generator, first: int, second: int, draws: int) -> int:
    """How many of ``draws`` values drawn without replacement from two series of ``first`` and
    ``second`` values come from the first (numpy's hypergeometric takes < 10**9 per side)."""
    if max(first, second) < HYPERGEOMETRIC_LIMIT:
        return int(rng.hypergeometric(first, second, draws))
    return int(rng.binomial(draws, first / (first + second)))


def as_samples(value: Samples | dict | Sequence[float] | None) -> Samples:
    """A ``Samples`` from what a worker sent: a ``to_dict()`` dict, a plain list of floats (older
    workers), None (nothing measured), or a ``Samples`` itself (returned as is)."""
    if isinstance(value, Samples):
        return value
    if value is None:
        return Samples()
    if isinstance(value, dict):
        return Samples.from_dict(value)
    return Samples(value, capacity=max(RESERVOIR_SIZE, len(value)))


def summarise_ms(values: Samples | dict | Sequence[float] | None) -> dict[str, float | int]:
    """count, mean, p50, p90, p95, p99, max and min of a series (see ``as_samples``); count 0
    and zeros when empty."""
    return as_samples(values).summary()


def pooled(series: Iterable[Samples | dict | Sequence[float] | None]) -> Samples:
    """One ``Samples`` holding every value of ``series`` (e.g. one per worker of a stage)."""
    merged = Samples()
    for s in series:
        merged.merge(as_samples(s))
    return merged
