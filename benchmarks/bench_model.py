"""What instrumentation and the Detect decode variant cost, measured side by side in one run.

Every variant is a separate copy of the same model, and the variants run round-robin (the
order rotating each round), so machine noise hits all of them alike. Reported figures are
medians in milliseconds; ratios are medians over rounds of the per-round ratio. The final block
compares them to their goals:

- per-leaf instrumentation (``instrument(model, leaves=True)``) / plain forward      <= 1.05
- depth-2 instrumentation: sum of the model.0 .. model.24 totals vs the forward's own
  recorded time                                                                      within 10%
- out-of-place / in-place Detect, whole forward                                      <= 1.02
- out-of-place / in-place decode alone (``decode_outplace`` / ``decode_inplace`` on
  head maps captured from a real forward, 10 calls per round)                        <= 1.25

Usage: ``python benchmarks/bench_model.py [--rect | --square] [--weights PATH] ...``
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from yolo.checkpoint import load_model  # noqa: E402
from yolo.devices import resolve_device  # noqa: E402
from yolo.letterbox import letterbox_shape  # noqa: E402
from yolo.layers import decode_inplace, decode_outplace  # noqa: E402
from yolo.model import YOLOv5  # noqa: E402
from yolo.timing import instrument  # noqa: E402

from interleave import paired_ratio, round_robin  # noqa: E402  (benchmarks/: this script's folder)

DEFAULT_WEIGHTS = REPO_ROOT.parent / "shared" / "fixtures" / "yolov5n.pt"
RECT_SOURCE_HW = (1080, 810)  # bus.jpg's shape: a 640x480 input in --rect mode
LEAVES_GOAL = 1.05
DEPTH2_COVERAGE_GOAL = 0.10
FORWARD_INPLACE_GOAL = 1.02
DECODE_INPLACE_GOAL = 1.25
DECODE_REPEATS = 10  # decode calls per round: one call (~1 ms) is close to the timer's noise


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default=str(DEFAULT_WEIGHTS) if DEFAULT_WEIGHTS.is_file() else None,
                   help="YOLOv5 checkpoint; default ../shared/fixtures/yolov5n.pt, else random yolov5n")
    p.add_argument("--imgsz", type=int, default=640, help="input size (long side with --rect)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rect", dest="rect", action="store_true",
                       help=f"rect input, as letterbox gives for a {RECT_SOURCE_HW[0]}x{RECT_SOURCE_HW[1]} image")
    shape.add_argument("--square", dest="rect", action="store_false", help="imgsz x imgsz input (default)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--forwards", type=int, default=30, help="measured rounds per variant")
    p.add_argument("--warmup", type=int, default=5, help="rounds run first and not measured")
    return p.parse_args(argv)


def capture_head_maps(model: YOLOv5, x: torch.Tensor):
    """The Detect head's reshaped conv outputs for ``x``, with their grids: decode inputs."""
    detect = model.detect
    captured = []
    hook = detect.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    try:
        model(x)
    finally:
        hook.remove()
    maps = []
    for conv, xi in zip(detect.m, captured[0]):
        y = conv(xi)
        b, _, ny, nx = y.shape
        maps.append(y.view(b, detect.na, detect.no, ny, nx))  # [B, na, no, ny, nx]
    return maps, detect._grids(maps)


def iqr(t: np.ndarray) -> str:
    q1, q3 = np.percentile(t, [25, 75])
    return f"[{q1:.2f} .. {q3:.2f}]"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.weights is None:
        print("note: no --weights and ../shared/fixtures/yolov5n.pt not found: random-weight yolov5n "
              "(timings valid, detections meaningless)")
    base = load_model(args.weights, device=device)
    stride = base.max_stride
    h, w = letterbox_shape(RECT_SOURCE_HW, args.imgsz, stride, rect=True) if args.rect else (args.imgsz, args.imgsz)
    torch.manual_seed(0)
    x = torch.rand(args.batch, 3, h, w, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    plain = base.set_inplace(True)
    leaves_model = copy.deepcopy(plain)
    leaves = instrument(leaves_model, leaves=True, warmup_forwards=args.warmup)
    depth2_model = copy.deepcopy(plain)
    depth2 = instrument(depth2_model, depth=2, warmup_forwards=args.warmup)
    outplace = copy.deepcopy(plain).set_inplace(False)
    with torch.inference_mode():
        maps, grids = capture_head_maps(plain, x)

    variants = {
        "plain": lambda: plain(x),
        "leaves": lambda: leaves_model(x),
        "depth2": lambda: depth2_model(x),
        "outplace": lambda: outplace(x),
        "decode_inplace": lambda: [decode_inplace(maps, *grids) for _ in range(DECODE_REPEATS)],
        "decode_outplace": lambda: [decode_outplace(maps, *grids) for _ in range(DECODE_REPEATS)],
    }
    with torch.inference_mode():
        t = round_robin(variants, args.forwards, args.warmup, sync)
    for name in ("decode_inplace", "decode_outplace"):
        t[name] = t[name] / DECODE_REPEATS  # per call
    med = {n: float(np.median(v)) for n, v in t.items()}

    rows = {r.name: r for r in depth2.recorder.summary()}
    layers = [f"model.{i}" for i in range(len(depth2_model.model))]
    layer_sum_ms = sum(rows[n].total_ms for n in layers if n in rows)
    forward_own_ms = float(np.sum(depth2.recorder.forward_ms))
    coverage = layer_sum_ms / forward_own_ms if forward_own_ms > 0 else float("nan")
    leaf_count = len([r for r in leaves.recorder.summary() if r.type not in ("residual", "function")])

    ratio_leaves = paired_ratio(t["leaves"], t["plain"])
    ratio_forward = paired_ratio(t["outplace"], t["plain"])
    ratio_decode = paired_ratio(t["decode_outplace"], t["decode_inplace"])

    source = args.weights if args.weights else "random yolov5n"
    print(f"model {source}; input {args.batch}x3x{h}x{w} ({'rect' if args.rect else 'square'}); "
          f"device {device}; torch threads {torch.get_num_threads()}; "
          f"{args.forwards} rounds after {args.warmup} warm-up, variants interleaved round-robin")
    print(f"{'variant':44s} {'median ms':>10s}  interquartile ms")
    labels = {
        "plain": "plain forward (in-place Detect)",
        "leaves": f"instrumented, {leaf_count} leaf modules",
        "depth2": "instrumented, depth 2 (model.0 .. model.24)",
        "outplace": "plain forward, out-of-place Detect",
        "decode_inplace": f"decode_inplace alone (mean of {DECODE_REPEATS} calls)",
        "decode_outplace": f"decode_outplace alone (mean of {DECODE_REPEATS} calls)",
    }
    for name, label in labels.items():
        print(f"{label:44s} {med[name]:10.2f}  {iqr(t[name])}")
    print(f"depth 2: sum of layer totals {layer_sum_ms:.1f} ms over the recorded forwards' own "
          f"{forward_own_ms:.1f} ms; residual (outside timed layers) "
          f"{rows['(outside timed modules)'].total_ms:.1f} ms")
    print()
    print(f"leaves instrumented / plain: {ratio_leaves:.3f} (goal <= {LEAVES_GOAL}, {verdict(ratio_leaves <= LEAVES_GOAL)})")
    print(f"depth-2 layer sum / forward: {coverage:.3f} (goal within {DEPTH2_COVERAGE_GOAL:.0%} of 1, "
          f"{verdict(abs(coverage - 1) <= DEPTH2_COVERAGE_GOAL)})")
    print(f"out-of-place / in-place forward: {ratio_forward:.3f} (goal <= {FORWARD_INPLACE_GOAL}, "
          f"{verdict(ratio_forward <= FORWARD_INPLACE_GOAL)})")
    print(f"out-of-place / in-place decode: {ratio_decode:.3f} (goal <= {DECODE_INPLACE_GOAL}, "
          f"{verdict(ratio_decode <= DECODE_INPLACE_GOAL)})")
    leaves.remove()
    depth2.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
