"""A long run keeps every process's memory flat: two runs of many small frames, one 8 x longer,
and the peak resident memory of each process grows by less than RSS_GROWTH_BOUND_BYTES per extra
frame (the collector once kept ~1 KB a frame: a 40k-frame run grew it by 40 MB)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RSS_GROWTH_BOUND_BYTES = 512
SHORT_FRAMES, LONG_FRAMES = 500, 4000


def peak_rss_by_process(tmp_path, frames):
    name = f"flat{frames}"
    out = subprocess.run([sys.executable, "runner.py", "--preset", "none", "--imgsz", "32", "--synthetic-count", "8",
                          "--frames", str(frames), "--save-images", "none", "--warmup", "0", "--no-progress",
                          "--results", str(tmp_path), "--name", name], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / name / "report.json") as f:
        report = json.load(f)
    assert report["frames"]["processed"] == frames
    return {name: p["peak_rss_bytes"] for name, p in report["resources"]["processes"].items()
            if name.split("-")[0] in ("pre", "infer", "post", "collector", "runner")}


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="known regression since the collector's restart journal (issue 21): the "
                   "collector keeps ~670-820 B per frame against ~300 before (500/4000/8000-frame runs, "
                   "2026-12-04); the journal's own lines are ~150 B of it, the rest not found yet")
def test_memory_stays_flat_over_a_long_run(tmp_path):
    short = peak_rss_by_process(tmp_path, SHORT_FRAMES)
    long = peak_rss_by_process(tmp_path, LONG_FRAMES)
    assert set(short) == set(long) and "collector" in short
    growth = {name: (long[name] - short[name]) / (LONG_FRAMES - SHORT_FRAMES) for name in short}
    grown = {name: round(per_frame) for name, per_frame in growth.items() if per_frame > RSS_GROWTH_BOUND_BYTES}
    assert not grown, f"resident memory grew by more than {RSS_GROWTH_BOUND_BYTES} B per frame: {grown}"
