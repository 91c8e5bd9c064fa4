"""``python -m yolo``: the single-process detector, and the sequential baseline the pipeline
is measured against."""

from __future__ import annotations

import argparse
import logging
import os

import numpy as np
import torch

from yolo.checkpoint import CheckpointError
from sequential.detect import SEQUENTIAL_STAGES, run_sequential, write_json
from sequential.device_path import DATA_PATHS, default_data_path
from yolo.detect import DetectOptions
from yolo.devices import resolve_device
from inputs.downloads import DownloadFolder
from yolo.helpformat import DefaultsHelpFormatter
from inputs.imageio import DEFAULT_MAX_PIXELS, DECODE_MODES, DecodeOptions
from backends.options import BackendOptions
from backends.registry import NAMES as BACKEND_NAMES, check_backend, load_backend
from yolo.precision import choose_precision
from inputs.sources import plan_frames
from inputs.streams import StreamOptions

log = logging.getLogger("yolo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m yolo", description=__doc__, formatter_class=DefaultsHelpFormatter)
    p.add_argument("--weights", default=None, help="YOLOv5 checkpoint (.pt); default: random-weight --preset")
    p.add_argument("--preset", default="yolov5n", help="model built with random weights when --weights is absent")
    p.add_argument("--source", default="synthetic",
                   help="image, video, directory, glob, .txt list, URL, camera index, or 'synthetic'")
    p.add_argument("--vid-stride", type=int, default=1, help="read every N-th frame of videos and streams")
    p.add_argument("--decode", choices=DECODE_MODES, default="full",
                   help="'reduced': decode large JPEGs at 1/2, 1/4 or 1/8 size (boxes are mapped back)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse images with more pixels than this, before decoding them")
    p.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=int, default=640, help="letterbox size (long side in --rect mode)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rect", dest="rect", action="store_const", const=True, default=True,
                       help="pad the short side only to a multiple of the stride, as runner.py")
    shape.add_argument("--square", dest="rect", action="store_const", const=False,
                       help="pad to a fixed imgsz x imgsz square")
    p.add_argument("--conf-thres", "--conf", dest="conf_thres", type=float, default=0.25,
                   help="keep boxes scoring at least this")
    p.add_argument("--iou-thres", "--iou", dest="iou_thres", type=float, default=0.45,
                   help="NMS drops a box overlapping a better one of its class by more than this IoU")
    p.add_argument("--max-det", type=int, default=1000, help="keep at most this many boxes per image")
    p.add_argument("--classes", type=int, nargs="+", default=None, help="keep only these class ids")
    p.add_argument("--agnostic-nms", action="store_true", help="NMS across classes")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, or N for cuda:N")
    p.add_argument("--data-path", choices=DATA_PATHS, default=None,
                   help="'device': decode, letterbox, NMS, drawing and JPEG encoding on --device, only encoded "
                        "bytes back to the host; default: device with --device cuda, host on a CPU")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="torch",
                   help="what runs the forward: torch, or OpenVINO on the CPU (the model converted once, cached)")
    p.add_argument("--half", action="store_true",
                   help="half precision: fp16 on CUDA, bfloat16 on a CPU with AVX512-BF16 or AMX "
                        "(refused on other CPUs, where bf16 runs emulated and much slower than fp32)")
    p.add_argument("--no-fuse", action="store_true", help="keep BatchNorm separate from the convs")
    p.add_argument("--no-channels-last", action="store_true", help="keep NCHW weights (default NHWC)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--frames", type=int, default=None,
                   help="stop after N frames, looping a finite source (a live stream runs until Ctrl-C without it)")
    p.add_argument("--warmup", type=int, default=0, help="frames left out of the timings")
    p.add_argument("--save-dir", default=None, help="save annotated images here (and labels/ with --save-txt)")
    p.add_argument("--save-txt", action="store_true",
                   help="write YOLO label files (class cx cy w h, normalised) to SAVE_DIR/labels/, named as "
                        "Ultralytics' detect.py names them; needs --save-dir")
    p.add_argument("--save-conf", action="store_true", help="with --save-txt: add the score to each label line")
    p.add_argument("--save-json", default=None, help="write detections to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no line per image")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with DownloadFolder() as download_dir:  # a video URL fetched whole lives there until the end
        return detect(args, download_dir)


def detect(args: argparse.Namespace, download_dir: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_save_options(args)
        device = resolve_device(args.device)
        precision = choose_precision(device, args.half)
        opts = DetectOptions(imgsz=args.imgsz, rect=args.rect, conf_thres=args.conf_thres,
                             iou_thres=args.iou_thres, classes=tuple(args.classes) if args.classes else None,
                             agnostic=args.agnostic_nms, max_det=args.max_det)
        decode = DecodeOptions(args.decode, args.imgsz, args.max_pixels)
        data_path = args.data_path or default_data_path(device)
        if data_path == "device" and args.decode != "full":
            raise ValueError(f"--decode {args.decode}: expected --decode full with --data-path device "
                             "(the device decoder has no reduced decode)")
        plan = plan_frames(args.source, args.frames, vid_stride=args.vid_stride,
                           streams=StreamOptions(download_dir=download_dir))
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads: expected >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        model = load_detector(args, device, precision)
    except (ValueError, CheckpointError, RuntimeError) as exc:  # RuntimeError: a backend's own (OpenVinoError)
        log.error("error: %s", exc)
        return 2
    log.info("source %s: %s; data path %s on %s", args.source, plan.summary(), data_path, device)
    result = run_sequential(model, plan, opts, device=device, save_dir=args.save_dir, save_txt=args.save_txt,
                            save_conf=args.save_conf, warmup=args.warmup, progress=not args.quiet, decode=decode,
                            data_path=data_path)
    if args.save_json:
        write_json(args.save_json, result.records)
    print_summary(result, torch.get_num_threads(), model.precision)
    if args.save_dir:
        log.info("annotated images saved to %s", os.path.abspath(args.save_dir))
    return 0


def load_detector(args: argparse.Namespace, device: torch.device, precision: str):
    """The torch model, or the same model converted for OpenVINO (cached on disk), called alike."""
    check_backend(args.backend, device.type)
    options = BackendOptions(args.weights, preset=args.preset, device=str(device), precision=precision,
                             threads=args.threads, fuse=not args.no_fuse, channels_last=not args.no_channels_last)
    return load_backend(args.backend, options).model


def check_save_options(args: argparse.Namespace) -> None:
    if args.save_txt and not args.save_dir:
        raise ValueError("--save-txt: expected --save-dir DIR, the labels go to DIR/labels/")
    if args.save_conf and not args.save_txt:
        raise ValueError("--save-conf: expected --save-txt, the scores are written into the label files")


def print_summary(result, threads: int, precision: str) -> None:
    per_stage = "  ".join(f"{s} {np.mean(result.stage_ms[s]):.1f}" if result.stage_ms[s] else f"{s} -"
                          for s in SEQUENTIAL_STAGES)
    log.info("ms per image: %s", per_stage)
    log.info("%d frames in %.2f s: %.2f fps (torch threads: %d, %s, data path %s); %d failed", result.frames,
             result.wall_s, result.fps, threads, precision, result.data_path, len(result.failed))
    if result.host_decoded:
        log.info("  %d image files decoded on the host (the device decoder refused them), e.g. %s: %s",
                 len(result.host_decoded), result.host_decoded[0]["image"], result.host_decoded[0]["reason"])
    for failure in result.failed:
        log.info("  failed frame %d %s: %s", failure["frame"], failure["image"], failure["reason"])
    for stream in result.streams:
        log.info("  stream %s: %d grabbed, %d kept (vid-stride), %d read, %d dropped (newest frame kept), "
                 "%d reconnects%s", stream.name, stream.grabbed, stream.kept, stream.delivered, stream.dropped,
                 stream.reconnects, f"; {stream.error}" if stream.error else "")
    for stream in result.given_up:
        log.info("  given up: %s", stream)

