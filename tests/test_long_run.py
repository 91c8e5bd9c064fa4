"""A long run keeps every process's memory flat: two runs of many small frames, one 8 x longer,
and the peak resident memory of each process grows by less than RSS_GROWTH_BOUND_BYTES per extra
frame (the collector once kept ~1 KB a frame: a 40k-frame run grew it by 40 MB; later ~700 B a frame,
from the workers' summaries, whose per-frame values it held as Python floats and journaled as
JSON numbers: they travel packed now, 8 bytes a value)."""

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
def test_memory_stays_flat_over_a_long_run(tmp_path):
    short = peak_rss_by_process(tmp_path, SHORT_FRAMES)
    long = peak_rss_by_process(tmp_path, LONG_FRAMES)
    assert set(short) == set(long) and "collector" in short
    growth = {name: (long[name] - short[name]) / (LONG_FRAMES - SHORT_FRAMES) for name in short}
    grown = {name: round(per_frame) for name, per_frame in growth.items() if per_frame > RSS_GROWTH_BOUND_BYTES}
    assert not grown, f"resident memory grew by more than {RSS_GROWTH_BOUND_BYTES} B per frame: {grown}"
