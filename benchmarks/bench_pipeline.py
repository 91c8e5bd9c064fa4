"""Pipeline vs sequential detector vs the machine's bound, measured side by side in one run.

    python benchmarks/bench_pipeline.py                     # CPU, fixtures' photos, 144 frames
    python benchmarks/bench_pipeline.py --device cuda --batch-size 8

The bound on CPU is cores / (CPU-ms per frame of inference at its best thread count + CPU-ms per
frame of decode, letterbox, NMS, draw and encode). On CUDA the reference is the bare model loop
at the same batch size. Rounds alternate sequential and pipeline so noise hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
sys.path.insert(0, REPO)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default=os.path.join(FIXTURES, "yolov5n.pt"))
    p.add_argument("--images", default=FIXTURES, help="folder of photos copied round-robin into the frame set")
    p.add_argument("--frames", type=int, default=144, help="distinct image files in the frame set (>= 48)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--pipeline-args", default="", help="extra runner.py flags, e.g. '--workers 2'")
    return p.parse_args()


def make_frame_set(images: str, count: int) -> str:
    photos = sorted(f for f in os.listdir(images) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    if not photos:
        raise SystemExit(f"no photos in {images}")
    folder = tempfile.mkdtemp(prefix="bench-frames-")
    for i in range(count):
        name = photos[i % len(photos)]
        shutil.copy(os.path.join(images, name), os.path.join(folder, f"{i:04d}_{name}"))
    return folder


def sequential_fps(args, frames_dir: str, out_dir: str, threads: int | None) -> float:
    cmd = [sys.executable, "-m", "yolo", "--weights", args.weights, "--source", frames_dir, "--rect",
           "--imgsz", str(args.imgsz), "--device", args.device, "--warmup", str(args.warmup), "--quiet",
           "--save-dir", out_dir]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    line = [ln for ln in out.stderr.splitlines() if " fps " in ln][-1]
    return float(line.split(": ")[1].split(" fps")[0])


def pipeline_fps(args, frames_dir: str, results: str) -> dict:
    cmd = [sys.executable, "runner.py", "--weights", args.weights, "--source", frames_dir, "--rect",
           "--imgsz", str(args.imgsz), "--device", args.device, "--batch-size", str(args.batch_size),
           "--warmup", str(args.warmup), "--results", results, "--no-progress", "--save-images", "all",
           *args.pipeline_args.split()]
    subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    with open(os.path.join(results, "latest", "report.json")) as f:
        return json.load(f)


def cpu_ms_per_frame(fn, items, repeats: int = 1) -> float:
    """CPU time (all threads of this process) per call, median over ``repeats`` passes."""
    passes = []
    for _ in range(repeats):
        t0 = time.process_time()
        for item in items:
            fn(item)
        passes.append((time.process_time() - t0) * 1e3 / len(items))
    return statistics.median(passes)


def measure_bound(args, frames_dir: str) -> dict:
    """CPU-ms per frame of each piece of work, in this process, one piece at a time."""
    import cv2
    import torch

    from yolo.checkpoint import load_model
    from yolo.detect import DetectOptions, candidates_for_batch, final_detections
    from yolo.draw import draw_detections
    from yolo.letterbox import letterbox
    from yolo.sources import FrameReader, plan_frames
    from yolo.tensors import to_tensor

    cv2.setNumThreads(1)
    plan = plan_frames(frames_dir)
    refs = [plan.ref(i) for i in range(min(plan.total, 24))]
    reader = FrameReader()
    opts = DetectOptions(imgsz=args.imgsz, rect=True)
    figures = {"decode+letterbox": cpu_ms_per_frame(lambda r: letterbox(reader.read(r), args.imgsz, 32, rect=True),
                                                   refs, 3)}
    images = [reader.read(r) for r in refs]
    boxed = [letterbox(im, args.imgsz, 32, rect=True) for im in images]
    model = load_model(args.weights)
    with torch.inference_mode():
        preds = [candidates_for_batch(model(to_tensor(b, "cpu")), opts)[0] for b, _ in boxed]
    work = list(zip(preds, boxed, images))
    figures["nms"] = cpu_ms_per_frame(lambda w: final_detections(w[0], w[1][1], opts), work, 3)
    dets = [final_detections(p, info, opts) for p, (_, info), _ in work]
    figures["draw+encode"] = cpu_ms_per_frame(
        lambda w: cv2.imencode(".jpg", draw_detections(w[1], w[0], model.names)), list(zip(dets, images)), 3)
    inputs = [to_tensor(b, "cpu") for b, _ in boxed]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            for x in inputs[:3]:
                model(x)
            figures[f"inference@{threads}t"] = cpu_ms_per_frame(model, inputs, 2)
    return figures


def bare_loop_fps(args) -> float:
    """The model alone on the device: batches of the pipeline's size, of bus.jpg's rect shape
    (imgsz x 3/4 imgsz); the pipeline's frames mix shapes, so the ratio is approximate."""
    import torch

    from yolo.checkpoint import load_model
    device = torch.device(args.device)
    model = load_model(args.weights, device=device)
    x = torch.rand(args.batch_size, 3, args.imgsz, args.imgsz * 3 // 4, device=device)
    with torch.inference_mode():
        for _ in range(10):
            model(x)
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 50
        for _ in range(n):
            model(x)
        torch.cuda.synchronize()
    return n * args.batch_size / (time.perf_counter() - t0)


def main() -> None:
    args = parse_args()
    if not os.path.isfile(args.weights):
        raise SystemExit(f"weights not found: {args.weights} (pass --weights)")
    frames_dir = make_frame_set(args.images, args.frames)
    work = tempfile.mkdtemp(prefix="bench-out-")
    cores = os.cpu_count() or 1
    seq, seq1, pipe = [], [], []
    try:
        for r in range(args.rounds):
            seq.append(sequential_fps(args, frames_dir, os.path.join(work, f"seq{r}"), None))
            if args.device == "cpu":
                seq1.append(sequential_fps(args, frames_dir, os.path.join(work, f"seq1t{r}"), 1))
            report = pipeline_fps(args, frames_dir, os.path.join(work, f"pipe{r}"))
            pipe.append(report["throughput"]["fps"])
            print(f"round {r + 1}: sequential {seq[-1]:.2f} fps, pipeline {pipe[-1]:.2f} fps "
                  f"(busiest stage {report['summary']['bottleneck']})", flush=True)
        print(f"\n{args.frames} frames of {args.images}, yolov5n @ {args.imgsz} rect, images saved; {cores} cores")
        print(f"sequential (python -m yolo, torch default threads): {statistics.median(seq):.2f} fps")
        if seq1:
            print(f"sequential (1 torch thread):                       {statistics.median(seq1):.2f} fps")
        print(f"pipeline  (runner.py {args.pipeline_args or 'defaults'}):     {statistics.median(pipe):.2f} fps")
        s = report["stages"]
        print("pipeline stages (last round): " + ", ".join(
            f"{role} {s[role]['workers']}x {s[role]['ms_per_frame']['p50']:.1f} ms/frame "
            f"util {100 * s[role]['utilisation']:.0f}%" for role in ("pre", "infer", "post")))
        ratio_seq = statistics.median(pipe) / statistics.median(seq)
        print(f"\npipeline / sequential: {ratio_seq:.3f} (goal >= 1.10: {'PASS' if ratio_seq >= 1.1 else 'FAIL'})")
        if args.device == "cpu":
            f = measure_bound(args, frames_dir)
            best = min(f["inference@1t"], f["inference@2t"])
            other = f["decode+letterbox"] + f["nms"] + f["draw+encode"]
            bound = cores * 1000 / (best + other)
            print("CPU-ms per frame: " + ", ".join(f"{k} {v:.1f}" for k, v in f.items()))
            print(f"bound: {cores} cores x 1000 / ({best:.1f} + {other:.1f}) = {bound:.2f} fps")
            ratio_bound = statistics.median(pipe) / bound
            print(f"pipeline / bound: {ratio_bound:.3f} (goal >= 0.90: {'PASS' if ratio_bound >= 0.9 else 'FAIL'})")
        else:
            bare = bare_loop_fps(args)
            ratio = statistics.median(pipe) / bare
            print(f"bare model loop (batch {args.batch_size}): {bare:.2f} fps")
            print(f"pipeline / bare loop: {ratio:.3f} (goal >= 0.95: {'PASS' if ratio >= 0.95 else 'FAIL'})")
    finally:
        shutil.rmtree(frames_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
