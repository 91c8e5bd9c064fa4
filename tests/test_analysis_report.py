"""analysis.report on a small hand-built run: 6 frames (2 warm-up) over 2 workers per role, one
failure; the workers send plain lists of ms (as older workers did) except where a test says."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.markdown import module_table_rows
from analysis.report import MODULES_CSV_HEADER, RunData, build_report, json_safe, json_summary, write_run_folder
from topology.stages import frame_roles
from analysis.terminal import format_summary
from yolo.module_stats import RESIDUAL_NAME

STARTED_S = 100.0
FRAMES = 6
WARMUP = 2


def frame(i: int) -> dict:
    """Frame i is read at 100 + 0.1 i and takes 10 ms per stage and 2 ms per queue: 54 ms end to end."""
    t0 = STARTED_S + 0.1 * i
    offsets_ms = {"read_start": 0, "read_end": 4, "pre_end": 10, "infer_recv": 11, "infer_start": 12, "infer_end": 22,
                  "post_recv": 23, "post_start": 24, "post_end": 34 + 20 * (i % 2)}
    return {"id": i, "name": f"img{i}.jpg", "batch": 1, "detections": 2, "image_saved": True,
            "workers": {"pre": f"pre-{i % 2}", "infer": f"infer-{i % 2}", "post": f"post-{i % 2}"},
            "t": {k: t0 + ms / 1e3 for k, ms in offsets_ms.items()}}


def worker(role: str, index: int, pid: int, frames: int, busy_s: float) -> dict:
    return {"name": f"{role}-{index}" if role != "collector" else "collector", "role": role, "pid": pid,
            "device": "cpu", "threads": {"torch": 1, "opencv": 1, "interop": 1}, "frames": frames,
            "batches": frames if role == "infer" else 0, "busy_s": busy_s, "busy_cpu_s": busy_s, "cpu_s": busy_s,
            "wait_in_s": 0.2,
            "blocked_out_s": 0.1, "wall_s": 1.0, "frame_ms": [10.0, 12.0][: max(frames - 1, 0)],
            "bytes_in": 1000, "bytes_out": 900, "messages_in": frames, "messages_out": frames,
            "substages_ms": {"nms": [1.0, 2.0]} if role == "post" else {}}


def module_rows() -> list[dict]:
    """Two outermost modules and the residual, shares summing to 1, and one nested module."""
    def row(name, total_ms, share, outermost):
        return {"name": name, "type": "Conv", "params": 10, "input_shapes": "1x3x64x64", "calls": 4,
                "total_ms": total_ms, "mean_ms": total_ms / 4, "p50_ms": total_ms / 4, "p95_ms": total_ms / 3,
                "share": share, "outermost": outermost}
    return [row("model.0", 6.0, 0.6, True), row("model.0.conv", 5.0, 0.5, False), row("model.1", 3.0, 0.3, True),
            {**row(RESIDUAL_NAME, 1.0, 0.1, True), "type": "residual", "params": 0, "input_shapes": ""},
            row("loose_fn", 0.5, None, True)]


def make_run(**changes) -> RunData:
    frames = [frame(i) for i in range(FRAMES) if i != 3]  # frame 3 failed in preprocess
    workers = ([worker("pre", 0, 11, 3, 0.3), worker("pre", 1, 12, 2, 0.2), worker("infer", 0, 21, 3, 0.6),
                worker("infer", 1, 22, 2, 0.5), worker("post", 0, 31, 3, 0.4), worker("post", 1, 32, 2, 0.3),
                worker("collector", 0, 40, 5, 0.05)])
    run = dict(
        run_id="test-run", config={"device": "cpu", "batch_size": 1, "imgsz": 64, "rect": True, "weights": "",
                                   "preset": "yolov5n", "classes": (), "nan_setting": float("nan")},
        environment={"cpu_cores": 2}, frames_in=FRAMES, warmup=WARMUP, started_s=STARTED_S,
        finished_s=STARTED_S + 1.0, frames=frames,
        failed=[{"id": 3, "name": "img3.jpg", "stage": "pre", "worker": "pre-1", "reason": "unreadable"}],
        detections=[{"image": "img0.jpg", "frame": 0, "class_id": 0, "class": "person", "score": 0.9,
                     "box": [1.0, 2.0, 3.0, 4.0]}],
        workers=workers,
        links={"pre->infer": {"frames": 5, "bytes": 5000}, "infer->post": {"frames": 5, "bytes": 500},
               "post->collector": {"frames": 0, "bytes": 0}},
        module_rows=module_rows(), forward={"forwards": 4, "total_ms": 10.0, "mean_ms": 2.5, "p50_ms": 2.5,
                                            "p95_ms": 3.0},
        module_spans=[{"worker": "infer-0", "pid": 21, "name": "forward", "start_s": 100.012, "dur_ms": 10.0,
                       "depth": -1},
                      {"worker": "infer-0", "pid": 21, "name": "model.0", "start_s": 100.013, "dur_ms": 4.0,
                       "depth": 0},
                      {"worker": "infer-0", "pid": 21, "name": "model.0.conv", "start_s": 100.013, "dur_ms": 3.0,
                       "depth": 1}])
    run.update(changes)
    return RunData(**run)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    write_run_folder(str(folder), make_run())
    return folder


def load(run_dir, name):
    with open(run_dir / name) as f:
        return json.load(f)


def test_every_file_is_written(run_dir):
    for name in ("report.json", "report.md", "modules.csv", "trace.json", "detections.json", "plots.png",
                 "latency.png", "timeline.png", "modules.png"):
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    assert not (run_dir / "resources.png").exists()  # this run has no resource samples
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".partial")]


def test_report_json_frames_and_stages(run_dir):
    report = load(run_dir, "report.json")
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["accounted"]) == (6, 5, 1, True)
    assert frames["failures"][0]["reason"] == "unreadable"
    for role in frame_roles():
        stage = report["stages"][role]
        assert stage["frames"] == frames["processed"] and stage["workers"] == 2
        assert [w["name"] for w in stage["per_worker"]] == [f"{role}-0", f"{role}-1"]
    infer = report["stages"]["infer"]
    assert infer["utilisation"] == pytest.approx((0.6 + 0.5) / 2.0)
    assert infer["ms_per_frame"]["count"] == 3  # 2 + 1 busy times over the two workers
    assert report["stages"]["post"]["per_worker"][0]["substages_ms"]["nms"]["mean"] == 1.5
    assert report["summary"]["bottleneck"] == "infer"
    assert report["config"]["nan_setting"] is None  # NaN written as null
    # CPU beside wall: busy_cpu_s = busy_s here, over 3 and 2 frames
    assert report["stages"]["infer"]["per_worker"][0]["busy_cpu_ms_per_frame"] == pytest.approx(600 / 3)
    assert report["stages"]["infer"]["cpu_utilisation"] == pytest.approx((0.6 + 0.5) / 2.0)


def test_report_json_latency_and_throughput(run_dir):
    report = load(run_dir, "report.json")
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    # measured frames 2, 4, 5: 34, 34 and 54 ms end to end
    assert lat["count"] == 3 and lat["min"] == pytest.approx(34.0) and lat["max"] == pytest.approx(54.0)
    assert report["stage_latency_ms"]["infer"]["mean"] == pytest.approx(10.0)
    assert report["stage_latency_ms"]["queue_pre_infer"]["mean"] == pytest.approx(2.0)
    th = report["throughput"]
    # window: frame 1's completion (100.154) to frame 5's (100.554), frames 2, 4 and 5 inside
    assert th["measured_frames"] == 3 and th["window_s"] == pytest.approx(0.4)
    assert th["fps"] == pytest.approx(3 / 0.4) and th["wall_s"] == pytest.approx(1.0)
    assert report["summary"]["fps"] == th["fps"]
    assert report["links"]["pre->infer"]["bytes_per_frame"] == 1000.0
    assert report["links"]["post->collector"]["bytes_per_frame"] == 0.0


def test_outermost_shares_sum_to_one(run_dir):
    modules = load(run_dir, "report.json")["modules"]
    shares = [m["share"] for m in modules if m["outermost"] and m["share"] is not None]
    assert math.fsum(shares) == pytest.approx(1.0)


def test_modules_csv(run_dir):
    with open(run_dir / "modules.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == MODULES_CSV_HEADER
    assert [r[0] for r in rows[1:]] == [m["name"] for m in module_rows()]
    assert rows[1][5] == "6.0000" and rows[1][9] == "0.6000"
    assert rows[-1][9] == ""  # share None


def test_trace_json(run_dir):
    events = load(run_dir, "trace.json")["traceEvents"]
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert sorted(names) == sorted(["pre-0", "pre-1", "infer-0", "infer-1", "post-0", "post-1", "collector"])
    spans = [e for e in events if e["ph"] == "X"]
    frame_spans = [e for e in spans if e["tid"] == 0]
    assert len(frame_spans) == 3 * 5
    first_infer = next(e for e in frame_spans if e["name"].startswith("infer") and e["args"]["frame"] == 0)
    assert first_infer["pid"] == 21 and first_infer["name"] == "infer batch=1"
    assert first_infer["ts"] == pytest.approx(12_000) and first_infer["dur"] == pytest.approx(10_000)
    assert {e["tid"] for e in spans if e["pid"] == 21 and e["tid"] != 0} == {9, 10, 11}
    counter = [e for e in events if e["ph"] == "C"]
    assert [e["args"]["frames"] for e in counter] == [1, 2, 3, 4, 5] and {e["pid"] for e in counter} == {40}


def test_report_md(run_dir):
    text = (run_dir / "report.md").read_text()
    assert text.startswith("# Run test-run")
    assert "random weights (detections meaningless)" in text
    assert "img3.jpg" in text and RESIDUAL_NAME in text
    assert "**inference** is the busiest stage" in text
    assert "measured under this run's own load" in text
    assert "| link | frames | bytes per frame |" in text


def test_report_md_lists_at_most_20_failures(tmp_path):
    failed = [{"id": i, "name": f"img{i}.jpg", "stage": "pre", "worker": "pre-0", "reason": "unreadable"}
              for i in range(25)]
    write_run_folder(str(tmp_path), make_run(failed=failed, frames_in=30))
    text = (tmp_path / "report.md").read_text()
    assert "img19.jpg" in text and "img20.jpg" not in text and "... 5 more" in text


def test_module_table_keeps_the_residual_beyond_the_top():
    rows = [{"name": f"m{i}", "total_ms": 100.0 - i, "calls": 1, "share": (100.0 - i) / 2000.1, "outermost": True}
            for i in range(20)] + [{"name": RESIDUAL_NAME, "total_ms": 0.1, "calls": 1, "share": 0.1 / 2000.1,
                                    "outermost": True}]
    names = [r["name"] for r in module_table_rows(rows)]
    assert names == [f"m{i}" for i in range(15)] + ["(5 other outermost modules)", RESIDUAL_NAME]


def test_format_summary_and_returned_summary(tmp_path):
    summary = write_run_folder(str(tmp_path), make_run())
    on_disk = load(tmp_path, "report.json")["summary"]
    assert {k: v for k, v in summary.items() if k != "files"} == on_disk
    assert summary["files"]["written"][:2] == ["report.json", "report.md"]
    assert summary["processed"] == 5 and summary["bottleneck"] == "infer" and summary["files"]["failed"] == {}
    text = format_summary(summary)
    assert "7.50 fps" in text and str(tmp_path) in text
    assert len(text.splitlines()) <= 12
    assert format_summary(summary, load(tmp_path, "report.json")) == text  # today's runner passes the report too


def test_json_summary_is_one_plain_object(tmp_path):
    summary = write_run_folder(str(tmp_path), make_run())
    line = json.dumps(json_summary(summary, exit_code=0), allow_nan=False)
    back = json.loads(line)
    assert "\n" not in line and back["exit_code"] == 0 and back["run_dir"] == str(tmp_path)
    for key in ("fps", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "cpu_ms_per_frame", "bound_fps",
                "bound_kind", "efficiency", "bottleneck", "hint", "stable", "stable_reason", "frames_in", "processed",
                "failed", "lost", "cancelled"):
        assert key in back, key
    assert back["fps"] == pytest.approx(7.5) and back["stable"] is False


def test_empty_run_still_writes_a_report(tmp_path):
    run = make_run(frames=[], workers=[], module_rows=[], module_spans=[], links={}, frames_in=0, failed=[])
    summary = write_run_folder(str(tmp_path), run)
    assert summary["fps"] is None and summary["processed"] == 0 and not summary["stable"]
    assert summary["stable_reason"].startswith("no measured frames")
    assert load(tmp_path, "report.json")["latency_ms"]["count"] == 0
    assert "n/a" in format_summary(summary) and summary["files"]["failed"] == {}
    assert all(stage["ms_per_frame"] is None for stage in summary["stages"].values())
    stage_rows = [line for line in format_summary(summary).splitlines() if line.split()[:1] in (["pre"], ["infer"], ["post"])]
    assert len(stage_rows) == 3 and not any("0.0" in row for row in stage_rows), stage_rows  # blank, not 0.0 ms


def test_frame_without_an_unused_timestamp_is_reported():
    partial = frame(0)
    del partial["t"]["post_recv"]  # the postprocess workers do not send it
    assert build_report(make_run(frames=[partial]))["frames"]["processed"] == 1


def test_frame_without_a_timestamp_is_refused():
    broken = frame(0)
    del broken["t"]["infer_end"]
    with pytest.raises(ValueError, match="infer_end"):
        build_report(make_run(frames=[broken]))


def test_json_safe():
    np = pytest.importorskip("numpy")
    assert json_safe({"a": (1, np.float32(0.5), np.int64(3)), "b": float("inf")}) == {"a": [1, 0.5, 3], "b": None}
    with pytest.raises(ValueError, match="expected JSON-able data"):
        json_safe({"a": object()})


def test_analysis_does_not_import_torch(tmp_path):
    """The collector process writes the run folder without loading torch."""
    code = ("import sys\n"
            "from analysis.report import write_run_folder, json_summary\n"
            "from analysis.terminal import format_summary\n"
            "from tests.analysis_runs import steady_run\n"
            f"summary = write_run_folder({str(tmp_path)!r}, steady_run())\n"
            "format_summary(summary)\n"
            "assert summary['files']['failed'] == {}, summary['files']\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_cancelled_ids_are_listed_as_ranges():
    from analysis.report import id_ranges
    assert id_ranges([7, 3, 4, 5, 9, 10]) == [[3, 5], [7, 7], [9, 10]]
    assert id_ranges([]) == []


@pytest.mark.parametrize("precision, config, backend", [
    (None, {}, "PyTorch 2.x eager on cpu"),
    ("bf16", {"half": True}, "PyTorch 2.x eager with bf16 autocast on cpu"),
    (None, {"half": True, "devices": ["cuda:0"]}, "PyTorch 2.x eager on cuda:0"),
    ("none", {"preset": "none"}, "none (--preset none: no model)"),
])
def test_precision_and_backend_are_in_the_summary_json_and_report_md(tmp_path, precision, config, backend):
    run = make_run(environment={"cpu_cores": 2, "torch": "2.x"})
    run.config.update(config)
    for w in run.workers:
        if w["role"] == "infer" and precision:
            w["precision"] = precision
    summary = write_run_folder(str(tmp_path), run)
    expected = precision or ("fp16" if config else "fp32")
    assert (summary["precision"], summary["backend"]) == (expected, backend)
    assert json_summary(summary)["precision"] == expected
    assert f"model       {expected}, {backend}" in format_summary(summary)
    assert f"{expected}, {backend}" in (tmp_path / "report.md").read_text()


def test_files_left_out_of_a_folder_are_counted_in_every_output(tmp_path):
    notes = ["7 files that are not images or videos (6 .txt, 1 .yaml) under ."]
    summary = write_run_folder(str(tmp_path), make_run(sources={"skipped": notes, "skipped_files": 7}))
    report = load(tmp_path, "report.json")
    assert report["sources"]["skipped_files"] == summary["skipped_files"] == 7 and report["sources"]["skipped"] == notes
    assert "7 files left out: not images or videos" in format_summary(summary)
    assert f"Left out of the source: {notes[0]}." in (tmp_path / "report.md").read_text()
