"""The collector killed mid-run: the run cannot go on, but its folder is whole: detections.json and
predictions.json made valid from what the collector had written, a report.json of what the runner
knows, results/latest pointing at it, and no partial file left."""

from __future__ import annotations

import json
import signal

import pytest

from supervisor.salvage import whole_records
from tests.live_run import SMALL_RUN
from workers.faults import TEST_SLOW_ENV


def test_whole_records_keep_every_line_that_parses_up_to_the_cut():
    text = '[\n{"a": 1},\n{"a": 2},\n{"a": 3, "b": [1, 2'
    assert whole_records(text) == [{"a": 1}, {"a": 2}]
    assert whole_records('[\n{"a": 1}\n]\n') == [{"a": 1}]
    assert whole_records("[") == [] and whole_records("") == []


@pytest.mark.slow
def test_a_killed_collector_leaves_valid_detections_and_the_runners_report(live, yolov5n_path, fixtures_dir):
    run = live(*SMALL_RUN, "--weights", str(yolov5n_path), "--source", str(fixtures_dir / "bus.jpg"), "--imgsz", "320",
               "--frames", "200", "--save-images", "1", env={TEST_SLOW_ENV: "post:30"})
    # 20 frames take postprocess at least 0.6 s (30 ms each): the collector has sent the runner its
    # progress (every 0.25 s) by then, so the runner's report knows of processed frames. After 5
    # (0.15 s) an idle machine could kill it before the first progress, and the report said 0.
    run.wait_for_images(20)
    run.wait_for_stage("collector").send_signal(signal.SIGKILL)
    assert run.wait() == 1, run.stderr()
    assert "collector killed by SIGKILL: the run cannot go on without its collector" in run.stderr(), run.stderr()
    report = run.report()
    assert report["complete"] is False and "collector" in report["reason"]
    assert report["frames"]["processed"] >= 1 and report["config"]["frames"] == 200
    detections = json.loads((run.run_dir / "detections.json").read_text())
    assert isinstance(detections, list) and detections, "the detections written before the kill are kept"
    assert all(d["image"] == "bus.jpg" and len(d["box"]) == 4 for d in detections)
    assert isinstance(json.loads((run.run_dir / "predictions.json").read_text()), list)
    assert report["files_salvaged"]["detections.json"] == len(detections)
    assert not list(run.run_dir.glob(".*.partial"))
    assert (run.results / "latest").resolve() == run.run_dir.resolve()
    run.assert_clean()
