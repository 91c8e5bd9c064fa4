import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from tests.conftest import fixture_path
from tests.media import MediaServer, write_video
from sequential.detect import run_sequential
from yolo.detect import DetectOptions, annotated_name
from inputs.imageio import DecodeOptions
from inputs.sources import plan_frames


@pytest.mark.parametrize("name, cycle, expected", [
    ("bus.jpg", 0, "bus.jpg"),
    ("bus.jpg", 2, "bus_pass2.jpg"),
    ("dir/x.png", 0, "dir/x.png"),
    ("a.bmp", 0, "a.bmp.jpg"),  # does not collide with a.jpg
    ("clip.mp4:000017", 0, "clip.mp4_000017.jpg"),  # one file per video frame
    ("clip.mp4:000017", 1, "clip.mp4_000017_pass1.jpg"),
    ("synthetic/00003.jpg", 0, "synthetic/00003.jpg"),
])
def test_annotated_names_are_unique_per_frame(name, cycle, expected):
    assert annotated_name(name, cycle) == expected


CLI_TIMEOUT_S = 180


def _records_by_box(records):
    return [(r["box"], r["class"]) for r in records]


def _iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def test_reduced_decode_detections_stay_in_full_size_pixels(yolov5n):
    plan = plan_frames(str(fixture_path("bus.jpg")))  # 810 x 1080: decoded at 1/2 for imgsz 320
    opts = DetectOptions(imgsz=320)
    runs = {mode: run_sequential(yolov5n, plan, opts, device=torch.device("cpu"), progress=False,
                                 decode=DecodeOptions(mode, 320)) for mode in ("full", "reduced")}
    full, reduced = (_records_by_box(runs[mode].records) for mode in ("full", "reduced"))
    assert sorted(c for _, c in full) == sorted(c for _, c in reduced)
    assert max(box[2] for box, _ in reduced) > 405  # mapped back past the reduced image's width
    for box, cls in full:  # measured: IoU >= 0.94 for every box (benchmarks/bench_decode.py)
        assert max(_iou(box, other) for other, c in reduced if c == cls) >= 0.85


def test_cli_reads_a_list_with_a_video_a_broken_entry_and_a_live_stream(repo_root, tmp_path):
    cv2.imwrite(str(tmp_path / "a.jpg"), np.full((64, 96, 3), 90, np.uint8))
    write_video(tmp_path / "clip.avi", 5)
    with MediaServer() as server:
        (tmp_path / "list.txt").write_text(f"a.jpg\nclip.avi\nmissing.png\n{server.url('/live.mjpg')}\n")
        done = subprocess.run([sys.executable, "-m", "yolo", "--source", str(tmp_path / "list.txt"), "--frames", "10",
                               "--imgsz", "128", "--threads", "1"], cwd=repo_root, capture_output=True, text=True,
                              timeout=CLI_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    host = server.url("").split("//")[1].replace(":", "_")
    assert "10 frames from 1 image, 1 video, 1 broken, 1 stream" in output
    assert [f"{i}/10 clip.avi:00000{i - 1}" in output for i in range(2, 7)] == [True] * 5
    assert [f"{i}/10 {host}/live.mjpg:00000{i - 7}" in output for i in range(8, 11)] == [True] * 3
    assert "9 frames in" in output and "1 failed" in output and "missing.png: no such file or directory" in output
    assert f"stream {host}/live.mjpg: " in output and " 3 read, " in output
