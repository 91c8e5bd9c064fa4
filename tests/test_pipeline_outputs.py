"""What a run leaves for the tools users already have: an annotated video for a video source,
COCO results that pycocotools evaluates, YOLO label files, named run folders, a JSON summary on
stdout; and sources beyond files: a clip served over http, a .txt list."""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import cv2
import numpy as np
import pytest

import runner
from tests.media import MediaServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIP_FRAMES, CLIP_FPS, CLIP_SIZE = 24, 12.0, (160, 96)  # (w, h)


def run(tmp_path, *flags):
    results = tmp_path / "results"
    code = runner.main(["--results", str(results), "--no-progress", "--log-level", "warning", "--workers", "1",
                        "--infer-workers", "1", *flags])
    return code, results / "latest"


def load(run_dir, name):
    with open(run_dir / name) as f:
        return json.load(f)


def write_clip(path, frames=CLIP_FRAMES):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), CLIP_FPS, CLIP_SIZE)
    for i in range(frames):
        image = np.full((CLIP_SIZE[1], CLIP_SIZE[0], 3), 40 + 6 * i, np.uint8)
        cv2.rectangle(image, (5 + 4 * i, 20), (45 + 4 * i, 70), (0, 0, 255), -1)
        writer.write(image)
    writer.release()


def video_props(path):
    capture = cv2.VideoCapture(str(path))
    try:
        return (int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), capture.get(cv2.CAP_PROP_FPS),
                (int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))))
    finally:
        capture.release()


@pytest.mark.parametrize("stride", [1, 2])
def test_a_video_source_gives_an_annotated_video(tmp_path, stride):
    clip = tmp_path / "clip.mp4"
    write_clip(clip)
    code, run_dir = run(tmp_path, "--source", str(clip), "--imgsz", "128", "--vid-stride", str(stride),
                        "--pre-workers", "2")
    assert code == 0
    frames, fps, size = video_props(run_dir / "videos" / "clip.mp4")
    assert frames == CLIP_FRAMES // stride and size == CLIP_SIZE
    assert fps == pytest.approx(CLIP_FPS / stride, abs=0.01)
    report = load(run_dir, "report.json")
    assert report["sources"]["videos"] == [{"video": "videos/clip.mp4", "frames": CLIP_FRAMES // stride,
                                            "missing": 0, "fps": pytest.approx(CLIP_FPS / stride)}]
    assert not (run_dir / "images").exists()  # a video's frames go into its video, not images/
    assert report["summary"]["videos_saved"] == ["videos/clip.mp4"]
    assert report["summary"]["video_frames_saved"] == CLIP_FRAMES // stride
    assert "Annotated videos: [videos/clip.mp4](videos/clip.mp4)" in (run_dir / "report.md").read_text()


def test_predictions_json_is_evaluated_by_pycocotools(fixtures_dir, tmp_path):
    """Ultralytics' own detections on bus.jpg as the ground truth: the pipeline's COCO results
    must score AP 1.0 at IoU 0.5 against them."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from yolo.coco import category_ids
    from yolo.names import COCO_NAMES
    source = tmp_path / "val"
    source.mkdir()
    shutil.copy(fixtures_dir / "bus.jpg", source / "000000000042.jpg")  # a numeric stem: image_id 42
    code, run_dir = run(tmp_path, "--weights", str(fixtures_dir / "yolov5n.pt"), "--source", str(source),
                        "--frames", "3", "--save-images", "none")  # looped 3 times: each image counts once
    assert code == 0
    predictions = load(run_dir, "predictions.json")
    assert {p["image_id"] for p in predictions} == {42}
    reference = load(fixtures_dir, "expected_bus.json")["bus.jpg@640-rect"]["detections"]  # the runner's default
    ids = category_ids(COCO_NAMES)
    annotations = [{"id": i + 1, "image_id": 42, "category_id": ids[COCO_NAMES.index(name)], "iscrowd": 0,
                    "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)}
                   for i, (x1, y1, x2, y2, _, name) in enumerate(reference)]
    truth = COCO()
    truth.dataset = {"images": [{"id": 42, "width": 810, "height": 1080}], "annotations": annotations,
                     "categories": [{"id": c} for c in sorted(set(ids))]}
    truth.createIndex()
    evaluation = COCOeval(truth, truth.loadRes(str(run_dir / "predictions.json")), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    assert evaluation.stats[1] == pytest.approx(1.0)  # AP at IoU 0.5


def test_label_files_match_the_detections(fixtures_dir, tmp_path):
    source = tmp_path / "imgs"
    source.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(fixtures_dir / name, source / name)
    code, run_dir = run(tmp_path, "--weights", str(fixtures_dir / "yolov5n.pt"), "--source", str(source),
                        "--save-txt", "--save-conf", "--save-images", "none")
    assert code == 0
    detections = load(run_dir, "detections.json")
    for image, (width, height) in (("bus", (810, 1080)), ("zidane", (1280, 720))):
        rows = sorted(tuple(map(float, line.split())) for line in (run_dir / "labels" / f"{image}.txt").read_text().splitlines())
        mine = sorted((d["class_id"], (d["box"][0] + d["box"][2]) / 2 / width, (d["box"][1] + d["box"][3]) / 2 / height,
                       (d["box"][2] - d["box"][0]) / width, (d["box"][3] - d["box"][1]) / height, d["score"])
                      for d in detections if d["image"] == f"{image}.jpg")
        assert len(rows) == len(mine) > 0
        for got, want in zip(rows, mine):
            assert got == pytest.approx(want, abs=1e-4)


def test_a_clip_served_over_http_and_a_txt_list(tmp_path):
    """``python -m http.server``'s handler ignores Range requests: the small clip streams, the
    larger one (which FFmpeg cannot read without seeking) is downloaded first, then removed."""
    served = tmp_path / "served"
    served.mkdir()
    write_clip(served / "clip.mp4")
    big_frames = 100
    writer = cv2.VideoWriter(str(served / "big.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, (320, 240))
    for i in range(big_frames):
        writer.write(np.full((240, 320, 3), 2 * i, np.uint8))
    writer.release()
    cv2.imwrite(str(tmp_path / "still.png"), np.full((60, 80, 3), 90, np.uint8))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        listing = tmp_path / "sources.txt"
        listing.write_text(f"# a list mixing a file and URLs\nstill.png\n{url}/clip.mp4\n{url}/big.mp4\n")
        code, run_dir = run(tmp_path, "--source", str(listing), "--imgsz", "128", "--save-images", "none")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    report = load(run_dir, "report.json")
    assert report["frames"]["in"] == report["frames"]["processed"] == CLIP_FRAMES + big_frames + 1
    assert not any(name.startswith(f"yolo-pipeline-downloads-{os.getpid()}") for name in os.listdir(tempfile.gettempdir()))


def test_named_runs_and_the_json_summary(tmp_path):
    """A taken --name gives name2, as detect.py's exp -> exp2; --exist-ok reuses the folder and
    removes the old run's outputs first, leaving the user's own files."""
    results = tmp_path / "results"
    cmd = [sys.executable, "runner.py", "--results", str(results), "--name", "first", "--frames", "6", "--imgsz", "64",
           "--workers", "1", "--infer-workers", "1", "--json", "--no-progress"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)  # stdout holds exactly one JSON object
    assert summary["exit_code"] == 0 and summary["processed"] == 6 and summary["run_dir"].endswith("first")
    assert (results / "first" / "report.json").is_file() and os.readlink(results / "latest") == "first"
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["run_dir"].endswith("first2"), again.stderr[-2000:]
    assert "first exists: this run goes to" in again.stderr and os.readlink(results / "latest") == "first2"
    (results / "first" / "images" / "old.jpg").write_bytes(b"from the first run")
    (results / "first" / "notes.txt").write_text("the user's")
    reused = subprocess.run(cmd + ["--exist-ok", "--save-images", "none"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert reused.returncode == 0 and json.loads(reused.stdout)["run_dir"].endswith("first")
    assert not (results / "first" / "images").exists() and (results / "first" / "notes.txt").is_file()


def test_crops_and_label_options_of_detect_py(tmp_path, fixtures_dir):
    """--save-crop cuts each detection out of bus.jpg into crops/<class>/, one file per box."""
    code, run_dir = run(tmp_path, "--weights", str(fixtures_dir / "yolov5n.pt"), "--source",
                        str(fixtures_dir / "bus.jpg"), "--save-crop", "--hide-conf", "--line-thickness", "2")
    assert code == 0
    detections = load(run_dir, "detections.json")
    crops = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "crops").rglob("*.jpg"))
    assert len(crops) == len(detections) > 0 and "crops/bus/bus.jpg" in crops and "crops/person/bus2.jpg" in crops
    person = cv2.imread(str(run_dir / "crops" / "person" / "bus.jpg"))
    assert person is not None and person.shape[0] > person.shape[1]  # a standing person: taller than wide
    assert (run_dir / "images" / "bus.jpg").is_file()


def test_duration_ends_a_looping_run_and_counts_only_what_started(tmp_path):
    code, run_dir = run(tmp_path, "--duration", "3", "--imgsz", "64", "--save-images", "none")
    assert code == 0
    report = load(run_dir, "report.json")
    frames = report["frames"]
    assert frames["in"] == frames["processed"] > 0 and frames["cancelled"] == 0 and frames["accounted"]
    assert "duration" in (report["stop"]["reason"] or "")


def test_model_free_run_and_lean_stages(tmp_path):
    code, run_dir = run(tmp_path, "--preset", "none", "--frames", "12", "--imgsz", "128", "--save-images", "none")
    assert code == 0
    report = load(run_dir, "report.json")
    assert report["frames"]["processed"] == 12 and load(run_dir, "detections.json") == []
    loaded = report["environment"]["torch_loaded"]
    assert loaded["pre-0"] is False and loaded["collector"] is False  # OpenCV and numpy only
    assert all(link["bytes_per_frame"] < 4096 for link in report["links"].values())  # pixels go by reference


def test_a_live_stream_runs_for_its_duration_and_names_the_source_as_the_limit(tmp_path):
    """An endless MJPEG stream at 15 fps, far slower than a model-free pipeline: the run ends on
    --duration, accounts for every frame it started, lists the stream with its drops, and names
    the live source, not preprocess, as what limits it."""
    with MediaServer(live_fps=15.0) as server:
        code, run_dir = run(tmp_path, "--source", server.url("/live.mjpg"), "--duration", "4", "--preset", "none",
                            "--imgsz", "64", "--save-images", "none")
    assert code == 0
    report = load(run_dir, "report.json")
    frames = report["frames"]
    assert frames["accounted"] and frames["failed"] == frames["lost"] == 0 and 30 <= frames["processed"] <= 90, frames
    [stream] = report["sources"]["streams"]
    assert stream["name"].endswith("/live.mjpg") and report["sources"]["dropped_at_source"] == stream["dropped"]
    neck = report["bottleneck"]
    assert neck["limit"] == "source" and "live source" in neck["hint"], neck
    assert "## Live streams" in (run_dir / "report.md").read_text()
