"""A reduced JPEG decode (``DecodeOptions(mode="reduced")``): how far the detections move and
how much decode time it saves, image by image.

Detections come from the same model on a full decode and on a reduced one (the factor of
``inputs.imageio.reduction_for``), the reduced boxes mapped back to full-size pixels with
``yolo.boxes.unreduce_boxes``; pairs are matched greedily by IoU (any class, IoU >= 0.5). Per
image it prints: the factor, detections, the largest box shift in pixels (the largest
coordinate difference of a matched pair), the lowest and mean matched IoU, class changes, and
the unmatched detections with their scores. Times are CPU milliseconds (``time.process_time``),
medians over interleaved repeats whose order alternates each round, for the decode alone and
for decode + letterbox, with OpenCV and torch on one thread.

Usage: ``python benchmarks/bench_decode.py [--imgsz 320] [--rect] [--repeats 60] [IMAGE ...]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from yolo.boxes import box_iou, unreduce_boxes  # noqa: E402
from yolo.checkpoint import load_model  # noqa: E402
from yolo.detect import DetectOptions, candidates_for_batch, final_detections  # noqa: E402
from inputs.imageio import DecodeOptions, decode_image  # noqa: E402
from yolo.letterbox import letterbox  # noqa: E402
from yolo.tensors import to_tensor  # noqa: E402

FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
MATCH_IOU = 0.5


def detect(model, data: np.ndarray, decode: DecodeOptions, opts: DetectOptions) -> tuple[torch.Tensor, int]:
    """Tensor[N, 6] detections in full-size pixels, and the reduction used."""
    image, original_shape, factor = decode_image(data, decode, "bench")
    boxed, info = letterbox(image, opts.imgsz, model.max_stride, rect=opts.rect)
    with torch.inference_mode():
        dets = final_detections(candidates_for_batch(model(to_tensor(boxed, "cpu")), opts)[0], info, opts)
    if factor > 1:
        dets = torch.cat((unreduce_boxes(dets[:, :4], factor, original_shape), dets[:, 4:]), 1)
    return dets, factor


def match(full: torch.Tensor, reduced: torch.Tensor) -> list[tuple[int, int, float]]:
    """Greedy one-to-one pairs ``(i, j, iou)`` with IoU >= MATCH_IOU, best first."""
    if len(full) == 0 or len(reduced) == 0:
        return []
    iou = box_iou(full[:, :4], reduced[:, :4])
    pairs, used_i, used_j = [], set(), set()
    for flat in torch.argsort(iou.flatten(), descending=True).tolist():
        i, j = divmod(flat, iou.shape[1])
        if iou[i, j] < MATCH_IOU:
            break
        if i not in used_i and j not in used_j:
            pairs.append((i, j, float(iou[i, j])))
            used_i.add(i)
            used_j.add(j)
    return pairs


def cpu_ms(data: np.ndarray, decodes: dict[str, DecodeOptions], opts: DetectOptions, repeats: int,
           with_letterbox: bool) -> dict[str, float]:
    times = {name: [] for name in decodes}
    names = list(decodes)
    for round_ in range(repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            t0 = time.process_time()
            image = decode_image(data, decodes[name], "bench")[0]
            if with_letterbox:
                letterbox(image, opts.imgsz, 32, rect=opts.rect)
            times[name].append((time.process_time() - t0) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", nargs="*", default=[str(FIXTURES / "bus.jpg"), str(FIXTURES / "zidane.jpg")])
    p.add_argument("--weights", default=str(FIXTURES / "yolov5n.pt"))
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--rect", action="store_true")
    p.add_argument("--repeats", type=int, default=60)
    args = p.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    model = load_model(args.weights)
    opts = DetectOptions(imgsz=args.imgsz, rect=args.rect)
    decodes = {"full": DecodeOptions("full", args.imgsz), "reduced": DecodeOptions("reduced", args.imgsz)}
    print(f"imgsz {args.imgsz} {'rect' if args.rect else 'square'}; CPU ms medians of {args.repeats} interleaved "
          f"repeats; matched at IoU >= {MATCH_IOU}")
    for path in args.images:
        data = np.fromfile(path, np.uint8)
        full, _ = detect(model, data, decodes["full"], opts)
        reduced, factor = detect(model, data, decodes["reduced"], opts)
        pairs = match(full, reduced)
        shift = max((float((full[i, :4] - reduced[j, :4]).abs().max()) for i, j, _ in pairs), default=0.0)
        ious = [iou for _, _, iou in pairs]
        class_changes = sum(int(full[i, 5]) != int(reduced[j, 5]) for i, j, _ in pairs)
        score_change = max((abs(float(full[i, 4] - reduced[j, 4])) for i, j, _ in pairs), default=0.0)
        lost = [f"{float(full[i, 4]):.2f}" for i in range(len(full)) if i not in {i for i, _, _ in pairs}]
        new = [f"{float(reduced[j, 4]):.2f}" for j in range(len(reduced)) if j not in {j for _, j, _ in pairs}]
        decode = cpu_ms(data, decodes, opts, args.repeats, with_letterbox=False)
        both = cpu_ms(data, decodes, opts, args.repeats, with_letterbox=True)
        shape = cv2.imdecode(data, cv2.IMREAD_COLOR).shape
        print(f"\n{Path(path).name} {shape[1]}x{shape[0]}: reduction {factor}")
        print(f"  detections full {len(full)}, reduced {len(reduced)}, matched {len(pairs)}; "
              f"lost (scores) {lost or '-'}, new (scores) {new or '-'}")
        print(f"  max box shift {shift:.1f} px; matched IoU min {min(ious, default=0):.3f} "
              f"mean {statistics.mean(ious) if ious else 0:.3f}; class changes {class_changes}; "
              f"max score change {score_change:.3f}")
        print(f"  decode ms: full {decode['full']:.2f}, reduced {decode['reduced']:.2f} "
              f"({1 - decode['reduced'] / decode['full']:.0%} saved); decode + letterbox ms: full {both['full']:.2f}, "
              f"reduced {both['reduced']:.2f} ({1 - both['reduced'] / both['full']:.0%} saved)")


if __name__ == "__main__":
    main()
