"""The OpenVINO backend: the project's own model converted once into a disk cache that is
checked, never trusted blindly; fp32 detections equal torch's on the fixtures; per-module times
from OpenVINO's counters under TimedModule's names; the runner and ``python -m yolo`` with
``--backend openvino``; OpenVINO with CUDA refused before anything starts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import cv2
import pytest
import torch

from tests.conftest import REPO_ROOT, fixture_path
from tests.test_detect_bus import BF16_MAX_SCORE_DIFF, BF16_MIN_IOU, _assert_matches
from yolo.detect import DetectOptions, candidates_for_batch, final_detections
from yolo.letterbox import letterbox
from yolo.precision import has_native_bf16, read_cpu_flags
from yolo.tensors import to_tensor

pytest.importorskip("openvino", reason="the openvino package is not installed")
from backends.openvino import OpenVinoModel, converted_model_path  # noqa: E402

FP32_MIN_IOU = 0.99
FP32_MAX_SCORE_DIFF = 1e-3
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module", autouse=True)
def model_cache(tmp_path_factory):
    """One conversion (about 20 s) for the module: every test and child process shares the cache."""
    folder = tmp_path_factory.mktemp("yolo-cache")
    previous = os.environ.get("YOLO_PIPELINE_CACHE")
    os.environ["YOLO_PIPELINE_CACHE"] = str(folder)
    yield folder
    if previous is None:
        del os.environ["YOLO_PIPELINE_CACHE"]
    else:
        os.environ["YOLO_PIPELINE_CACHE"] = previous


@pytest.fixture(scope="module")
def openvino_fp32():
    return OpenVinoModel(str(fixture_path("yolov5n.pt")), threads=1, timing="layers")


def _detections(model, name: str) -> list[tuple[list[float], float, str]]:
    opts = DetectOptions(imgsz=640, rect=True)
    image = cv2.imread(str(fixture_path(name)))
    boxed, info = letterbox(image, opts.imgsz, model.max_stride, rect=True)
    with torch.inference_mode():
        prediction = model(to_tensor(boxed, "cpu", model.input_dtype))
    dets = final_detections(candidates_for_batch(prediction, opts)[0], info, opts)
    return [(row[:4], row[4], model.names[int(row[5])]) for row in dets.tolist()]


def _as_expected(found: list[tuple[list[float], float, str]]) -> list[list]:
    return [[*box, score, name] for box, score, name in found]


@pytest.mark.parametrize("name", ["bus.jpg", "zidane.jpg"])
def test_fp32_detections_equal_torchs(openvino_fp32, yolov5n, name):
    want = _detections(yolov5n, name)
    assert want, f"expected torch to find objects in {name}"
    _assert_matches(_detections(openvino_fp32, name), _as_expected(want), min_iou=FP32_MIN_IOU,
                    max_score_diff=FP32_MAX_SCORE_DIFF)


@pytest.mark.skipif(not has_native_bf16(read_cpu_flags()), reason="this CPU has no native bf16 (avx512_bf16/amx)")
def test_bf16_detections_stay_within_torch_bf16s_tolerance(yolov5n):
    bf16 = OpenVinoModel(str(fixture_path("yolov5n.pt")), precision="bf16", threads=1)
    assert bf16.config["INFERENCE_PRECISION_HINT"] == "bf16"
    _assert_matches(_detections(bf16, "bus.jpg"), _as_expected(_detections(yolov5n, "bus.jpg")),
                    min_iou=BF16_MIN_IOU, max_score_diff=BF16_MAX_SCORE_DIFF)


def test_the_cache_is_reused_and_a_corrupt_entry_is_converted_again(openvino_fp32):
    weights = str(fixture_path("yolov5n.pt"))
    xml, converted = converted_model_path(weights)
    assert xml == openvino_fp32.xml and not converted
    with open(xml.with_suffix(".bin"), "r+b") as f:  # a flipped byte in the weights
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    assert converted_model_path(weights) == (xml, True)
    assert converted_model_path(weights) == (xml, False)
    (xml.parent / "sha256").unlink()  # a save that never finished: no digest
    assert converted_model_path(weights) == (xml, True)


def test_other_weights_or_options_get_their_own_entry():
    a, _ = converted_model_path(None, preset="yolov5n")
    b, _ = converted_model_path(str(fixture_path("yolov5n.pt")))
    assert a.parent != b.parent


def test_counter_times_have_timed_modules_names_and_add_up_to_the_forward(openvino_fp32, yolov5n):
    for _ in range(3):
        _detections(openvino_fp32, "bus.jpg")
    recorder = openvino_fp32.timing.recorder
    assert recorder.mode == "openvino-counters"
    layers = [f"model.{i}" for i in range(25)]
    assert [recorder.infos[n].type for n in layers] == [type(yolov5n.model[i]).__name__ for i in range(25)]
    assert all(len(recorder.times_ms[n]) == len(recorder.forward_ms) for n in layers if n in recorder.times_ms)
    assert sum(recorder.times_ms["model.0"]) > 0 and sum(recorder.times_ms["model.24"]) > 0
    covered = sum(sum(recorder.times_ms.get(n, [])) for n in layers)
    assert covered + sum(recorder.residual_ms) == pytest.approx(sum(recorder.forward_ms), rel=1e-6)


def test_blocks_nest_as_timed_module_nests_them():
    blocks = OpenVinoModel(None, threads=1, timing="blocks")
    infos = blocks.timing.recorder.infos
    assert infos["model.2"].type == "C3" and infos["model.2"].outermost
    assert infos["model.2.cv1"].type == "Conv" and not infos["model.2.cv1"].outermost
    assert blocks.timing.names_of("model.2.m.0.cv1.conv") == ["model.2.m.0.cv1", "model.2.m.0", "model.2"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def test_the_runner_on_openvino_reports_the_backend_and_its_counters(tmp_path):
    done = _run("runner.py", "--backend", "openvino", "--weights", str(fixture_path("yolov5n.pt")), "--source",
                str(fixture_path("bus.jpg")), "--frames", "6", "--results", str(tmp_path), "--name", "run",
                "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["config"]["backend"] == "openvino" and report["summary"]["processed"] == 6
    assert {w["backend"] for w in report["stages"]["infer"]["per_worker"]} == {"openvino"}
    assert report["forward"]["timing_mode"] == "openvino-counters"
    assert {m["name"] for m in report["modules"]} >= {f"model.{i}" for i in range(25)}
    records = json.loads((tmp_path / "run" / "detections.json").read_text())
    first = [(r["box"], r["score"], r["class"]) for r in records if r["frame"] == 0]
    _assert_matches(first, json.loads(fixture_path("expected_bus.json").read_text())["bus.jpg@640-rect"]["detections"])


def test_python_m_yolo_on_openvino_reproduces_ultralytics(tmp_path):
    out = tmp_path / "out.json"
    done = _run("-m", "yolo", "--backend", "openvino", "--weights", str(fixture_path("yolov5n.pt")), "--source",
                str(fixture_path("bus.jpg")), "--save-json", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    _assert_matches([(r["box"], r["score"], r["class"]) for r in records],
                    json.loads(fixture_path("expected_bus.json").read_text())["bus.jpg@640-rect"]["detections"])


def test_a_torch_run_times_openvinos_forward_beside_torchs_for_its_lever(openvino_fp32, tmp_path):
    """The runner's probe at the run's shape (bus.jpg, 1080x810, at --imgsz 160 rect: 160x128),
    threads and precision, from the cached conversion (openvino_fp32 made it): both measured."""
    done = _run("runner.py", "--weights", str(fixture_path("yolov5n.pt")), "--source", str(fixture_path("bus.jpg")),
                "--imgsz", "160", "--frames", "4", "--results", str(tmp_path), "--name", "run", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads((tmp_path / "run" / "report.json").read_text())["machine"]["forward_probe"]
    assert probe["measured"] and probe["backend"] == "openvino", probe
    assert (probe["shape"], probe["threads"], probe["precision"]) == ([1, 3, 160, 128], 1, "fp32")
    assert probe["torch_ms"] > 0 and probe["backend_ms"] > 0 and probe["forwards"] >= 1


def test_no_probe_without_a_cached_conversion_nor_where_the_lever_cannot_apply(tmp_path, monkeypatch):
    from supervisor.forward_probe import probe_forwards
    from settings.config import RunConfig
    from inputs.sources import plan_frames
    plan = plan_frames(str(fixture_path("bus.jpg")), 1)
    cfg = RunConfig(weights=str(fixture_path("yolov5n.pt")), imgsz=160)
    monkeypatch.setenv("YOLO_PIPELINE_CACHE", str(tmp_path))  # an empty cache: nothing converted, nothing timed
    probe = probe_forwards(cfg, plan)
    assert not probe.measured and "no converted model cached" in probe.why and not any(tmp_path.iterdir())
    assert probe_forwards(dataclasses.replace(cfg, backend="openvino"), plan) is None
    assert probe_forwards(dataclasses.replace(cfg, weights="", preset="none"), plan) is None


def test_inference_processes_leave_their_threads_unpinned():
    """Pinned, two one-thread processes shared one core (see openvino_model.PIN_THREADS_NOTE)."""
    assert OpenVinoModel(None, threads=1, pin_threads=False).config["ENABLE_CPU_PINNING"] is False
    assert "ENABLE_CPU_PINNING" not in OpenVinoModel(None, threads=1).config


def test_openvino_on_cuda_is_refused_before_anything_starts(tmp_path):
    done = _run("runner.py", "--backend", "openvino", "--device", "cuda", "--results", str(tmp_path), "--no-progress")
    assert done.returncode == 2
    assert "--backend: openvino runs on the CPU" in done.stderr and not any(tmp_path.iterdir())
    done = _run("-m", "yolo", "--backend", "openvino", "--device", "cuda", "--frames", "1")
    assert done.returncode == 2
