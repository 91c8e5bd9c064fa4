"""The frame steps outside the model, host path against device path, per frame.

    python benchmarks/bench_device_path.py                      # CPU tensors stand in for the device
    python benchmarks/bench_device_path.py --device cuda        # on a GPU machine
    python benchmarks/bench_device_path.py --rounds 3 --out device_path.json

Steps and their two versions (the device one on ``--device``):

  decode      inputs.imageio.decode_image (OpenCV)     inputs.imageio_device.decode_image_device
  letterbox   yolo.letterbox.letterbox + to_tensor      letterbox_device + chw_batch_to_input, with
              (the model's float input on --device)     the OpenCV-exact resize and with "bilinear"
  draw        yolo.draw.draw_detections                 yolo.draw_device.draw_detections_device
  encode      cv2.imencode, quality 95                  yolo.jpeg_device.encode_jpeg_device

Frames: the fixtures at 0.5x, 1x and 1.5x (resized with INTER_AREA, re-encoded at quality 95),
their detections from yolov5n once. Each step's versions run once per round and frame, the
order rotating each round; figures are medians over rounds of CPU-ms (``time.process_time``:
every thread of the process) and wall ms per frame. On CUDA every step ends with a
synchronize, whose spin-wait counts as CPU time. OpenCV and torch run on ``--threads`` threads
(1 by default, as a pipeline worker).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import cv2
import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
sys.path.insert(0, REPO)

from interleave import rotated  # noqa: E402  (benchmarks/: this script's folder)
from inputs.imageio import DecodeOptions, decode_image  # noqa: E402
from inputs.imageio_device import decode_image_device  # noqa: E402
from yolo.checkpoint import load_model  # noqa: E402
from yolo.detect import DetectOptions, candidates_for_batch, final_detections  # noqa: E402
from yolo.draw import draw_detections  # noqa: E402
from yolo.draw_device import draw_detections_device  # noqa: E402
from yolo.jpeg_device import JPEG_QUALITY, encode_jpeg_device  # noqa: E402
from yolo.letterbox import letterbox  # noqa: E402
from yolo.letterbox_device import letterbox_device, upload_bgr  # noqa: E402
from yolo.names import COCO_NAMES  # noqa: E402
from yolo.tensors import chw_batch_to_input, to_tensor  # noqa: E402

SCALES = (0.5, 1.0, 1.5)
STEPS = ("decode", "letterbox", "draw", "encode")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="where the device path runs: cpu or cuda[:N]")
    p.add_argument("--images", nargs="*", default=[os.path.join(FIXTURES, n) for n in ("bus.jpg", "zidane.jpg")])
    p.add_argument("--scales", type=float, nargs="*", default=list(SCALES))
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--weights", default=os.path.join(FIXTURES, "yolov5n.pt"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2, help="rounds run first and not kept (caches, CUDA set-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    return p.parse_args(argv)


def frames(paths: list[str], scales: list[float]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(label, JPEG bytes, BGR image)`` of each image at each scale."""
    out = []
    for path in paths:
        original = cv2.imread(path)
        for scale in scales:
            image = original if scale == 1 else cv2.resize(original, None, fx=scale, fy=scale,
                                                           interpolation=cv2.INTER_AREA)
            data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1].ravel()
            image = cv2.imdecode(data, cv2.IMREAD_COLOR)
            out.append((f"{os.path.basename(path)}@{scale:g}x {image.shape[1]}x{image.shape[0]}", data, image))
    return out


def variants(data: np.ndarray, image: np.ndarray, dets: torch.Tensor, device: torch.device,
             imgsz: int) -> dict[tuple[str, str], tuple[Callable[[], object], Callable[[object], object]]]:
    """``(step, version) -> (set-up, timed call)``: the set-up's result is the call's argument,
    so copies of the frame to draw on are made outside the timing."""
    names, decode = COCO_NAMES, DecodeOptions()
    tensor = upload_bgr(image, device)
    none = lambda: None  # noqa: E731
    return {
        ("decode", "host"): (none, lambda _: decode_image(data, decode, "bench")),
        ("decode", "device"): (none, lambda _: decode_image_device(data, device, decode, "bench")),
        ("letterbox", "host"): (none, lambda _: to_tensor(letterbox(image, imgsz, 32, rect=True)[0], device)),
        ("letterbox", "device"): (none, lambda _: chw_batch_to_input(
            letterbox_device(tensor, imgsz, 32, rect=True)[0][None], device)),
        ("letterbox", "device-bilinear"): (none, lambda _: chw_batch_to_input(
            letterbox_device(tensor, imgsz, 32, rect=True, method="bilinear")[0][None], device)),
        ("draw", "host"): (image.copy, lambda copy: draw_detections(copy, dets, names, inplace=True)),
        ("draw", "device"): (tensor.clone, lambda copy: draw_detections_device(copy, dets, names)),
        ("encode", "host"): (none, lambda _: cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])),
        ("encode", "device"): (none, lambda _: encode_jpeg_device(tensor)),
    }


def measure(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model = load_model(args.weights, device=device)
    opts = DetectOptions(imgsz=args.imgsz)
    cases = []
    for label, data, image in frames(args.images, args.scales):
        boxed, info = letterbox(image, opts.imgsz, 32, rect=True)
        with torch.inference_mode():
            dets = final_detections(candidates_for_batch(model(to_tensor(boxed, device)), opts)[0], info, opts)
        cases.append((label, variants(data, image, dets, device, args.imgsz)))
    times = {(label, key): ([], []) for label, table in cases for key in table}
    for r in range(args.warmup + args.rounds):
        for label, table in cases:
            for key in rotated(list(table), r):
                setup, call = table[key]
                argument = setup()
                sync()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                call(argument)
                sync()
                if r >= args.warmup:
                    times[label, key][0].append((time.process_time() - cpu0) * 1e3)
                    times[label, key][1].append((time.perf_counter() - wall0) * 1e3)
    return [{"frame": label, "step": step, "version": version, "cpu_ms": statistics.median(cpu),
             "wall_ms": statistics.median(wall), "rounds": len(cpu)}
            for (label, (step, version)), (cpu, wall) in times.items()]


def report(rows: list[dict]) -> None:
    """One line per frame and step: host and device CPU-ms and wall ms, device / host ratios;
    then per frame the four steps summed."""
    by = {(r["frame"], r["step"], r["version"]): r for r in rows}
    print(f"{'frame':<28} {'step':<10} {'version':<16} {'host cpu':>9} {'dev cpu':>8} {'ratio':>6} "
          f"{'host wall':>9} {'dev wall':>8} {'ratio':>6}")
    for frame in dict.fromkeys(r["frame"] for r in rows):
        totals = {"host": [0.0, 0.0], "device": [0.0, 0.0]}
        for r in (r for r in rows if r["frame"] == frame and r["version"] != "host"):
            host = by[frame, r["step"], "host"]
            print(f"{frame:<28} {r['step']:<10} {r['version']:<16} {host['cpu_ms']:9.2f} {r['cpu_ms']:8.2f} "
                  f"{r['cpu_ms'] / host['cpu_ms']:6.2f} {host['wall_ms']:9.2f} {r['wall_ms']:8.2f} "
                  f"{r['wall_ms'] / host['wall_ms']:6.2f}")
            if r["version"] == "device":
                for version, row in (("host", host), ("device", r)):
                    totals[version][0] += row["cpu_ms"]
                    totals[version][1] += row["wall_ms"]
        (hc, hw), (dc, dw) = totals["host"], totals["device"]
        print(f"{frame:<28} {'all four':<10} {'device':<16} {hc:9.2f} {dc:8.2f} {dc / hc:6.2f} {hw:9.2f} {dw:8.2f} "
              f"{dw / hw:6.2f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    rows = measure(args)
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor()
    print(f"device path on {args.device} ({device or platform.machine()}), torch {torch.__version__}, "
          f"OpenCV {cv2.__version__}, {args.threads} thread(s), medians of {args.rounds} rounds; ratio = device / host")
    report(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "threads": args.threads, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
