"""Drawing detections on BGR images with per-class colours and labels.

Not torchvision's ``draw_bounding_boxes``: it draws on RGB CHW tensors with PIL text and no
filled label background, so it would need two conversions per frame and look different."""

import colorsys
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

_GOLDEN_RATIO_CONJUGATE = 0.618033988749895
_FONT = cv2.FONT_HERSHEY_SIMPLEX


@dataclass(frozen=True)
class DrawOptions:
    """Ultralytics' ``--line-thickness``, ``--hide-labels`` and ``--hide-conf``."""

    line_width: int | None = None  # None: scaled with the image size
    hide_labels: bool = False  # boxes only
    hide_conf: bool = False  # "name" instead of "name score"


def class_color(class_id: int) -> tuple[int, int, int]:
    """Return a stable, distinct BGR colour for a class.

    Hues step by the golden ratio so neighbouring ids get far-apart hues; saturation and
    value cycle slightly so ids whose hues come close still differ.

    Args:
        class_id (int): class index, any integer.

    Returns:
        tuple[int, int, int]: ``(b, g, r)`` in ``[0, 255]``.
    """
    hue = (class_id * _GOLDEN_RATIO_CONJUGATE) % 1.0
    saturation = 0.85 - 0.25 * ((class_id // 3) % 2)
    value = 0.95 - 0.2 * ((class_id // 7) % 2)
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return int(round(b * 255)), int(round(g * 255)), int(round(r * 255))


def _text_color(background: tuple[int, int, int]) -> tuple[int, int, int]:
    b, g, r = background
    luma = 0.114 * b + 0.587 * g + 0.299 * r
    return (0, 0, 0) if luma > 150 else (255, 255, 255)


def _label(class_id: int, score: float, names: Sequence[str], hide_conf: bool = False) -> str:
    name = names[class_id] if 0 <= class_id < len(names) else str(class_id)
    return name if hide_conf else f"{name} {score:.2f}"


def box_style(shape_hw: Sequence[int], line_width: int | None = None) -> tuple[int, float, int]:
    """``(box thickness, font scale, font thickness)`` for an image of ``(h, w)``: the thickness
    is ``line_width``, or by default scaled with the image size; the font follows it."""
    thickness = line_width if line_width is not None else max(round((shape_hw[0] + shape_hw[1]) / 2 * 0.003), 2)
    return thickness, thickness / 3, max(thickness - 1, 1)


def draw_detections(
    image: np.ndarray,
    detections: "torch.Tensor | np.ndarray",
    names: Sequence[str],
    line_width: int | None = None,
    inplace: bool = False,
    hide_labels: bool = False,
    hide_conf: bool = False,
) -> np.ndarray:
    """Draw boxes with ``"name score"`` labels on an image.

    Args:
        image (np.ndarray[H, W, 3]): ``uint8`` BGR image.
        detections (Tensor[M, 6] | np.ndarray[M, 6]): ``(x1, y1, x2, y2, score, class)`` rows in
            ``image`` pixels.
        names (Sequence[str]): class names; ids outside it are labelled with the id.
        line_width (int | None): box thickness; by default scaled with the image size.
        inplace (bool): draw on ``image`` itself instead of a copy.
        hide_labels (bool): boxes only, no label.
        hide_conf (bool): labels with the class name only, no score.

    Returns:
        np.ndarray[H, W, 3]: the image with detections drawn (``image`` when ``inplace``).
    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected a uint8 BGR image of shape (H, W, 3), got {image.dtype} {image.shape}")
    rows = detections.detach().cpu().numpy() if hasattr(detections, "detach") else detections  # torch or numpy
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, 6) if np.size(rows) else np.zeros((0, 6))
    if inplace and not image.flags.c_contiguous:
        raise ValueError("expected a C-contiguous image for inplace drawing, got a non-contiguous one")
    if not inplace:
        image = image.copy()
    h, w = image.shape[:2]
    thickness, font_scale, font_thickness = box_style((h, w), line_width)
    for x1, y1, x2, y2, score, cls in rows:
        class_id = int(cls)
        color = class_color(class_id)
        top_left = (int(round(x1)), int(round(y1)))
        bottom_right = (int(round(x2)), int(round(y2)))
        cv2.rectangle(image, top_left, bottom_right, color, thickness, cv2.LINE_AA)
        if hide_labels:
            continue
        label = _label(class_id, float(score), names, hide_conf)
        (text_w, text_h), baseline = cv2.getTextSize(label, _FONT, font_scale, font_thickness)
        box_h = text_h + baseline + 2
        left = min(max(top_left[0], 0), max(w - text_w, 0))
        top = top_left[1] - box_h if top_left[1] - box_h >= 0 else top_left[1]
        top = min(max(top, 0), max(h - box_h, 0))
        cv2.rectangle(image, (left, top), (left + text_w, top + box_h), color, -1, cv2.LINE_AA)
        cv2.putText(
            image, label, (left, top + text_h + 1), _FONT, font_scale, _text_color(color),
            font_thickness, cv2.LINE_AA,
        )
    return image
