"""Detections in the COCO results format that pycocotools' ``COCO.loadRes`` and ``COCOeval`` read:
``[{"image_id", "category_id", "bbox": [x, y, w, h], "score"}]`` in original-image pixels."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torchvision.ops import box_convert

from yolo.labels import frame_stem
from yolo.names import COCO_NAMES

# COCO's category ids run from 1 to 90; these ten have no annotations in the 2014/2017 sets.
COCO_UNUSED_IDS = frozenset({12, 26, 29, 30, 45, 66, 68, 69, 71, 83})
COCO91_IDS: tuple[int, ...] = tuple(i for i in range(1, 91) if i not in COCO_UNUSED_IDS)  # class index -> id


def category_ids(names: Sequence[str]) -> list[int]:
    """The COCO ``category_id`` of each class index: COCO's 91-id scheme when ``names`` are
    COCO's 80 classes in YOLOv5 order, else the class index itself."""
    if tuple(names) == COCO_NAMES:
        return list(COCO91_IDS)
    return list(range(len(names)))


def image_id(name: str) -> int | str:
    """The COCO ``image_id`` of a frame name: the file stem as an int when it is all digits
    (``"val2017/000000397133.jpg"`` -> ``397133``), else the stem (``"bus.jpg"`` -> ``"bus"``).
    A video frame's stem is its label file's (``"clip.mp4:000017"`` -> ``"clip_17"``, the frame
    counted from 1 as detect.py does), so one frame has one name in both outputs."""
    stem = os.path.basename(frame_stem(name))
    return int(stem) if stem.isascii() and stem.isdigit() else stem


def first_pass(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of each image's first frame only: a looped source sees an image in several
    passes (frames), and an evaluation must count it once. Order is kept."""
    records = list(records)
    first: dict[str, int] = {}
    for r in records:
        first[r["image"]] = min(r["frame"], first.get(r["image"], r["frame"]))
    return [r for r in records if r["frame"] == first[r["image"]]]


def coco_results(records: Iterable[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """COCO results from detection records.

    Args:
        records: ``{"image", "frame", "class_id", "class", "score", "box": [x1, y1, x2, y2]}``
            as :func:`yolo.detect.detection_records` gives them, in original-image pixels.
        names: the model's class names, which decide the category ids (see :func:`category_ids`).

    Returns:
        ``[{"image_id", "category_id", "bbox": [x, y, w, h], "score"}]``, each image once
        (see :func:`first_pass`), boxes rounded to 4 decimals like the records.
    """
    records = first_pass(records)
    if not records:
        return []
    ids = category_ids(names)
    for r in records:
        if not 0 <= r["class_id"] < len(ids):
            raise ValueError(f"record of {r['image']!r}: expected a class_id in [0, {len(ids)}), got {r['class_id']}")
    boxes = box_convert(torch.tensor([r["box"] for r in records], dtype=torch.float64), "xyxy", "xywh")
    return [{"image_id": image_id(r["image"]), "category_id": ids[r["class_id"]],
             "bbox": [round(v, 4) for v in box], "score": r["score"]}
            for r, box in zip(records, boxes.tolist())]
