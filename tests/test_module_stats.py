"""Per-module statistics from exact series and from compact summaries of long ones."""

import numpy as np
import pytest

from analysis.samples import Samples
from yolo.module_stats import RESIDUAL_NAME, aggregate, forward_stats


def export(times: dict, forward, residual, as_summary: bool) -> dict:
    def series(values):
        if not as_summary:
            return list(values)
        s = Samples(capacity=4)  # a tiny reservoir: counts and totals must stay exact anyway
        s.extend(values)
        return s.to_dict()
    return {"mode": "cpu", "forward_ms": series(forward), "residual_ms": series(residual),
            "modules": [{"name": n, "type": "Conv", "params": 1, "outermost": True, "in_forward": True,
                         "shapes": {"1x3x8x8": len(v)}, "times_ms": series(v)} for n, v in times.items()]}


@pytest.mark.parametrize("as_summary", [False, True], ids=["values", "summaries"])
def test_counts_totals_and_shares_are_exact(as_summary):
    rng = np.random.default_rng(0)
    a, b = rng.uniform(1, 2, 100), rng.uniform(3, 4, 100)
    forward = a + b + 0.5
    exports = [export({"m.0": a[:60], "m.1": b[:60]}, forward[:60], np.full(60, 0.5), as_summary),
               export({"m.0": a[60:], "m.1": b[60:]}, forward[60:], np.full(40, 0.5), as_summary)]
    rows = {r.name: r for r in aggregate(exports)}
    assert rows["m.0"].calls == 100 and rows["m.0"].total_ms == pytest.approx(a.sum())
    assert rows["m.1"].mean_ms == pytest.approx(b.mean())
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    assert rows[RESIDUAL_NAME].total_ms == pytest.approx(50.0)
    stats = forward_stats(exports)
    assert stats["forwards"] == 100 and stats["total_ms"] == pytest.approx(forward.sum())
    if not as_summary:
        assert rows["m.0"].p50_ms == pytest.approx(np.percentile(a, 50))


def test_take_times_hands_over_and_forgets():
    from yolo.timing import Recorder
    recorder = Recorder("cpu", keep_span_forwards=2)
    for _ in range(3):
        recorder.begin_forward()
        recorder.stop(recorder.start("layer"))
        recorder.end_forward()
    times, forward, residual = recorder.take_times()
    assert len(times["layer"]) == 3 and len(forward) == 3 and len(residual) == 3
    assert recorder.take_times() == ({}, [], [])
    recorder.begin_forward()
    recorder.end_forward()
    assert sum(1 for s in recorder.spans if s[0] == "forward") == 2  # the span cap survives a hand-over
