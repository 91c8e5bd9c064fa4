"""Per-module timing statistics from recorder exports: plain numpy, no torch, so that the
processes which only merge and report (the collector) need not import torch.

``aggregate`` merges the exports of ``yolo.timing.Recorder`` (one per inference process) into
per-module rows; a residual row holds the forward time outside every outermost timed call, so
the outermost rows' shares plus the residual's sum to 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

RESIDUAL_NAME = "(outside timed modules)"


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


def aggregate(exports: Iterable[dict[str, Any]]) -> list[ModuleStats]:
    """Merge recorder exports (e.g. one per inference process) into per-module rows, in
    registration order, with a residual row so outermost shares plus residual sum to 1."""
    exports = list(exports)
    forward = np.concatenate([np.asarray(e["forward_ms"], dtype=np.float64) for e in exports] or [np.zeros(0)])
    merged: dict[str, dict[str, Any]] = {}
    for e in exports:
        for m in e["modules"]:
            row = merged.setdefault(m["name"], {**m, "shapes": {}, "times_ms": []})
            row["outermost"] = row["outermost"] and m["outermost"]
            row["in_forward"] = row["in_forward"] and m["in_forward"]
            for shape, count in m["shapes"].items():
                row["shapes"][shape] = row["shapes"].get(shape, 0) + count
            row["times_ms"].append(np.asarray(m["times_ms"], dtype=np.float64))
    forward_total = float(forward.sum())
    rows = []
    for name, m in merged.items():
        times = np.concatenate(m["times_ms"]) if m["times_ms"] else np.zeros(0)
        if times.size == 0:
            continue  # never called, e.g. a container its owner iterates instead of calling
        share = float(times.sum()) / forward_total if forward_total > 0 and m["in_forward"] else None
        rows.append(_row(name, m["type"], m["params"], _shapes_text(m["shapes"]), times, share,
                         m["outermost"]))
    residual = np.concatenate([np.asarray(e["residual_ms"], dtype=np.float64) for e in exports])
    if residual.size:
        share = float(residual.sum()) / forward_total if forward_total > 0 else None
        rows.append(_row(RESIDUAL_NAME, "residual", 0, "", residual, share, True))
    return rows


def forward_stats(exports: Iterable[dict[str, Any]]) -> dict[str, float]:
    forward = np.concatenate([np.asarray(e["forward_ms"], dtype=np.float64) for e in exports] or [np.zeros(0)])
    if forward.size == 0:
        return {"forwards": 0, "total_ms": 0.0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0}
    return {"forwards": int(forward.size), "total_ms": float(forward.sum()), "mean_ms": float(forward.mean()),
            "p50_ms": float(np.percentile(forward, 50)), "p95_ms": float(np.percentile(forward, 95))}


def _row(name, type_name, params, shapes, times, share, outermost) -> ModuleStats:
    return ModuleStats(name=name, type=type_name, params=int(params), input_shapes=shapes,
                       calls=int(times.size), total_ms=float(times.sum()), mean_ms=float(times.mean()),
                       p50_ms=float(np.percentile(times, 50)), p95_ms=float(np.percentile(times, 95)),
                       share=share, outermost=bool(outermost))


def _shapes_text(shapes: dict[str, int]) -> str:
    return "; ".join(sorted(shapes, key=lambda s: -shapes[s]))
