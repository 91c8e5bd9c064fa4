"""A compact series of measurements: exact count, sum, min and max, and the values for
percentiles in an array that turns into a uniform reservoir once full, so memory stays flat."""

from __future__ import annotations

import math
import random
from array import array
from typing import Iterable, Sequence

import numpy as np

RESERVOIR_SIZE = 20000


class Samples:
    def __init__(self, capacity: int = RESERVOIR_SIZE, seed: int = 0):
        self.capacity = capacity
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.values = array("d")
        self._rng = random.Random(seed)

    def add(self, x: float) -> None:
        x = float(x)
        self.count += 1
        self.sum += x
        self.min = min(self.min, x)
        self.max = max(self.max, x)
        if len(self.values) < self.capacity:
            self.values.append(x)
        else:
            j = self._rng.randrange(self.count)
            if j < self.capacity:
                self.values[j] = x

    def extend(self, xs: Iterable[float]) -> None:
        for x in xs:
            self.add(x)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        if not self.values:
            return [0.0 for _ in qs]
        return [float(v) for v in np.percentile(np.frombuffer(self.values, dtype=np.float64), list(qs))]

    def to_dict(self) -> dict:
        return {"count": self.count, "sum": self.sum, "min": self.min if self.count else 0.0,
                "max": self.max if self.count else 0.0, "values": self.values.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "Samples":
        s = cls()
        s.count, s.sum = int(d["count"]), float(d["sum"])
        s.min, s.max = (float(d["min"]), float(d["max"])) if s.count else (math.inf, -math.inf)
        s.values = array("d", d["values"])
        return s
