"""The two reference loops the pipeline benchmark runs as commands, beside the real tools.

    python benchmarks/loops.py model --images bus.jpg zidane.jpg --frames 200 [--half] [--rect]
    python benchmarks/loops.py decode --source FOLDER --frames 200 [--processes 0] [--rect]

``model``: the bare model loop, what the model alone can do on the device: the photos are
decoded and letterboxed once, into input tensors on the device, then ``--frames`` frames go
through forward + candidate selection, in batches of ``--batch-size`` copies of one photo, the
photos taken in turn. torch keeps its default thread count, as ``python -m yolo`` does.

``decode``: what the cores can decode and letterbox alone, the work of the pipeline's
preprocess stage (read, decode, letterbox, RGB CHW) and nothing else: one process per core
(``--processes 0``), each on its share of the frames, OpenCV on one thread, as in the pipeline.

Both print ``N frames in S s: F fps`` (their own loop, start-up excluded), as ``python -m yolo``
does; an impossible precision exits 2 with ``error: ...``, as the tools do.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

EXIT_USAGE = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    loops = p.add_subparsers(dest="loop", required=True)
    model = loops.add_parser("model", help="forward + candidate selection on pre-letterboxed tensors")
    model.add_argument("--weights", default=None, help="YOLOv5 checkpoint; default a random-weight yolov5n")
    model.add_argument("--images", nargs="+", required=True, help="photos, decoded and letterboxed once")
    model.add_argument("--device", default="cpu")
    model.add_argument("--half", action="store_true", help="fp16 on CUDA, bf16 on a CPU that has it")
    model.add_argument("--batch-size", type=int, default=1)
    decode = loops.add_parser("decode", help="read + decode + letterbox, one process per core")
    decode.add_argument("--source", required=True, help="the frame set (a folder of images)")
    decode.add_argument("--processes", type=int, default=0, help="0: one per core")
    for loop in (model, decode):
        loop.add_argument("--frames", type=int, required=True, help="frames to process")
        loop.add_argument("--imgsz", type=int, default=640)
        shape = loop.add_mutually_exclusive_group()
        shape.add_argument("--rect", dest="rect", action="store_true", default=True)
        shape.add_argument("--square", dest="rect", action="store_false")
    args = p.parse_args(argv)
    if args.frames < 1:
        p.error(f"--frames: expected >= 1, got {args.frames}")
    if getattr(args, "batch_size", 1) < 1:
        p.error(f"--batch-size: expected >= 1, got {args.batch_size}")
    if getattr(args, "processes", 0) < 0:
        p.error(f"--processes: expected >= 0, got {args.processes}")
    return args


def batch_sizes(frames: int, batch_size: int) -> list[int]:
    """Full batches, then the remainder: exactly ``frames`` frames."""
    sizes = [batch_size] * (frames // batch_size)
    return sizes + [frames % batch_size] if frames % batch_size else sizes


def model_loop(args: argparse.Namespace) -> int:
    import torch

    from yolo.checkpoint import CheckpointError, load_model
    from yolo.detect import DetectOptions, candidates_for_batch
    from yolo.devices import resolve_device
    from inputs.imageio import DecodeOptions, read_image
    from yolo.letterbox import letterbox
    from yolo.precision import choose_precision
    from yolo.tensors import to_tensor

    try:
        device = resolve_device(args.device)
        precision = choose_precision(device, args.half)
        opts = DetectOptions(imgsz=args.imgsz, rect=args.rect)
        model = load_model(args.weights, device=device, precision=precision)
    except (ValueError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    inputs = []
    for path in args.images:
        image = read_image(path, DecodeOptions(imgsz=args.imgsz))[0]
        boxed, _ = letterbox(image, args.imgsz, model.max_stride, rect=args.rect)
        inputs.append(to_tensor([boxed] * args.batch_size, device, model.input_dtype))  # [B, 3, H, W]
    sizes = batch_sizes(args.frames, args.batch_size)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, size in enumerate(sizes):
            candidates_for_batch(model(inputs[i % len(inputs)][:size]), opts)  # copies to the host: a sync
    wall_s = time.perf_counter() - t0
    print(f"{args.frames} frames in {wall_s:.2f} s: {args.frames / wall_s:.2f} fps "
          f"(torch threads: {torch.get_num_threads()}, {model.precision}, batch {args.batch_size}, {device})")
    return 0


def decode_share(job: tuple) -> int:
    """One process's share of the frames, read and prepared as the preprocess stage does; the count."""
    import cv2

    from yolo.letterbox import LETTERBOX_STRIDE, bgr_to_rgb_chw, letterbox
    from inputs.sources import FrameReader

    plan, worker, workers, imgsz, rect = job
    cv2.setNumThreads(1)
    done = 0
    with FrameReader() as reader:
        for frame_id in plan.worker_ids(worker, workers):
            boxed, _ = letterbox(reader.read(plan.ref(frame_id)), imgsz, LETTERBOX_STRIDE, rect=rect)
            bgr_to_rgb_chw(boxed)
            done += 1
    return done


def decode_loop(args: argparse.Namespace) -> int:
    from analysis.machine import usable_cores
    from inputs.sources import plan_frames

    try:
        plan = plan_frames(args.source, args.frames)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    processes = args.processes or usable_cores()
    jobs = [(plan, worker, processes, args.imgsz, args.rect) for worker in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:  # torch-free parent: fork is safe
        t0 = time.perf_counter()
        frames = sum(pool.map(decode_share, jobs, chunksize=1))
        wall_s = time.perf_counter() - t0
    print(f"{frames} frames in {wall_s:.2f} s: {frames / wall_s:.2f} fps ({processes} processes, OpenCV 1 thread each)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return model_loop(args) if args.loop == "model" else decode_loop(args)


if __name__ == "__main__":
    sys.exit(main())
