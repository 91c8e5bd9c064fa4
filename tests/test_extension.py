"""The rooms hold what they promise: from this module alone, without editing any file of the
tree, a stage, a backend and an input kind are registered and run through a real pipeline.

This module is the plugin too: the runner is started with ``YOLO_PIPELINE_PLUGINS`` naming one of
its functions, so the runner and every process it starts (spawned, or forked from the fork
server) call it first. Nothing is registered in the pytest process itself: the other tests see
the tree's own tables."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import fixture_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = "only_people"
BACKEND = "wrapped_torch"
SOLID_SIDE = 96
RUN_TIMEOUT_S = 300


# -- the plugin: a stage after postprocess that keeps only the people ------------------------------
def add_person_filter() -> None:
    from topology.stages import StageKind, register_stage
    register_stage(StageKind(STAGE, "person filter", __name__, uses_torch=False, count=2), after="post")


def keep_people(result: dict) -> dict:
    """A result's detections and COCO predictions, people only (COCO category 1)."""
    result["detections"] = [d for d in result["detections"] if d["class"] == "person"]
    result["predictions"] = [p for p in result["predictions"] or () if p["category_id"] == 1]
    return result


def run(args) -> None:
    """The stage's processes run this module's run(args), as the table entry says."""
    from workers.relay import run_relay
    run_relay(args, keep_people)


# -- the plugin: a backend that wraps torch's, and an input kind of solid grey frames ----------------
def add_backend_and_input_kind() -> None:
    from backends.registry import BackendSpec, register
    from inputs.kinds import InputKind
    from inputs.kinds import register as register_kind
    register(BackendSpec(BACKEND, __name__, devices=("cpu",), engine="Wrapped torch", packages=("torch",)))
    register_kind(InputKind("solid", read=read_solid, numbered_by_item=True,
                            recognise=lambda source: source.startswith("solid:"), plan=plan_solid))


def load(options):
    """The backend's module is this one: torch's backend, loaded and said so in the run's log."""
    from backends import torch_backend
    backend = torch_backend.load(options)
    logging.getLogger(__name__).info("%s backend loaded (%s)", BACKEND, type(backend).__name__)
    return backend


def plan_solid(source: str, planning) -> list:
    """``solid:N``: N frames, each one grey level."""
    from inputs.frames import SourceItem
    return [SourceItem("solid", "", f"solid/{i}.png", 1) for i in range(int(source.partition(":")[2]))]


def read_solid(ref, reader):
    from inputs.frames import Frame
    image = np.full((SOLID_SIDE, SOLID_SIDE, 3), 20 * ref.source_index, np.uint8)
    return Frame(ref, image, image.shape[:2])


# -- the tests -------------------------------------------------------------------------------------
def run_with_plugin(tmp_path, plugin: str, *flags: str) -> tuple[int, dict, str]:
    """(exit code, report.json, stderr) of a runner started with ``plugin`` loaded everywhere."""
    env = {**os.environ, "YOLO_PIPELINE_PLUGINS": plugin, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, os.path.join(REPO, "runner.py"), "--results", str(tmp_path / "results"),
                           "--name", "run", "--no-progress", "--log-level", "warning", *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report_path = tmp_path / "results" / "run" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return done.returncode, report, done.stderr


@pytest.mark.slow
def test_a_stage_registered_by_a_plugin_runs_after_postprocess_with_its_own_processes_and_row(tmp_path):
    bus, weights = fixture_path("bus.jpg"), fixture_path("yolov5n.pt")
    code, report, stderr = run_with_plugin(tmp_path, f"{__name__}:add_person_filter", "--weights", str(weights),
                                           "--source", str(bus), "--frames", "6", "--workers", "1",
                                           "--infer-workers", "1", "--save-images", "none")
    assert code == 0, stderr[-3000:]
    frames = report["frames"]
    assert frames["in"] == frames["processed"] == 6 and frames["accounted"]
    stage = report["stages"][STAGE]
    assert stage["workers"] == 2 and stage["frames"] == 6  # its own processes, its own row
    assert set(report["links"]) == {"pre->infer", "infer->post", f"post->{STAGE}", f"{STAGE}->collector"}
    assert f"queue_post_{STAGE}" in report["stage_latency_ms"] and STAGE in report["stage_latency_ms"]
    run_dir = tmp_path / "results" / "run"
    detections = json.loads((run_dir / "detections.json").read_text())
    expected = json.loads(fixture_path("expected_bus.json").read_text())["bus.jpg@640-rect"]["detections"]
    people = [d for d in expected if d[5] == "person"]
    assert len(people) < len(expected)  # the bus is there to be filtered out
    assert len(detections) == 6 * len(people) and {d["class"] for d in detections} == {"person"}
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert {p["category_id"] for p in predictions} == {1}
    trace = json.loads((run_dir / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {f"{STAGE}-0", f"{STAGE}-1"} <= tracks
    assert "person filter" in (run_dir / "report.md").read_text()


@pytest.mark.slow
def test_a_backend_and_an_input_kind_registered_by_a_plugin_run_a_pipeline(tmp_path):
    code, report, stderr = run_with_plugin(tmp_path, f"{__name__}:add_backend_and_input_kind", "--backend", BACKEND,
                                           "--source", "solid:7", "--imgsz", "128", "--workers", "1",
                                           "--infer-workers", "1", "--save-images", "all", "--log-level", "info")
    assert code == 0, stderr[-3000:]
    frames = report["frames"]
    assert frames["in"] == frames["processed"] == 7 and frames["accounted"]
    assert report["inference"]["backend"].startswith("Wrapped torch ") and report["config"]["backend"] == BACKEND
    run_dir = tmp_path / "results" / "run"
    assert f"{BACKEND} backend loaded" in (run_dir / "run.log").read_text()  # the plugin's load ran inference
    detections = json.loads((run_dir / "detections.json").read_text())
    assert {d["image"] for d in detections} <= {f"solid/{i}.png" for i in range(7)}
    saved = sorted(p.name for p in (run_dir / "images" / "solid").iterdir())
    assert saved == [f"{i}.png" for i in range(7)]  # every frame of the new kind read, drawn and saved
