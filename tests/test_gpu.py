"""The CUDA paths end to end on a real GPU: the pipeline and ``python -m yolo`` with
``--device cuda`` reproduce Ultralytics' detections, fp16 stays close to them, batches of mixed
shapes and several inference processes on one GPU lose no frame, and the CUDA-event module times
add up to the forward. All skip without a GPU; ``pytest -m gpu`` runs them (and the other CUDA
tests) alone, as benchmarks/gpu_check.sh does on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT, fixture_path
from tests.test_detect_bus import _assert_matches

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA)")]

RUN_TIMEOUT_S = 300
# fp16 keeps 10 bits of mantissa: bounds as loose as bf16's on the CPU (8 bits), which hold there.
FP16_MIN_IOU = 0.9
FP16_MAX_SCORE_DIFF = 0.03
MODULE_SUM_TOLERANCE = 0.10  # the outermost rows + the residual against the forward's own events


def _runner(tmp_path: Path, *flags: str) -> dict:
    """runner.py ``flags`` to completion; its report.json, the run folder beside it."""
    done = subprocess.run([sys.executable, "runner.py", "--results", str(tmp_path / "results"), "--name", "run",
                           "--no-progress", *flags], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "results" / "run"
    report = json.loads((run_dir / "report.json").read_text())
    report["_dir"] = run_dir
    return report


def _bus_detections(run_dir: Path) -> list[tuple[list[float], float, str]]:
    records = json.loads((run_dir / "detections.json").read_text())
    first = min(r["frame"] for r in records if r["image"] == "bus.jpg")
    return [(r["box"], r["score"], r["class"]) for r in records if r["image"] == "bus.jpg" and r["frame"] == first]


def _infer_workers(report: dict) -> list[dict]:
    return report["stages"]["infer"]["per_worker"]


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(fixture_path("expected_bus.json").read_text())


@pytest.fixture
def photos(tmp_path) -> Path:
    """bus.jpg and zidane.jpg: two letterbox shapes at 640 rect (640x480 and 384x640)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        (folder / name).write_bytes(fixture_path(name).read_bytes())
    return folder


def test_pipeline_on_cuda_reproduces_ultralytics_on_bus(tmp_path, expected):
    report = _runner(tmp_path, "--weights", str(fixture_path("yolov5n.pt")), "--source",
                     str(fixture_path("bus.jpg")), "--frames", "4", "--device", "cuda")
    assert report["summary"]["processed"] == 4 and report["summary"]["failed"] == 0
    workers = _infer_workers(report)
    assert {w["device"] for w in workers} == {"cuda:0"} and {w["precision"] for w in workers} == {"fp32"}
    assert report["forward"]["timing_mode"] == "cuda-events"
    _assert_matches(_bus_detections(report["_dir"]), expected["bus.jpg@640-rect"]["detections"])


def test_pipeline_fp16_batches_of_two_shapes_lose_no_frame(tmp_path, photos, expected):
    report = _runner(tmp_path, "--weights", str(fixture_path("yolov5n.pt")), "--source", str(photos),
                     "--frames", "40", "--device", "cuda", "--half", "--batch-size", "8", "--workers", "2")
    summary = report["summary"]
    assert (summary["processed"], summary["failed"], summary["lost"]) == (40, 0, 0)
    workers = _infer_workers(report)
    assert {w["precision"] for w in workers} == {"fp16"}
    assert sum(w["frames"] for w in workers) == 40 and sum(w["batches"] for w in workers) < 40
    _assert_matches(_bus_detections(report["_dir"]), expected["bus.jpg@640-rect"]["detections"],
                    min_iou=FP16_MIN_IOU, max_score_diff=FP16_MAX_SCORE_DIFF)
    outermost = sum(m["total_ms"] for m in report["modules"] if m["outermost"] and m["share"] is not None)
    assert outermost == pytest.approx(report["forward"]["total_ms"], rel=MODULE_SUM_TOLERANCE)


def test_several_inference_processes_share_one_gpu(tmp_path):
    report = _runner(tmp_path, "--frames", "60", "--device", "cuda", "--infer-workers", "3", "--workers", "2",
                     "--save-images", "none")
    assert report["summary"]["processed"] == 60 and report["summary"]["lost"] == 0
    assert len(_infer_workers(report)) == 3
    assert all(w["device"] == "cuda:0" for w in _infer_workers(report))


def test_python_m_yolo_on_cuda_reproduces_ultralytics(tmp_path, expected):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "yolo", "--weights", str(fixture_path("yolov5n.pt")), "--source",
                           str(fixture_path("bus.jpg")), "--device", "cuda", "--save-json", str(out), "--quiet"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fp32" in done.stderr + done.stdout
    records = json.loads(out.read_text())
    _assert_matches([(r["box"], r["score"], r["class"]) for r in records],
                    expected["bus.jpg@640-rect"]["detections"])


def test_cuda_event_module_times_add_up_to_the_forward():
    from yolo.checkpoint import load_model
    from yolo.timing import instrument

    model = load_model(None, device="cuda", precision="fp16")
    handle = instrument(model, depth=2, mode="cuda-events", warmup_forwards=2)
    x = torch.rand(4, 3, 480, 640, device="cuda", dtype=model.input_dtype)
    with torch.inference_mode():
        for _ in range(10):
            model(x)
    recorder = handle.recorder
    assert len(recorder.forward_ms) == 8
    layers = sum(sum(recorder.times_ms[f"model.{i}"]) for i in range(25))
    residual = sum(recorder.residual_ms)
    assert layers + residual == pytest.approx(sum(recorder.forward_ms), rel=1e-6)
    assert residual <= MODULE_SUM_TOLERANCE * sum(recorder.forward_ms)
