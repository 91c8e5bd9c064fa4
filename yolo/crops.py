"""Detections cut out of their frame, as Ultralytics' ``detect.py --save-crop`` cuts them
(``save_one_box``): the box widened by 2 % plus 10 pixels, clipped to the image, saved under
``crops/<class name>/<frame stem>.jpg``, then ``<frame stem>2.jpg``, ... for more of one class."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from yolo.labels import frame_stem

CROPS_DIR = "crops"
CROP_GAIN = 1.02  # detect.py's save_one_box defaults
CROP_PAD_PX = 10


def crop_box(image: np.ndarray, box: Sequence[float], gain: float = CROP_GAIN, pad: float = CROP_PAD_PX) -> np.ndarray:
    """One box cut out of an image, grown about its centre to ``size * gain + pad``.

    Args:
        image (np.ndarray[H, W, C]): the frame.
        box (Sequence[float]): ``(x1, y1, x2, y2)`` in ``image`` pixels.

    Returns:
        np.ndarray[h, w, C]: a copy of the region, clipped to the image (empty when the box lies
        outside it). Corners are truncated to integers, as detect.py's ``.long()`` does.
    """
    if image.ndim != 3:
        raise ValueError(f"expected an image of shape (H, W, C), got {image.shape}")
    top, bottom, left, right = crop_bounds(box, image.shape[:2], gain, pad)
    return image[top:bottom, left:right].copy()


def crop_bounds(box: Sequence[float], shape_hw: Sequence[int], gain: float = CROP_GAIN,
                pad: float = CROP_PAD_PX) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` of :func:`crop_box`'s region in an image of ``(h, w)``,
    for it and its device twin (:func:`yolo.jpeg_device.crop_box_device`)."""
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    w, h = (x2 - x1) * gain + pad, (y2 - y1) * gain + pad
    height, width = int(shape_hw[0]), int(shape_hw[1])
    left, right = (int(np.clip(v, 0, width)) for v in (cx - w / 2, cx + w / 2))
    top, bottom = (int(np.clip(v, 0, height)) for v in (cy - h / 2, cy + h / 2))
    return top, bottom, left, right


def crop_paths(name: str, class_ids: Sequence[int], names: Sequence[str]) -> list[str]:
    """The file of each detection's crop, relative to the run folder, in detection order.

    ``"bus.jpg"`` with classes ``[0, 0, 5]`` -> ``crops/person/bus.jpg``,
    ``crops/person/bus2.jpg``, ``crops/bus/bus.jpg`` (detect.py's increment_path numbering).
    """
    stem, seen, paths = frame_stem(name), {}, []
    for class_id in class_ids:
        label = names[class_id] if 0 <= class_id < len(names) else str(class_id)
        n = seen[label] = seen.get(label, 0) + 1
        paths.append(os.path.join(CROPS_DIR, label, f"{stem}{n if n > 1 else ''}.jpg"))
    return paths
