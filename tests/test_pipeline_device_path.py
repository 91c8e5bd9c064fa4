"""The pipeline's ``--data-path device`` run on CPU tensors (the same torch code as on CUDA): the
frames' pixels decoded, letterboxed, suppressed, drawn and encoded by the inference workers. Its
detections, labels and crops equal the host path's on the fixtures; frames the device decoder
refuses are decoded on the host, and bad files fail with the host path's reasons; a video's
frames are uploaded once and written into the annotated video; a device out of memory halves the
batch, down to one frame, which then fails saying so. The CUDA case of each step is in
tests/test_device_path.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

import runner
from tests.test_pipeline_outputs import CLIP_FRAMES, write_clip, video_props
from process.faults import TEST_CRASH_ENV, TEST_OOM_ENV

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, name: str, *flags: str) -> tuple[int, Path]:
    results = tmp_path / "results"
    code = runner.main(["--results", str(results), "--name", name, "--no-progress", "--log-level", "warning",
                        "--workers", "1", "--infer-workers", "1", *flags])
    return code, results / name


def _load(run_dir: Path, name: str):
    return json.loads((run_dir / name).read_text())


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def mixed_source(fixtures_dir, tmp_path) -> Path:
    """bus and zidane as JPEGs, zidane as a PNG (the device decoder takes JPEGs only), a corrupt
    and an empty .jpg."""
    source = tmp_path / "mixed"
    source.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(fixtures_dir / name, source / name)
    cv2.imwrite(str(source / "zidane_png.png"), cv2.imread(str(fixtures_dir / "zidane.jpg")))
    (source / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all" * 10)
    (source / "empty.jpg").write_bytes(b"")
    return source


def test_device_path_gives_the_host_paths_outputs(fixtures_dir, mixed_source, tmp_path):
    flags = ("--weights", str(fixtures_dir / "yolov5n.pt"), "--source", str(mixed_source), "--save-txt",
             "--save-conf", "--save-crop", "--allow-failures")
    host_code, host = _run(tmp_path, "host", *flags, "--data-path", "host")
    device_code, device = _run(tmp_path, "device", *flags, "--data-path", "device")
    assert host_code == device_code == 0
    host_report, device_report = _load(host, "report.json"), _load(device, "report.json")
    assert host_report["inference"]["data_path"] == "host" and device_report["inference"]["data_path"] == "device"
    assert device_report["summary"]["data_path"] == "device"
    assert "data path device" in (device / "report.md").read_text()
    for report in (host_report, device_report):
        frames = report["frames"]
        assert (frames["in"], frames["processed"], frames["failed"], frames["lost"]) == (5, 3, 2, 0)
        assert frames["accounted"]
    host_failed = sorted((f["name"], f["reason"]) for f in host_report["frames"]["failures"])
    device_failed = sorted((f["name"], f["reason"]) for f in device_report["frames"]["failures"])
    assert [n for n, _ in host_failed] == [n for n, _ in device_failed] == ["corrupt.jpg", "empty.jpg"]
    assert "empty file" in dict(device_failed)["empty.jpg"]
    assert "cannot decode image: corrupt.jpg" in dict(device_failed)["corrupt.jpg"]
    assert "frame 1 (corrupt.jpg) failed: cannot decode" in (device / "run.log").read_text()
    detections = [sorted(json.dumps(d, sort_keys=True) for d in _load(run, "detections.json")) for run in (host, device)]
    assert detections[0] == detections[1] and len(detections[0]) > 10
    assert _files(host / "labels") == _files(device / "labels")
    host_crops, device_crops = _files(host / "crops"), _files(device / "crops")
    assert host_crops.keys() == device_crops.keys() and device_crops
    for name, data in device_crops.items():  # encoded by torchvision or OpenCV at quality 95: the same crop
        mine = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        theirs = cv2.imdecode(np.frombuffer(host_crops[name], np.uint8), cv2.IMREAD_COLOR)
        assert mine.shape == theirs.shape and cv2.absdiff(mine, theirs).mean() < 1.0, name
    assert sorted(_files(host / "images")) == sorted(_files(device / "images")) == [
        "bus.jpg", "zidane.jpg", "zidane_png.png"]
    for name in ("bus.jpg", "zidane_png.png"):  # encoded on the device (JPEG) or on the host (PNG), boxes drawn
        drawn, plain = cv2.imread(str(device / "images" / name)), cv2.imread(str(mixed_source / name))
        assert drawn.shape == plain.shape and (cv2.absdiff(drawn, plain) > 60).any()
    infer = device_report["stages"]["infer"]
    steps = infer["per_worker"][0]["substages_ms"]
    for step in ("decode", "letterbox", "forward", "nms", "draw", "encode"):
        assert steps[step]["count"] > 0, step
    post_steps = device_report["stages"]["post"]["per_worker"][0]["substages_ms"]
    assert post_steps["draw"]["count"] == 0  # drawn by inference: postprocess only writes


@pytest.mark.parametrize("data_path", ["host", "device"])
def test_video_frames_are_written_by_the_collector_with_their_crops(fixtures_dir, tmp_path, data_path):
    """A clip of the bus photo: on the device path its frames are uploaded once; either way the
    collector writes the annotated video, and --save-crop cuts every detection of every frame."""
    clip = tmp_path / "bus.mp4"
    bus = cv2.resize(cv2.imread(str(fixtures_dir / "bus.jpg")), (240, 320))
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (240, 320))
    for _ in range(6):
        writer.write(bus)
    writer.release()
    code, run_dir = _run(tmp_path, data_path, "--weights", str(fixtures_dir / "yolov5n.pt"), "--source", str(clip),
                         "--imgsz", "320", "--data-path", data_path, "--pre-workers", "2", "--save-crop")
    assert code == 0
    frames, _fps, _size = video_props(run_dir / "videos" / "bus.mp4")
    assert frames == 6
    report = _load(run_dir, "report.json")
    assert report["frames"]["processed"] == 6 and report["inference"]["data_path"] == data_path
    detections = _load(run_dir, "detections.json")
    crops = [p for p in (run_dir / "crops").rglob("*.jpg")]
    assert len(detections) >= 6 and len(crops) == len(detections)


def test_device_path_uploads_frames_of_a_clip(tmp_path):
    clip = tmp_path / "clip.mp4"
    write_clip(clip)
    code, run_dir = _run(tmp_path, "video", "--source", str(clip), "--imgsz", "128", "--data-path", "device",
                         "--pre-workers", "2")
    assert code == 0
    frames, _fps, _size = video_props(run_dir / "videos" / "clip.mp4")
    assert frames == CLIP_FRAMES
    report = _load(run_dir, "report.json")
    assert report["frames"]["processed"] == CLIP_FRAMES and report["inference"]["data_path"] == "device"


def test_data_path_choices_and_refusals(tmp_path, caplog):
    code, run_dir = _run(tmp_path, "auto", "--preset", "none", "--frames", "4", "--imgsz", "64")
    assert code == 0 and _load(run_dir, "report.json")["inference"]["data_path"] == "host"  # auto on a CPU
    assert _run(tmp_path, "reduced", "--data-path", "device", "--decode", "reduced")[0] == 2
    assert "--decode: expected 'full' with data_path device" in caplog.text
    pytest.importorskip("openvino")
    assert _run(tmp_path, "ov", "--data-path", "device", "--backend", "openvino")[0] == 2
    assert "device needs a backend that takes device tensors (torch), got backend 'openvino'" in caplog.text


@pytest.mark.parametrize("limit, processed", [(1, 12), (0, 0)])
def test_a_device_out_of_memory_halves_the_batch_then_fails_the_frame(live, limit, processed):
    """The device runs out of memory on batches over ``limit`` frames: batches of 4 run as 1+1+1+1
    and every frame is processed; with no frame fitting, each fails saying so and nothing is lost."""
    run = live("--preset", "none", "--frames", "12", "--imgsz", "64", "--workers", "1", "--infer-workers", "1",
               "--batch-size", "4", "--max-wait-ms", "200", "--data-path", "device", "--no-progress",
               "--allow-failures", env={TEST_OOM_ENV: str(limit)})
    assert run.wait() == 0
    frames = run.report()["frames"]
    assert (frames["processed"], frames["failed"], frames["lost"]) == (processed, 12 - processed, 0)
    infer = run.report()["stages"]["infer"]["per_worker"][0]
    assert infer["messages_out"] == processed  # each frame sent on once: none twice after a halving
    assert "device out of memory running a batch of" in run.log()
    assert "a smaller --batch-size (now 4) avoids this" in run.log()
    if not processed:
        reasons = {f["reason"] for f in run.report()["frames"]["failures"]}
        assert all(r.startswith("device out of memory running a batch of 1 frames") for r in reasons), reasons


def test_a_file_that_kills_the_device_decoder_twice_fails_alone(live, fixtures_dir, tmp_path):
    """infer-0 dies decoding c_poison.jpg (as nvJPEG might on a bad file); it is sent again to the
    next incarnation, which dies on it too, and the one after fails it with the reason instead of
    decoding it. The other frames are processed. (Frames received together are decoded together,
    a suspect alone: test_suspects_are_decoded_alone.)"""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg", "c_poison.jpg", "d.jpg", "e.jpg"):
        shutil.copy(fixtures_dir / "zidane.jpg", folder / name)
    run = live("--preset", "none", "--source", str(folder), "--imgsz", "64", "--workers", "1", "--infer-workers",
               "1", "--batch-size", "4", "--max-wait-ms", "500", "--data-path", "device", "--no-progress",
               env={TEST_CRASH_ENV: "infer:poison"})
    assert run.wait() == 3, run.stderr()
    report = run.report()
    assert (report["frames"]["processed"], report["frames"]["failed"], report["frames"]["lost"]) == (4, 1, 0)
    (failure,) = report["frames"]["failures"]
    assert failure["name"] == "c_poison.jpg" and failure["reason"].startswith("infer-0 died twice holding it")
    assert [r["name"] for r in report["restarts"]] == ["infer-0", "infer-0"]
    run.assert_clean()


def test_suspects_are_decoded_alone():
    from types import SimpleNamespace

    from workers.inference import decode_groups
    arrived = [SimpleNamespace(header=SimpleNamespace(id=i)) for i in range(5)]
    groups = decode_groups(arrived, {1: None, 3: None})
    assert [[a.header.id for a in g] for g in groups] == [[1], [3], [0, 2, 4]]
    assert [[a.header.id for a in g] for g in decode_groups(arrived[:2], {})] == [[0, 1]]
    assert decode_groups([], {7: None}) == []
