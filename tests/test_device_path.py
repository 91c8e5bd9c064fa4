"""The device data path (issue 30) against the host path it twins, on CPU tensors here and on
CUDA where there is a GPU (``@pytest.mark.gpu``): the golden detections (bus.jpg and zidane.jpg,
640 and 320, rect and square), each step's twin (decode with its host fallback, letterbox, NMS,
drawing, JPEG encoding, crops) and ``python -m yolo --data-path device``."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from inputs.frames import FrameReadError
from inputs.imageio import DecodeOptions
from inputs.imageio_device import decode_image_device, decode_images_device, exif_orientation
from tests.conftest import fixture_path
from tests.test_detect_bus import _assert_matches
from yolo.crops import crop_box
from yolo.detect import DetectOptions, candidates_for_batch, final_detections
from yolo.draw import class_color, draw_detections
from yolo.draw_device import draw_detections_device
from yolo.jpeg_device import JPEG_QUALITY, crop_box_device, crop_jpegs_device, encode_jpeg_device
from yolo.letterbox import letterbox
from yolo.letterbox_device import download_bgr, letterbox_device, resize_rgb, upload_bgr
from yolo.names import COCO_NAMES
from yolo.nms import select_candidates
from yolo.tensors import chw_batch_to_input, to_tensor

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a GPU (CUDA)")])
DEVICES = ["cpu", CUDA]
GOLDEN = [(name, imgsz, rect) for name in ("bus.jpg", "zidane.jpg") for imgsz in (640, 320) for rect in (True, False)]
MAX_BOX_DIFF_PX = 1.0
MAX_SCORE_DIFF = 0.01
CLI_TIMEOUT_S = 120


def _bytes(name: str) -> np.ndarray:
    return np.fromfile(fixture_path(name), np.uint8)


def _host_detections(model, data: np.ndarray, opts: DetectOptions) -> torch.Tensor:
    boxed, info = letterbox(cv2.imdecode(data, cv2.IMREAD_COLOR), opts.imgsz, model.max_stride, rect=opts.rect)
    with torch.inference_mode():
        return final_detections(candidates_for_batch(model(to_tensor(boxed, "cpu")), opts)[0], info, opts)


def _device_detections(model, data: np.ndarray, opts: DetectOptions, device: str) -> torch.Tensor:
    image = decode_image_device(data, device, DecodeOptions(), "golden").image
    boxed, info = letterbox_device(image, opts.imgsz, model.max_stride, rect=opts.rect)
    with torch.inference_mode():
        prediction = model(chw_batch_to_input(boxed[None], device))
        dets = final_detections(select_candidates(prediction[0], opts.conf_thres).float(), info, opts)
    assert dets.device.type == torch.device(device).type, "expected NMS where the model's output lives"
    return dets.cpu()


@pytest.fixture(scope="module")
def models(yolov5n):
    return {"cpu": yolov5n}


def _model_on(models, yolov5n_path, device: str):
    if device not in models:
        from yolo.checkpoint import load_model

        models[device] = load_model(yolov5n_path, device=device)
    return models[device]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,imgsz,rect", GOLDEN)
def test_golden_detections_match_the_host_path(models, yolov5n_path, device, name, imgsz, rect):
    opts = DetectOptions(imgsz=imgsz, rect=rect)
    data = _bytes(name)
    host = _host_detections(models["cpu"], data, opts)
    dev = _device_detections(_model_on(models, yolov5n_path, device), data, opts, device)
    assert len(host) > 0
    assert sorted(dev[:, 5].tolist()) == sorted(host[:, 5].tolist())
    for row in host:  # each host box's closest device box of its class
        same = dev[dev[:, 5] == row[5]]
        diff = (same[:, :4] - row[:4]).abs().max(dim=1).values
        best = int(diff.argmin())
        assert float(diff[best]) <= MAX_BOX_DIFF_PX, f"{name}@{imgsz}: box {row[:4].tolist()} moved {float(diff[best])} px"
        assert abs(float(same[best, 4] - row[4])) <= MAX_SCORE_DIFF


@pytest.mark.parametrize("variant,rect", [("@640", False), ("@640-rect", True)])
def test_device_path_reproduces_ultralytics_on_bus(yolov5n, variant, rect):
    want = json.loads(fixture_path("expected_bus.json").read_text())[f"bus.jpg{variant}"]["detections"]
    dets = _device_detections(yolov5n, _bytes("bus.jpg"), DetectOptions(imgsz=640, rect=rect), "cpu")
    _assert_matches([(row[:4], row[4], yolov5n.names[int(row[5])]) for row in dets.tolist()], want)


@pytest.mark.parametrize("shape", [(1080, 810), (720, 1280), (1, 1), (33, 700), (640, 640), (100, 50), (1621, 1215)])
@pytest.mark.parametrize("imgsz,rect,scaleup", [(640, True, True), (640, False, True), (320, True, False)])
def test_letterbox_twin_has_the_host_geometry_and_pixels(shape, imgsz, rect, scaleup):
    image = np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8)
    want, want_info = letterbox(image, imgsz, 32, rect=rect, scaleup=scaleup)
    got, info = letterbox_device(upload_bgr(image, "cpu"), imgsz, 32, rect=rect, scaleup=scaleup)
    assert info == want_info
    assert np.array_equal(download_bgr(got), want), "expected OpenCV's INTER_LINEAR bit for bit"


@pytest.mark.parametrize("seed", range(6))
def test_opencv_resize_is_bit_exact_and_bilinear_within_one_level(seed):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (*rng.integers(2, 200, 2), 3), dtype=np.uint8)
    size = tuple(int(v) for v in rng.integers(1, 300, 2))
    want = cv2.resize(image, size[::-1], interpolation=cv2.INTER_LINEAR).astype(int)
    tensor = upload_bgr(image, "cpu")
    assert np.array_equal(download_bgr(resize_rgb(tensor, size)), want)
    bilinear = download_bgr(resize_rgb(tensor, size, "bilinear")).astype(int)
    assert np.abs(bilinear - want).max() <= 1


def test_antialias_differs_from_opencv_on_a_downscale():
    image = cv2.imread(str(fixture_path("bus.jpg")))
    want = cv2.resize(image, (240, 320), interpolation=cv2.INTER_LINEAR).astype(int)
    smooth = download_bgr(resize_rgb(upload_bgr(image, "cpu"), (320, 240), "bilinear", antialias=True)).astype(int)
    assert np.abs(smooth - want).max() > 10
    with pytest.raises(ValueError, match="antialias only with method 'bilinear'"):
        resize_rgb(upload_bgr(image, "cpu"), (320, 240), antialias=True)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_twin_equals_opencv(device):
    data = _bytes("zidane.jpg")
    decoded = decode_image_device(data, device, DecodeOptions(), "zidane.jpg")
    assert (decoded.decoded_on, decoded.reason, decoded.original_shape) == ("device", "", (720, 1280))
    assert decoded.image.device.type == device
    diff = np.abs(download_bgr(decoded.image).astype(int) - cv2.imdecode(data, cv2.IMREAD_COLOR))
    if device == "cpu":
        assert diff.max() == 0, "expected libjpeg-turbo's pixels, as OpenCV's"
    else:
        assert diff.mean() < 2, "expected nvJPEG close to libjpeg-turbo (its IDCT and chroma upsampling are its own)"


def _pil_bytes(fmt: str, **options) -> np.ndarray:
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(fixture_path("zidane.jpg")).resize((64, 36)).save(buffer, fmt, **options)
    return np.frombuffer(buffer.getvalue(), np.uint8)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_decode_twin_applies_exif_orientation_as_opencv(orientation):
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _pil_bytes("JPEG", exif=exif.tobytes(), quality=95)
    assert exif_orientation(data) == orientation
    decoded = decode_image_device(data, "cpu", DecodeOptions(), "exif.jpg")
    assert np.array_equal(download_bgr(decoded.image), cv2.imdecode(data, cv2.IMREAD_COLOR))


def test_a_png_falls_back_to_the_host_decoder_and_says_so():
    data = _pil_bytes("PNG")
    decoded = decode_image_device(data, "cpu", DecodeOptions(), "a.png")
    assert (decoded.decoded_on, decoded.reason) == ("host", "not a JPEG")
    assert np.array_equal(download_bgr(decoded.image), cv2.imdecode(data, cv2.IMREAD_COLOR))


def test_a_jpeg_the_device_decoder_refuses_is_decoded_on_the_host(monkeypatch):
    import inputs.imageio_device as imageio_device

    def refuse(*args, **kwargs):
        raise RuntimeError("decode_jpeg, nvjpeg.cpp:1, progressive JPEG not supported")

    monkeypatch.setattr(imageio_device, "decode_jpeg", refuse)
    results = decode_images_device([_bytes("bus.jpg"), _pil_bytes("JPEG", progressive=True)], "cpu", DecodeOptions(),
                                   ["bus.jpg", "progressive.jpg"])
    assert [r.decoded_on for r in results] == ["host", "host"]
    assert results[1].reason == "device decoder refused it (progressive JPEG not supported)"


def test_undecodable_frames_fail_alone_with_the_host_paths_error():
    good, data = _bytes("bus.jpg"), _bytes("zidane.jpg")
    corrupt, empty = data[:len(data) // 2], np.zeros(0, np.uint8)
    results = decode_images_device([good, corrupt, empty, np.frombuffer(b"junk", np.uint8)], "cpu",
                                   DecodeOptions(), ["good.jpg", "corrupt.jpg", "empty.jpg", "junk.jpg"])
    assert results[0].decoded_on == "device"
    assert [type(r) for r in results[1:]] == [FrameReadError] * 3
    assert str(results[1]) == "cannot decode image: corrupt.jpg"
    assert "empty file" in str(results[2])
    with pytest.raises(FrameReadError, match="over the limit"):
        decode_image_device(good, "cpu", DecodeOptions(max_pixels=1000), "big.jpg")
    with pytest.raises(ValueError, match="expected 'full' on the device data path"):
        decode_image_device(good, "cpu", DecodeOptions(mode="reduced"), "good.jpg")


def _extent(changed: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.nonzero(changed)
    return rows.min(), rows.max(), cols.min(), cols.max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("line_width", [None, 1, 2, 3, 5])
def test_boxes_land_where_the_host_draws_them(device, line_width):
    dets = np.array([[20.4, 30.6, 120.2, 90.0, 0.82, 0.0], [-10.0, 95.0, 60.0, 150.0, 0.5, 5.0]])
    host = draw_detections(np.zeros((160, 200, 3), np.uint8), dets, COCO_NAMES, line_width, hide_labels=True)
    image = torch.zeros((3, 160, 200), dtype=torch.uint8, device=device)
    out = draw_detections_device(image, torch.as_tensor(dets), COCO_NAMES, line_width, hide_labels=True)
    assert out is image
    drawn = download_bgr(image)
    for box in dets:  # each box alone: the extent of what each version changed around it
        x1, y1, x2, y2 = (int(round(v)) for v in box[:4])
        window = (slice(max(y1 - 6, 0), y2 + 7), slice(max(x1 - 6, 0), x2 + 7))
        want, got = _extent(host[window].any(2)), _extent(drawn[window].any(2))
        assert np.abs(np.subtract(want, got)).max() <= 1, f"host extent {want}, device {got}"
    assert tuple(drawn[60, 20]) == class_color(0)


@pytest.mark.parametrize("hide_conf", [False, True])
def test_labels_look_like_the_host_labels(hide_conf):
    image = cv2.imread(str(fixture_path("bus.jpg")))
    dets = np.array([[50.0, 400.0, 240.0, 900.0, 0.87, 0.0], [0.0, 0.0, 300.0, 300.0, 0.5, 5.0]])
    host = draw_detections(image, dets, COCO_NAMES, hide_conf=hide_conf)
    drawn = download_bgr(draw_detections_device(upload_bgr(image, "cpu"), dets, COCO_NAMES, hide_conf=hide_conf))
    host_changed, changed = (np.abs(out.astype(int) - image).max(2) > 0 for out in (host, drawn))
    for window in ((slice(None), slice(None)), (slice(360, 400), slice(50, 250))):  # whole, then one label
        assert _extent(changed[window]) == pytest.approx(_extent(host_changed[window]), abs=2)
    assert np.abs(host.astype(int) - drawn).mean() < 1
    boxes_only = draw_detections_device(upload_bgr(image, "cpu"), dets, COCO_NAMES, hide_labels=True)
    assert not np.array_equal(download_bgr(boxes_only)[360:385, 60:200], drawn[360:385, 60:200])


@pytest.mark.parametrize("device", DEVICES)
def test_jpeg_encoding_round_trip(device):
    image = cv2.imread(str(fixture_path("bus.jpg")))
    data = encode_jpeg_device(upload_bgr(image, device))
    assert isinstance(data, bytes) and data[:3] == b"\xff\xd8\xff"
    back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert back.shape == image.shape and np.abs(back.astype(int) - image).mean() < 2
    host = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1]
    assert 0.5 < len(data) / len(host) < 2, "expected about the host path's quality"
    assert len(encode_jpeg_device(upload_bgr(image, device), quality=50)) < len(data)


def test_crops_are_the_host_crops():
    image = cv2.imread(str(fixture_path("bus.jpg")))
    tensor = upload_bgr(image, "cpu")
    boxes = [[50.0, 400.0, 240.0, 900.0], [-40.0, -40.0, -20.0, -20.0], [700.0, 10.0, 900.0, 100.0]]
    for box in boxes:
        assert np.array_equal(download_bgr(crop_box_device(tensor, box).contiguous()), crop_box(image, box))
    encoded = crop_jpegs_device(tensor, np.array([box + [0.9, 0.0] for box in boxes]))
    assert encoded[1] is None and all(isinstance(e, bytes) for e in (encoded[0], encoded[2]))
    assert cv2.imdecode(np.frombuffer(encoded[0], np.uint8), cv2.IMREAD_COLOR).shape == crop_box(image, boxes[0]).shape


def _run_cli(repo_root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo", *args], cwd=repo_root, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def test_cli_device_data_path_saves_and_says_which_path_ran(repo_root, yolov5n_path, tmp_path):
    source = tmp_path / "images"
    source.mkdir()
    (source / "bus.jpg").write_bytes(fixture_path("bus.jpg").read_bytes())
    (source / "bus.png").write_bytes(cv2.imencode(".png", cv2.imread(str(fixture_path("bus.jpg"))))[1].tobytes())
    out_json, save_dir = tmp_path / "out.json", tmp_path / "annotated"
    done = _run_cli(repo_root, "--weights", str(yolov5n_path), "--source", str(source), "--data-path", "device",
                    "--save-json", str(out_json), "--save-dir", str(save_dir), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "data path device on cpu" in done.stderr and "data path device)" in done.stderr
    assert "1 image files decoded on the host" in done.stderr and "not a JPEG" in done.stderr
    want = json.loads(fixture_path("expected_bus.json").read_text())["bus.jpg@640-rect"]["detections"]
    records = json.loads(out_json.read_text())
    for image in ("bus.jpg", "bus.png"):
        _assert_matches([(r["box"], r["score"], r["class"]) for r in records if r["image"] == image], want)
    for image in ("bus.jpg", "bus.png"):
        drawn = cv2.imread(str(save_dir / image))
        assert drawn is not None and drawn.shape == (1080, 810, 3)
    assert (save_dir / "bus.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


def test_cli_data_path_defaults_and_refusals(caplog):
    from sequential.cli import main, parse_args
    from sequential.device_path import default_data_path

    assert parse_args([]).data_path is None
    assert (default_data_path(torch.device("cpu")), default_data_path(torch.device("cuda", 0))) == ("host", "device")
    caplog.set_level("INFO", logger="yolo")
    assert main(["--data-path", "device", "--decode", "reduced"]) == 2
    assert "expected --decode full with --data-path device" in caplog.text
    caplog.clear()
    assert main(["--source", "synthetic", "--frames", "2", "--imgsz", "160", "--quiet"]) == 0
    assert "data path host on cpu" in caplog.text
    caplog.clear()
    assert main(["--source", "synthetic", "--frames", "2", "--imgsz", "160", "--quiet", "--data-path", "device"]) == 0
    assert "2 frames in" in caplog.text and "data path device)" in caplog.text and "decoded on the host" not in caplog.text


def test_warm_shapes_cover_every_bucket_of_the_common_letterbox_shapes():
    from yolo.tensors import MAX_WARM_FRAME_SHAPES, warm_input_shapes
    sizes = [(1080, 810)] * 3 + [(720, 1280)] * 2 + [(1080, 810)]
    shapes = warm_input_shapes(sizes, 640, 32, True, 8)
    assert shapes == [(rows, 640, 480) for rows in (1, 2, 4, 8)] + [(rows, 384, 640) for rows in (1, 2, 4, 8)]
    assert warm_input_shapes(sizes, 640, 32, False, 3) == [(1, 640, 640), (2, 640, 640), (3, 640, 640)]
    many = [(100 + i, 2000) for i in range(0, 64 * 40, 40)]  # rect: a letterboxed height of its own for most
    assert len({(h, w) for _, h, w in warm_input_shapes(many, 640, 32, True, 1)}) == MAX_WARM_FRAME_SHAPES


@pytest.mark.parametrize("on_device", [False, True])
def test_a_warmed_shape_is_not_a_cold_forward(on_device):
    """What the inference process does before granting credit on a GPU, here on CPU tensors:
    a batch of a warmed shape is measured, not set apart as set-up."""
    from types import SimpleNamespace

    from settings.config import RunConfig
    from workers.detector import Detector
    from analysis.samples import Samples
    args = SimpleNamespace(config=RunConfig(imgsz=64, batch_size=2, module_timing="none"), device="cpu", torch_threads=1)
    detector = Detector(args)
    warmed, seconds, stopped = detector.warm([(1, 64, 64), (2, 64, 64)], on_device=on_device)
    assert (warmed, stopped) == (2, "") and seconds > 0
    image = torch.zeros((3, 64, 64), dtype=torch.uint8) if on_device else np.zeros((3, 64, 64), np.uint8)
    substages = {"to_device": Samples(), "forward": Samples(), "select": Samples()}
    found, cold = detector.candidates([image, image], substages, measured=True)
    assert not cold and len(found) == 2 and substages["forward"].count == 1
    assert isinstance(found[0], torch.Tensor) == on_device
    _, cold = detector.candidates([np.zeros((3, 32, 64), np.uint8)] if not on_device
                                  else [torch.zeros((3, 32, 64), dtype=torch.uint8)], substages, measured=True)
    assert cold


def test_the_report_says_how_busy_each_gpu_was_and_its_memory():
    """From the inference workers' own device figures (sent on CUDA only): two workers on cuda:0
    share it, one on cuda:1; a CPU run has no device row."""
    from analysis.report import inference_of
    from analysis.stages import device_usage
    gib = 2 ** 30

    def worker(device, busy_s, peak, wall_s=10.0):
        return {"wall_s": wall_s, "precision": "fp16", "device_usage": {
            "device": device, "busy_s": busy_s, "memory_peak_bytes": peak, "memory_reserved_peak_bytes": 2 * peak,
            "memory_total_bytes": 80 * gib}}
    workers = [worker("cuda:0", 3.0, gib), worker("cuda:0", 4.0, gib), worker("cuda:1", 12.0, gib, wall_s=8.0)]
    rows = device_usage(workers)
    assert [(r["device"], r["workers"], r["busy"], r["memory_reserved_peak_bytes"]) for r in rows] == [
        ("cuda:0", 2, pytest.approx(0.7), 4 * gib), ("cuda:1", 1, 1.0, 2 * gib)]
    inference = inference_of({"infer": {"per_worker": workers}}, {"devices": ["cuda:0", "cuda:1"],
                                                                  "data_path": "device"}, {})
    assert inference["data_path"] == "device" and inference["devices"] == rows
    assert device_usage([{"wall_s": 1.0, "device_usage": None}]) == []



def test_warming_stops_at_the_first_shape_the_device_has_no_memory_for(monkeypatch):
    from types import SimpleNamespace

    from settings.config import RunConfig
    from workers.detector import Detector
    detector = Detector(SimpleNamespace(config=RunConfig(imgsz=64, batch_size=4, module_timing="none"), device="cpu",
                                        torch_threads=1))
    run_batch = detector.backend.run_batch

    def small_batches_only(images, rows, opts):
        if rows > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return run_batch(images, rows, opts)
    monkeypatch.setattr(detector.backend, "run_batch", small_batches_only)
    warmed, _, stopped = detector.warm([(1, 64, 64), (2, 64, 64), (4, 64, 64), (1, 32, 64)], on_device=False)
    assert warmed == 2 and stopped.startswith("device out of memory running a batch of 4x3x64x64 (CUDA out of memory")
    assert (4, 3, 64, 64) not in detector.shapes_seen and (1, 3, 32, 64) not in detector.shapes_seen


def test_finishing_frames_twice_gives_the_same_outputs_and_leaves_them_undrawn(yolov5n):
    """What a retry after a device out of memory does: crops and drawing from the undrawn frame."""
    from settings.config import RunConfig
    from wire.frame_header import FrameHeader
    from workers.device_frames import Arrived, DeviceFrames
    cfg = RunConfig(imgsz=320, save_crop=True)
    steps = DeviceFrames(torch.device("cpu"), cfg, list(COCO_NAMES))
    header = FrameHeader(id=0, name="bus.jpg", cycle=0, ratio=0.0, pad=(0.0, 0.0), orig_shape=(0, 0), lb_shape=(0, 0),
                         full_shape=(0, 0), reduction=1, keep_image=True, pre="pre-0", release_by="infer")
    frame = steps.prepare([Arrived(0.0, header, [], _bytes("bus.jpg"))], None)[0]
    original = frame.original.clone()
    with torch.inference_mode():
        prediction = yolov5n(chw_batch_to_input(frame.boxed[None], "cpu"))
    candidates = [select_candidates(prediction[0], cfg.conf_thres).float()]
    first, again = steps.finish([frame], candidates, None)[0], steps.finish([frame], candidates, None)[0]
    assert torch.equal(frame.original, original)  # drawn on a copy
    assert len(first.detections) >= 4 and np.array_equal(first.detections, again.detections)
    assert np.array_equal(first.image, again.image) and first.crops == again.crops
    assert len(first.crops) == len(first.detections)
