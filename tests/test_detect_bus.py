"""End to end on bus.jpg with the official yolov5n.pt: letterbox -> model -> candidates -> NMS
must reproduce Ultralytics' detections (expected_bus.json), in fixed and rect mode, through the
library functions and through ``python -m yolo``; bf16 detections must match fp32's."""

from __future__ import annotations

import json
import subprocess
import sys

import cv2
import pytest
import torch

from tests.conftest import fixture_path
from yolo.checkpoint import load_model
from yolo.detect import DetectOptions, candidates_for_batch, final_detections
from yolo.letterbox import letterbox
from yolo.precision import choose_precision, has_native_bf16, read_cpu_flags
from yolo.tensors import to_tensor

MIN_IOU = 0.99
MAX_SCORE_DIFF = 0.005
# bf16 keeps 8 bits of mantissa in the convolutions: measured on bus.jpg, IoU >= 0.99 and score
# differences <= 0.007 against fp32; the bounds leave room for other CPUs' bf16 kernels.
BF16_MIN_IOU = 0.9
BF16_MAX_SCORE_DIFF = 0.03
CLI_TIMEOUT_S = 120
VARIANTS = {"@640": False, "@640-rect": True}


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(fixture_path("expected_bus.json").read_text())


@pytest.fixture(scope="module")
def bus_path():
    return fixture_path("bus.jpg")


def _iou(a, b) -> float:
    """IoU of two x1y1x2y2 boxes, plain Python."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _assert_matches(got: list[tuple[list[float], float, str]], want: list[list], min_iou: float = MIN_IOU,
                    max_score_diff: float = MAX_SCORE_DIFF) -> None:
    """Greedy one-to-one matching, same class, best IoU first."""
    got_classes = sorted(c for _, _, c in got)
    want_classes = sorted(row[5] for row in want)
    assert got_classes == want_classes, f"classes: expected {want_classes}, got {got_classes}"
    pairs = sorted(((_iou(g[0], w[:4]), gi, wi) for gi, g in enumerate(got) for wi, w in enumerate(want)
                    if g[2] == w[5]), reverse=True)
    used_got, used_want, matched = set(), set(), []
    for iou, gi, wi in pairs:
        if gi not in used_got and wi not in used_want:
            used_got.add(gi)
            used_want.add(wi)
            matched.append((iou, got[gi], want[wi]))
    assert len(matched) == len(want)
    for iou, (box, score, cls), row in matched:
        assert iou >= min_iou, f"{cls} {row[:4]}: best box {box} has IoU {iou:.4f} < {min_iou}"
        assert abs(score - row[4]) <= max_score_diff, f"{cls} {row[:4]}: score {score:.4f}, expected {row[4]}"


def _detect(model, image, rect: bool):
    opts = DetectOptions(imgsz=640, rect=rect)
    boxed, info = letterbox(image, opts.imgsz, model.max_stride, rect=opts.rect)
    x = to_tensor(boxed, "cpu", model.input_dtype)
    with torch.inference_mode():
        prediction = model(x)
    candidates = candidates_for_batch(prediction, opts)[0]
    dets = final_detections(candidates, info, opts)
    return x, dets


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bus_matches_ultralytics(yolov5n, bus_path, expected, variant):
    image = cv2.imread(str(bus_path))
    assert image is not None, f"cannot decode {bus_path}"
    want = expected[f"bus.jpg{variant}"]
    x, dets = _detect(yolov5n, image, VARIANTS[variant])
    assert list(x.shape) == want["input_shape"]
    assert dets.shape[1] == 6
    assert bool((dets[:-1, 4] >= dets[1:, 4]).all()), "expected detections best score first"
    got = [(row[:4], row[4], yolov5n.names[int(row[5])]) for row in dets.tolist()]
    _assert_matches(got, want["detections"])


def test_bf16_matches_fp32(yolov5n_path, bus_path):
    """bf16 emulated on this CPU (the escape hatch), so slow but exact in what it computes."""
    precision = choose_precision("cpu", True, require_native=False)
    bf16 = load_model(yolov5n_path, precision=precision)
    fp32 = load_model(yolov5n_path)
    image = cv2.imread(str(bus_path))
    _, want = _detect(fp32, image, rect=True)
    x, dets = _detect(bf16, image, rect=True)
    assert x.dtype == torch.float32 and dets.dtype == torch.float32
    assert len(want) > 0 and not torch.equal(dets, want), "expected bf16 to change the numbers a little"
    got = [(row[:4], row[4], bf16.names[int(row[5])]) for row in dets.tolist()]
    _assert_matches(got, [row[:5] + [fp32.names[int(row[5])]] for row in want.tolist()],
                    min_iou=BF16_MIN_IOU, max_score_diff=BF16_MAX_SCORE_DIFF)


def _run_cli(repo_root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo", *args], cwd=repo_root, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def test_cli_default_rect_json_and_annotated_image(repo_root, yolov5n_path, bus_path, expected, tmp_path):
    out_json, save_dir = tmp_path / "out.json", tmp_path / "annotated"
    done = _run_cli(repo_root, "--weights", str(yolov5n_path), "--source", str(bus_path),
                    "--save-json", str(out_json), "--save-dir", str(save_dir), "--save-txt", "--save-conf", "--quiet")
    assert done.returncode == 0, done.stderr
    records = json.loads(out_json.read_text())
    assert records, "expected detections in the JSON"
    for r in records:
        assert set(r) == {"image", "frame", "class_id", "class", "score", "box"}
        assert r["image"] == "bus.jpg" and r["frame"] == 0
        assert isinstance(r["class_id"], int) and isinstance(r["class"], str)
        assert 0.0 <= r["score"] <= 1.0 and len(r["box"]) == 4
    assert {r["class"] for r in records if r["class_id"] == 0} == {"person"}
    got = [(r["box"], r["score"], r["class"]) for r in records]
    _assert_matches(got, expected["bus.jpg@640-rect"]["detections"])

    annotated = save_dir / "bus.jpg"
    assert annotated.is_file(), f"no annotated image in {sorted(p.name for p in save_dir.iterdir())}"
    drawn, original = cv2.imread(str(annotated)), cv2.imread(str(bus_path))
    assert drawn is not None and drawn.shape == original.shape
    assert cv2.absdiff(drawn, original).max() > 0, "expected boxes drawn on the saved image"

    h, w = original.shape[:2]
    lines = (save_dir / "labels" / "bus.txt").read_text().splitlines()
    from_labels = sorted([float(v) for v in line.split()] for line in lines)
    from_json = sorted([r["class_id"], (r["box"][0] + r["box"][2]) / 2 / w, (r["box"][1] + r["box"][3]) / 2 / h,
                        (r["box"][2] - r["box"][0]) / w, (r["box"][3] - r["box"][1]) / h, r["score"]] for r in records)
    assert len(from_labels) == len(from_json)
    for got, want in zip(from_labels, from_json):
        assert got == pytest.approx(want, abs=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: --device cuda is valid")
def test_cli_cuda_without_cuda_exits_2(repo_root):
    done = _run_cli(repo_root, "--device", "cuda")
    assert done.returncode == 2
    message = done.stdout + done.stderr
    assert "CUDA is not available" in message
    assert "available devices: cpu" in message


@pytest.mark.skipif(has_native_bf16(read_cpu_flags()), reason="this CPU has native bf16: --half is valid")
def test_cli_half_on_cpu_without_bf16_exits_2(repo_root):
    done = _run_cli(repo_root, "--half", "--frames", "1")
    assert done.returncode == 2
    message = done.stdout + done.stderr
    assert "avx512_bf16" in message and "amx_bf16" in message and "emulated" in message


def test_cli_bad_weights_exits_2(repo_root, tmp_path):
    done = _run_cli(repo_root, "--weights", str(tmp_path / "missing.pt"))
    assert done.returncode == 2
    assert "weights file not found" in done.stdout + done.stderr
