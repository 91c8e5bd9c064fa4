"""report.md: the module table's shares add up to 100 % with nested rows marked apart; restarts,
cancelled and lost frames and dropped messages are listed; the stage table has CPU beside wall."""

import json
import re

import pytest

from analysis.markdown import NESTED_MARK, config_line, module_lines, module_table_rows
from analysis.report import build_report, write_run_folder
from analysis.terminal import format_summary
from analysis.trace import trace_events
from tests.analysis_runs import STARTED_S, steady_run
from yolo.module_stats import RESIDUAL_NAME, aggregate

LAYER_MS = [1.0 + 0.1 * i for i in range(25)]  # model.0 .. model.24, per forward
DECODE_MS = 0.8  # Detect.decode, inside model.24
FORWARD_MS = sum(LAYER_MS) + 2.5  # 2.5 ms outside every layer


def yolo_like_module_rows(forwards: int = 3) -> list[dict]:
    """aggregate() of a hand-made export shaped like yolov5n timed by layers: 25 outermost layers,
    Detect.decode nested in model.24, a residual, and NMS timed outside the forward."""
    modules = [{"name": f"model.{i}", "type": "Conv" if i < 24 else "Detect", "params": 10, "outermost": True,
                "in_forward": True, "shapes": {"1x3x64x64": forwards}, "times_ms": [ms] * forwards}
               for i, ms in enumerate(LAYER_MS)]
    modules.append({"name": "Detect.decode", "type": "function", "params": 0, "outermost": False, "in_forward": True,
                    "shapes": {}, "times_ms": [DECODE_MS] * forwards})
    modules.append({"name": "nms", "type": "function", "params": 0, "outermost": True, "in_forward": False,
                    "shapes": {}, "times_ms": [0.3] * forwards})
    export = {"mode": "cpu", "forward_ms": [FORWARD_MS] * forwards, "residual_ms": [2.5] * forwards,
              "modules": modules}
    return [r.as_dict() for r in aggregate([export])]


def share_column(text: str) -> list[tuple[str, str]]:
    """(module cell, share cell) of every row of the module table in ``text``."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| module")]
    return [(cells[0], cells[-1]) for cells in ([c.strip() for c in line.strip("|").split("|")] for line in rows)]


def test_module_table_shares_add_up_to_100_percent():
    rows = yolo_like_module_rows()
    assert sum(r["share"] for r in rows if r["share"] is not None) > 1.0  # the naive sum counts decode twice
    table = module_table_rows(rows)
    assert sum(r["share"] for r in table if r["counted"]) == pytest.approx(1.0)
    cells = share_column("\n".join(module_lines({"modules": rows, "forward": {"forwards": 3}})))
    counted = [float(share) for module, share in cells if share and not share.startswith("(")]
    assert sum(counted) == pytest.approx(100.0, abs=0.5)  # each share is rounded to 0.1
    nested = [(module, share) for module, share in cells if module.startswith(NESTED_MARK)]
    assert nested == [(NESTED_MARK + "Detect.decode", f"({100 * DECODE_MS / FORWARD_MS:.1f})")]
    names = [module for module, _ in cells]
    assert "(10 other outermost modules)" in names and RESIDUAL_NAME in names
    assert names[-1] == "nms" and cells[-1][1] == ""  # timed outside the forward: no share


def incident_run():
    """A steady run in which infer-1 was restarted at 2 s (its new process did the later frames),
    frame 5 was lost, two frames were cancelled by a stop, and infer-0 dropped a message."""
    run = steady_run(frames=100, period_s=0.05, frames_in=103,
                     restarts=[{"name": "infer-1", "incarnation": 1, "signal": "SIGKILL", "exit_code": -9,
                                "t_s": STARTED_S + 2.0, "frames_resent": 1}],
                     cancelled=[{"id": 101, "name": "img101.jpg"}, {"id": 102, "name": "img102.jpg"}],
                     stop={"reason": "interrupted (Ctrl-C)", "signal": "SIGINT"})
    run.frames = [f for f in run.frames if f["id"] != 5]
    run.frames_in = 102
    run.failed = [{"id": 5, "name": "img5.jpg", "stage": "infer", "worker": "infer-1", "reason": "process died",
                   "kind": "lost"}]
    first = next(w for w in run.workers if w["name"] == "infer-1")
    run.workers.append({**first, "incarnation": 1, "pid": 4242})
    next(w for w in run.workers if w["name"] == "infer-0")["dropped_messages"] = {"late ack": 1}
    return run


def test_incidents_are_listed_in_report_json_and_md(tmp_path):
    write_run_folder(str(tmp_path), incident_run())
    report = json.loads((tmp_path / "report.json").read_text())
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["lost"], frames["cancelled"]) == (102, 99, 0, 1,
                                                                                                        2)
    assert frames["accounted"]
    assert report["restarts"][0]["at_s"] == pytest.approx(2.0)
    assert report["dropped_messages"] == {"infer-0": {"late ack": 1}}
    assert report["stages"]["infer"]["workers"] == 2 and report["stages"]["infer"]["processes"] == 3
    text = (tmp_path / "report.md").read_text()
    assert "## Restarts" in text and "| infer-1 | 1 | SIGKILL | -9 | 2.00 | 1 |" in text
    assert "2 frames never started because the run stopped: img101.jpg, img102.jpg." in text
    assert "- infer-0: 1 late ack" in text and "lost in infer on infer-1: process died" in text
    assert "Stopped: interrupted (Ctrl-C) (signal SIGINT)." in text
    assert "infer-1#1" in text  # the restarted process has its own stage row
    assert re.search(r"\| CPU ms mean \|.*\| peak PSS MiB \|", text)


def test_trace_puts_frames_after_a_restart_on_the_new_process():
    run = incident_run()
    spans = [e for e in trace_events(run)["traceEvents"] if e["ph"] == "X" and e["cat"] == "infer"]
    old_pid = next(w["pid"] for w in run.workers if w["name"] == "infer-1" and not w["incarnation"])
    by_frame = {e["args"]["frame"]: e["pid"] for e in spans}
    assert by_frame[3] == old_pid and by_frame[61] == 4242  # frame 61 is read at 3.05 s, after the restart


def test_report_without_incidents_has_no_incident_sections():
    report = build_report(steady_run())
    assert report["restarts"] == [] and report["dropped_messages"] == {} and report["frames"]["cancelled"] == 0


def test_live_streams_are_listed_with_their_drops(tmp_path):
    stream = {"name": "rtsp://camera/1", "item": 0, "grabbed": 330, "kept": 330, "delivered": 318, "dropped": 12,
              "pending": 0, "reconnects": 1}
    sources = {"streams": [stream], "stream_errors": ["rtsp://camera/1: no frame for 5 s (reconnect 1 of 3)"],
               "dropped_at_source": 12}
    summary = write_run_folder(str(tmp_path), steady_run(sources=sources))
    text = (tmp_path / "report.md").read_text()
    assert "## Live streams" in text and "12 frames dropped at the source in all" in text
    assert "| rtsp://camera/1 | 330 | 330 | 318 | 12 | 1 |" in text and "- error: rtsp://camera/1: no frame" in text
    terminal = format_summary(summary)
    assert "source      12 frames dropped at the source" in terminal and "1 stream error: rtsp://camera/1" in terminal
    (tmp_path / "files").mkdir()
    quiet = format_summary(write_run_folder(str(tmp_path / "files"), steady_run()))
    assert "## Live streams" not in (tmp_path / "files" / "report.md").read_text() and "source  " not in quiet


def test_the_config_line_shows_torch_threads_only_where_torch_runs():
    run = steady_run()
    for worker in run.workers:
        if worker["role"] == "pre":
            worker["threads"] = {"opencv": 1}  # preprocess never imports torch
    line = config_line(build_report(run))
    assert "2 pre, 2 infer x 1 torch thread, 2 post x 1 torch thread;" in line and "?" not in line, line
