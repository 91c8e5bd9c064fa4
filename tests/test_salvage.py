"""The collector killed mid-run: it is restarted and goes on from what it had written durably
(its journal), every frame counted once; and when it cannot be restarted the run's folder is
still whole: detections.json and predictions.json made valid from what the collector had written,
a report.json of what the runner knows, results/latest pointing at it, and no partial file left."""

from __future__ import annotations

import json
import signal

import pytest

from analysis.atomic import JsonListFile, whole_records
from analysis.samples import Samples
from tests.live_run import SMALL_RUN
from collector.journal import JOURNAL_NAME, Journal, frame_row, reload
from topology.stages import frame_times
from process.faults import TEST_SLOW_ENV


def test_whole_records_keep_every_line_that_parses_up_to_the_cut():
    text = '[\n{"a": 1},\n{"a": 2},\n{"a": 3, "b": [1, 2'
    assert whole_records(text) == [{"a": 1}, {"a": 2}]
    assert whole_records('[\n{"a": 1}\n]\n') == [{"a": 1}]
    assert whole_records("[") == [] and whole_records("") == []


def _result(frame_id: int, boxes: int) -> dict:
    return {"id": frame_id, "name": "bus.jpg", "t": {k: 0.5 * i for i, k in enumerate(frame_times())}, "batch": 1,
            "image_saved": False, "cold": True, "workers": {"pre": "pre-0", "infer": "infer-1", "post": "post-0"},
            "detections": [{"frame": frame_id, "k": k} for k in range(boxes)]}


def test_a_restarted_collector_keeps_the_frames_whose_records_its_files_hold_whole(tmp_path, caplog):
    """Frames 0-2 written and journaled; frame 3's records written but the collector died before its
    journal line; frame 4's journal line cut. The reload keeps frames 0-2 and cuts the lists after
    their records; appending then gives valid files with each record once."""
    log = __import__("logging").getLogger("test")
    detections = JsonListFile(str(tmp_path / "detections.json"), json.dumps)
    predictions = JsonListFile(str(tmp_path / "predictions.json"), json.dumps)
    journal = Journal(str(tmp_path), log)
    for frame_id, boxes in ((0, 2), (1, 0), (2, 1)):
        result = _result(frame_id, boxes)
        journal.frame(result, (detections.extend(result["detections"]), predictions.extend([{"p": frame_id}])))
    journal.failed({"id": 5, "name": "x.jpg", "stage": "pre", "worker": "pre-0", "reason": "broken"})
    journal.flush()
    detections.extend(_result(3, 2)["detections"])  # died before frame 3's journal line
    detections._file.flush()
    (tmp_path / JOURNAL_NAME).open("a").write('{"f": [4, 1, 0')
    reloaded = reload(str(tmp_path))
    assert [sorted(e) for e in reloaded.entries] == [["f"]] * 3 + [["failed"]]
    assert frame_row(reloaded.entries[0]["f"]) == {**_result(0, 2), "detections": 2}  # the ledger's row
    assert reloaded.lists["detections.json"][1] == 3 and reloaded.lists["predictions.json"][1] == 3
    again = JsonListFile(str(tmp_path / "detections.json"), json.dumps, reloaded.lists["detections.json"])
    again.extend(_result(3, 2)["detections"])  # sent again by postprocess
    assert again.finish()
    records = json.loads((tmp_path / "detections.json").read_text())
    assert [(r["frame"], r["k"]) for r in records] == [(0, 0), (0, 1), (2, 0), (3, 0), (3, 1)]
    Journal(str(tmp_path), log, reloaded.journal_end).close()
    assert not (tmp_path / JOURNAL_NAME).exists()
    predictions.abandon()


def test_a_worker_summary_with_packed_values_comes_back_from_the_journal_as_it_was_sent(tmp_path):
    """A summary's Samples travel as packed bytes (8 a value); the journal line holds them as
    base64, with a NaN elsewhere in the summary too, and the reload gives the same bytes back."""
    log = __import__("logging").getLogger("test")
    frame_ms = Samples([1.5, 2.25, 40.0]).to_dict()
    stats = {"name": "pre-0", "incarnation": 0, "frame_ms": frame_ms, "substages_ms": {"read": frame_ms},
             "cpu_s": float("nan")}
    journal = Journal(str(tmp_path), log)
    journal.stats(stats)
    journal.flush()
    (entry,) = reload(str(tmp_path)).entries
    assert entry["stats"]["frame_ms"] == frame_ms and entry["stats"]["substages_ms"]["read"] == frame_ms
    assert Samples.from_dict(entry["stats"]["frame_ms"]).summary() == Samples([1.5, 2.25, 40.0]).summary()
    assert entry["stats"]["cpu_s"] is None  # what the report writes for NaN
    journal.close()


@pytest.mark.slow
def test_a_killed_collector_is_restarted_and_every_frame_is_counted_once(live, yolov5n_path, fixtures_dir):
    """SIGKILL to the collector mid-run: it is restarted, takes back what it had written (the
    journal, the partial lists), postprocess sends its last results again, and the run ends as
    if nothing happened: 200/200 processed, no frame lost or twice in detections.json, a complete
    report that lists the collector's restart, exit 0."""
    run = live(*SMALL_RUN, "--weights", str(yolov5n_path), "--source", str(fixtures_dir / "bus.jpg"), "--imgsz", "320",
               "--frames", "200", "--save-images", "1", env={TEST_SLOW_ENV: "post:30"})
    run.wait_for_images(20)
    run.wait_for_stage("collector").send_signal(signal.SIGKILL)
    assert run.wait() == 0, run.stderr()
    assert "collector killed by SIGKILL: restarting it (1 of 3 restarts for collector)" in run.stderr(), run.stderr()
    report = run.report()
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["lost"]) == (200, 200, 0, 0), frames
    assert frames["accounted"] and report.get("complete", True) is not False
    (restart,) = report["restarts"]
    assert restart["name"] == "collector" and restart["signal"] == "SIGKILL" and not restart["final"], restart
    detections = json.loads((run.run_dir / "detections.json").read_text())
    per_frame = {}
    for record in detections:
        per_frame[record["frame"]] = per_frame.get(record["frame"], 0) + 1
    assert sorted(per_frame) == list(range(200)), "every frame's detections, each frame once"
    assert len(set(per_frame.values())) == 1, "the same image: the same number of records per frame, none twice"
    assert isinstance(json.loads((run.run_dir / "predictions.json").read_text()), list)
    assert run.images() == 200
    assert not list(run.run_dir.glob(".*.partial"))
    assert (run.results / "latest").resolve() == run.run_dir.resolve()
    run.assert_clean()


@pytest.mark.slow
def test_a_killed_collector_leaves_valid_detections_and_the_runners_report(live, yolov5n_path, fixtures_dir):
    """--max-restarts 0: the collector cannot be restarted, and the runner makes the folder whole."""
    run = live(*SMALL_RUN, "--weights", str(yolov5n_path), "--source", str(fixtures_dir / "bus.jpg"), "--imgsz", "320",
               "--frames", "200", "--save-images", "1", "--max-restarts", "0", env={TEST_SLOW_ENV: "post:30"})
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
