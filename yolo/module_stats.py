"""Per-module timing statistics from recorder exports: plain numpy, no torch, so that the
processes which only merge and report (the collector) need not import torch.

``aggregate`` merges the exports of ``yolo.timing.Recorder`` (one per inference process) into
per-module rows; a residual row holds the forward time outside every outermost timed call, so
the outermost rows' shares plus the residual's sum to 1.

A series of times is either every value (a list or array), or a summary of a long series as a
compact ``{"count", "sum", "values"}`` dict (``values`` a uniform sample, for percentiles, as a
list or packed by ``pack_values``), so a long run's process memory stays flat: counts and totals
stay exact either way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

RESIDUAL_NAME = "(outside timed modules)"
PACKED_VALUES = "<f8"  # the one byte order on every host of a cluster


def pack_values(values) -> bytes:
    """Float64 values (an array.array("d"), a numpy array, a list) as PACKED_VALUES bytes: 8 bytes
    a value in a message and in its receiver's memory, where a list of Python floats takes 32."""
    return np.asarray(values, dtype=np.float64).astype(PACKED_VALUES, copy=False).tobytes()


def unpack_values(packed: bytes) -> np.ndarray:
    """``pack_values``'s bytes back as native float64; a length that is no whole number of
    values is refused."""
    if len(packed) % 8:
        raise ValueError(f"packed values must be a multiple of 8 bytes, got {len(packed)}")
    return np.frombuffer(packed, dtype=PACKED_VALUES).astype(np.float64)


@dataclass(frozen=True)
class ModuleStats:
    """One row of the per-module table; times in milliseconds, share of the whole forward."""

    name: str
    type: str
    params: int
    input_shapes: str
    calls: int
    total_ms: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    share: float | None
    outermost: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Series:
    count: int
    total: float
    values: np.ndarray  # all values, or a uniform sample of them

    @classmethod
    def of(cls, series: Any) -> _Series:
        if isinstance(series, dict):
            values = series.get("values", ())
            values = unpack_values(values) if isinstance(values, bytes) else np.asarray(values, dtype=np.float64)
            return cls(int(series["count"]), float(series["sum"]), values)
        values = np.asarray(series, dtype=np.float64)
        return cls(int(values.size), float(values.sum()), values)

    @classmethod
    def merge(cls, parts: list[_Series]) -> _Series:
        return cls(sum(p.count for p in parts), sum(p.total for p in parts),
                   np.concatenate([p.values for p in parts] or [np.zeros(0)]))


def aggregate(exports: Iterable[dict[str, Any]]) -> list[ModuleStats]:
    """Merge recorder exports (e.g. one per inference process) into per-module rows, in
    registration order, with a residual row so outermost shares plus residual sum to 1."""
    exports = list(exports)
    forward = _Series.merge([_Series.of(e["forward_ms"]) for e in exports])
    merged: dict[str, dict[str, Any]] = {}
    for e in exports:
        for m in e["modules"]:
            row = merged.setdefault(m["name"], {**m, "shapes": {}, "times_ms": []})
            row["outermost"] = row["outermost"] and m["outermost"]
            row["in_forward"] = row["in_forward"] and m["in_forward"]
            for shape, count in m["shapes"].items():
                row["shapes"][shape] = row["shapes"].get(shape, 0) + count
            row["times_ms"].append(_Series.of(m["times_ms"]))
    forward_total = forward.total
    rows = []
    for name, m in merged.items():
        times = _Series.merge(m["times_ms"])
        if times.count == 0:
            continue  # never called, e.g. a container its owner iterates instead of calling
        share = times.total / forward_total if forward_total > 0 and m["in_forward"] else None
        rows.append(_row(name, m["type"], m["params"], _shapes_text(m["shapes"]), times, share,
                         m["outermost"]))
    residual = _Series.merge([_Series.of(e["residual_ms"]) for e in exports])
    if residual.count:
        share = residual.total / forward_total if forward_total > 0 else None
        rows.append(_row(RESIDUAL_NAME, "residual", 0, "", residual, share, True))
    return rows


def forward_stats(exports: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The forwards' count and times, and the clock that timed them (``cpu``, ``cuda-events``, ...)."""
    exports = list(exports)
    forward = _Series.merge([_Series.of(e["forward_ms"]) for e in exports])
    modes = ", ".join(sorted({e["mode"] for e in exports if e.get("mode")})) or None
    if forward.count == 0:
        return {"forwards": 0, "total_ms": 0.0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0, "timing_mode": modes}
    return {"forwards": forward.count, "total_ms": forward.total, "mean_ms": forward.total / forward.count,
            "p50_ms": float(np.percentile(forward.values, 50)), "p95_ms": float(np.percentile(forward.values, 95)),
            "timing_mode": modes}


def _row(name, type_name, params, shapes, times: _Series, share, outermost) -> ModuleStats:
    return ModuleStats(name=name, type=type_name, params=int(params), input_shapes=shapes,
                       calls=times.count, total_ms=times.total, mean_ms=times.total / times.count,
                       p50_ms=float(np.percentile(times.values, 50)), p95_ms=float(np.percentile(times.values, 95)),
                       share=share, outermost=bool(outermost))


def _shapes_text(shapes: dict[str, int]) -> str:
    return "; ".join(sorted(shapes, key=lambda s: -shapes[s]))
