"""The detection steps the single-process detector (sequential/) and the pipeline's stages share:
the options, candidate rows of a batch, final detections in original pixels, their records, and
the annotated image's name."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import cv2
import numpy as np
import torch

from yolo.boxes import scale_boxes, unreduce_boxes
from yolo.letterbox import LetterboxInfo
from yolo.nms import nms_candidates, select_candidates
from yolo.timing import timed


@dataclass(frozen=True)
class DetectOptions:
    """What decides which boxes come out; validated once, where the options enter."""

    imgsz: int = 640
    rect: bool = True  # minimal padding, as the pipeline's default
    conf_thres: float = 0.25
    iou_thres: float = 0.45
    classes: tuple[int, ...] | None = None
    agnostic: bool = False
    max_det: int = 1000

    def __post_init__(self) -> None:
        if self.imgsz <= 0 or self.imgsz % 32:
            raise ValueError(f"imgsz: expected a positive multiple of 32, got {self.imgsz}")
        for name in ("conf_thres", "iou_thres"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: expected a value in [0, 1], got {value}")
        if self.max_det <= 0:
            raise ValueError(f"max_det: expected > 0, got {self.max_det}")
        if self.classes is not None and any(c < 0 for c in self.classes):
            raise ValueError(f"classes: expected class indices >= 0, got {list(self.classes)}")


def candidates_for_batch(prediction: torch.Tensor, opts: DetectOptions) -> list[torch.Tensor]:
    """Tensor[B, N, 5 + nc] -> per image Tensor[K, 6] float32 on the CPU: the rows NMS needs."""
    return [select_candidates(p, opts.conf_thres).float().cpu() for p in prediction]


@timed("nms")
def final_detections(candidates: torch.Tensor, info: LetterboxInfo, opts: DetectOptions) -> torch.Tensor:
    """Tensor[K, 6] candidates in letterbox pixels -> Tensor[M, 6] (x1, y1, x2, y2, score, cls)
    in original-image pixels, best score first."""
    dets = nms_candidates(candidates, opts.iou_thres, opts.classes, opts.agnostic, opts.max_det)
    return torch.cat((scale_boxes(dets[:, :4], info), dets[:, 4:]), 1)


def in_full_size(dets: torch.Tensor, reduction: int, full_shape) -> torch.Tensor:
    """Detections of a frame decoded at ``1 / reduction`` with their boxes in the full-size
    image's pixels (``full_shape`` is its (H, W)); unchanged for a full-size decode."""
    if reduction == 1:
        return dets
    return torch.cat((unreduce_boxes(dets[:, :4], reduction, full_shape), dets[:, 4:]), 1)


def detection_records(dets: torch.Tensor, image: str, frame: int, names: Sequence[str]) -> list[dict[str, Any]]:
    """The ``--save-json`` records of one image."""
    records = []
    for x1, y1, x2, y2, score, cls in dets.tolist():
        class_id = int(cls)
        records.append({"image": image, "frame": frame, "class_id": class_id,
                        "class": names[class_id] if class_id < len(names) else str(class_id),
                        "score": round(score, 6), "box": [round(v, 4) for v in (x1, y1, x2, y2)]})
    return records


def annotated_name(name: str, cycle: int) -> str:
    """Where an annotated frame is saved under the image folder, unique per frame: the image's
    name (a video frame's name carries its index), the pass number when the source loops, and
    the original extension kept in the stem unless it is already .jpg/.jpeg/.png."""
    video, _, index = name.rpartition(":")
    if video and index.isdigit():
        name = f"{video}_{index}"  # clip.mp4:000017 -> clip.mp4_000017, saved as a .jpg
    stem, ext = os.path.splitext(name)
    suffix = f"_pass{cycle}" if cycle else ""
    if ext.lower() in (".jpg", ".jpeg", ".png"):
        return f"{stem}{suffix}{ext}"
    return f"{name}{suffix}.jpg"


def save_image(path: str, image: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not cv2.imwrite(path, image):
        raise OSError(f"cannot write image: {path}")


def summarise_counts(dets: torch.Tensor, names: Sequence[str]) -> str:
    if len(dets) == 0:
        return "no detections"
    classes, counts = torch.unique(dets[:, 5].int(), return_counts=True)
    parts = [f"{n} {names[c] if c < len(names) else c}{'s' if n > 1 else ''}"
             for c, n in zip(classes.tolist(), counts.tolist())]
    return ", ".join(parts)
