"""What the model alone does per second on its device: the ceiling the pipeline is held to.

    python benchmarks/model_rates.py --device cuda --batch-sizes 1,8,32 --precisions fp16,fp32
    python benchmarks/model_rates.py --device cpu --batch-sizes 1 --precisions fp32 --forwards 5   # dry run

Inputs are letterboxed once (a photo from --images, else a grey frame) and put on the device
before anything is timed; every variant (precision x batch size x cuDNN autotuning) then runs
--forwards forwards per round, the variants of a round in a rotating order, for --rounds
rounds. On CUDA a round is timed with CUDA events around the whole loop (one wait per round,
as a busy GPU queue would run it); on the CPU with perf_counter. Two loops are timed per
variant: ``forward`` (the model alone) and ``select`` (forward plus the candidate selection
and the copy to the host that the pipeline's inference stage does per batch, a sync each).

Prints one row per variant (median fps over rounds, ms per batch) and, with --out, the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from interleave import rotated  # noqa: E402  (benchmarks/: this script's folder)

EXIT_USAGE = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default=None, help="YOLOv5 checkpoint; default a random-weight yolov5n")
    p.add_argument("--images", nargs="*", default=[], help="a photo to letterbox (the first is used)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--precisions", default="fp16,fp32", help="fp32, and fp16 on CUDA or bf16 on a CPU that has it")
    p.add_argument("--cudnn-benchmark", choices=("off", "on", "both"), default="both",
                   help="cuDNN autotuning (torch.backends.cudnn.benchmark) per variant; CUDA only")
    p.add_argument("--imgsz", type=int, default=640)
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rect", dest="rect", action="store_true", default=True)
    shape.add_argument("--square", dest="rect", action="store_false")
    p.add_argument("--forwards", type=int, default=40, help="timed forwards per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the figures to this JSON file")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        p.error(f"--batch-sizes: expected whole numbers separated by commas, got {args.batch_sizes!r}")
    args.precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    if min(args.batch_sizes) < 1 or args.forwards < 1 or args.rounds < 1:
        p.error("--batch-sizes, --forwards and --rounds: expected >= 1")
    return args


def letterboxed_input(args: argparse.Namespace):
    """uint8 BGR HxWx3 letterboxed as the pipeline's preprocess would."""
    import numpy as np

    from inputs.imageio import DecodeOptions, read_image
    from yolo.letterbox import LETTERBOX_STRIDE, letterbox

    image = read_image(args.images[0], DecodeOptions(imgsz=args.imgsz))[0] if args.images else \
        np.full((1080, 810, 3), 114, np.uint8)
    boxed, _ = letterbox(image, args.imgsz, LETTERBOX_STRIDE, rect=args.rect)
    return boxed


class Timer:
    """CUDA events on a GPU (read once per loop), perf_counter on the CPU."""

    def __init__(self, device):
        import torch
        self.torch, self.cuda = torch, device.type == "cuda"

    def __call__(self, loop) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            loop()
            return (time.perf_counter() - t0) * 1e3
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        self.torch.cuda.synchronize()
        start.record()
        loop()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def measure(args: argparse.Namespace) -> dict:
    import torch

    from yolo.checkpoint import load_model
    from yolo.detect import DetectOptions, candidates_for_batch
    from yolo.devices import resolve_device
    from yolo.tensors import to_tensor

    device = resolve_device(args.device)
    models = {p: load_model(args.weights, device=device, precision=p) for p in args.precisions}
    boxed = letterboxed_input(args)
    inputs = {(p, b): to_tensor([boxed] * b, device, models[p].input_dtype) for p in models for b in args.batch_sizes}
    tunings = {"off": [False], "on": [True], "both": [False, True]}[args.cudnn_benchmark] if device.type == "cuda" \
        else [False]
    variants = [(p, b, t) for p in args.precisions for b in args.batch_sizes for t in tunings]
    opts = DetectOptions(imgsz=args.imgsz, rect=args.rect)
    timer = Timer(device)
    samples = {v: {"forward": [], "select": []} for v in variants}

    def loops(variant):
        precision, batch, tuned = variant
        model, x = models[precision], inputs[(precision, batch)]

        def forward():
            for _ in range(args.forwards):
                model(x)

        def select():
            for _ in range(args.forwards):
                candidates_for_batch(model(x), opts)
        return forward, select

    with torch.inference_mode():
        for variant in variants:  # untimed: cuDNN plans, autotuning, allocator pools
            torch.backends.cudnn.benchmark = variant[2]
            for loop in loops(variant):
                loop()
        for r in range(args.rounds):
            for variant in rotated(variants, r):
                torch.backends.cudnn.benchmark = variant[2]
                forward, select = loops(variant)
                samples[variant]["forward"].append(timer(forward) / args.forwards)
                samples[variant]["select"].append(timer(select) / args.forwards)
    rows = []
    for (precision, batch, tuned), got in samples.items():
        row = {"precision": precision, "batch": batch, "cudnn_benchmark": tuned}
        for loop, ms in got.items():
            row[f"{loop}_ms_per_batch"] = statistics.median(ms)
            row[f"{loop}_fps"] = batch * 1e3 / statistics.median(ms)
            row[f"{loop}_fps_rounds"] = [batch * 1e3 / m for m in ms]
        rows.append(row)
    shape = tuple(inputs[(args.precisions[0], 1 if 1 in args.batch_sizes else args.batch_sizes[0])].shape[2:])
    return {"device": str(device), "input_hw": list(shape), "forwards_per_round": args.forwards,
            "rounds": args.rounds, "timer": "cuda events" if device.type == "cuda" else "perf_counter",
            "torch_threads": torch.get_num_threads(), "rows": rows}


def print_rows(result: dict) -> None:
    print(f"bare model loop on {result['device']}, input {result['input_hw'][0]}x{result['input_hw'][1]}, "
          f"{result['forwards_per_round']} forwards x {result['rounds']} rounds, {result['timer']}")
    print(f"{'precision':>9} {'batch':>5} {'cudnn.bm':>8} {'forward fps':>12} {'ms/batch':>9} {'+select fps':>12}")
    for row in result["rows"]:
        print(f"{row['precision']:>9} {row['batch']:>5} {str(row['cudnn_benchmark']):>8} {row['forward_fps']:>12.1f} "
              f"{row['forward_ms_per_batch']:>9.2f} {row['select_fps']:>12.1f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = measure(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print_rows(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
