"""How far two detection files agree (``python -m yolo --save-json`` or a run's
``detections.json``), e.g. fp32 against ``--half``:

    python -m yolo --weights yolov5n.pt --source imgs/ --save-json fp32.json --quiet
    python -m yolo --weights yolov5n.pt --source imgs/ --save-json bf16.json --quiet --half
    python examples/compare_detections.py fp32.json bf16.json

A box of A matches one of B in the same image with the same class and IoU >= 0.5 (each box of
B matched once, A's best scores first); it prints the boxes of each, the matched share of each,
and the largest score difference of a matched pair.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torchvision.ops import box_iou

MATCH_IOU = 0.5


def match(a: list[dict], b: list[dict], iou: float = MATCH_IOU) -> list[tuple[dict, dict]]:
    """The matched (a, b) record pairs, greedily by a's score within each image and class."""
    pairs = []
    for key in sorted({(r["image"], r["class_id"]) for r in a}):
        mine = sorted((r for r in a if (r["image"], r["class_id"]) == key), key=lambda r: -r["score"])
        theirs = [r for r in b if (r["image"], r["class_id"]) == key]
        if not theirs:
            continue
        overlaps = box_iou(torch.tensor([r["box"] for r in mine], dtype=torch.float64),
                           torch.tensor([r["box"] for r in theirs], dtype=torch.float64))  # [len(mine), len(theirs)]
        taken: set[int] = set()
        for i, record in enumerate(mine):
            free = [(overlaps[i, j].item(), j) for j in range(len(theirs)) if j not in taken]
            best = max(free, default=(0.0, -1))
            if best[0] >= iou:
                taken.add(best[1])
                pairs.append((record, theirs[best[1]]))
    return pairs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="detections JSON (the reference, e.g. fp32)")
    p.add_argument("b", help="detections JSON to compare with it")
    args = p.parse_args(argv)
    with open(args.a) as fa, open(args.b) as fb:
        a, b = json.load(fa), json.load(fb)
    pairs = match(a, b)
    diff = max((abs(x["score"] - y["score"]) for x, y in pairs), default=0.0)
    print(f"A {len(a)} boxes, B {len(b)} boxes; matched (same class, IoU >= {MATCH_IOU}) {len(pairs)}: "
          f"{len(pairs) / max(len(a), 1):.1%} of A, {len(pairs) / max(len(b), 1):.1%} of B; "
          f"largest score difference {diff:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
