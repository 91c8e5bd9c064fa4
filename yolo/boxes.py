"""Box format conversions and the mapping of boxes from letterboxed to original pixels.

The conversions and the clipping are torchvision's (``box_convert``, ``clip_boxes_to_image``),
named here in this project's words and with a shape check that names the bad shape."""

from collections.abc import Sequence

from torch import Tensor
from torchvision.ops import box_convert, box_iou, clip_boxes_to_image

from yolo.letterbox import LetterboxInfo

__all__ = ["box_iou", "clip_boxes", "scale_boxes", "unreduce_boxes", "xywh_to_xyxy", "xyxy_to_xywh"]

REDUCTIONS = (1, 2, 4, 8)  # the scales of OpenCV's IMREAD_REDUCED_* decodes


def _check_boxes(boxes: Tensor) -> None:
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"expected boxes of shape (N, 4), got {tuple(boxes.shape)}")


def xywh_to_xyxy(boxes: Tensor) -> Tensor:
    """Convert boxes from ``(cx, cy, w, h)`` to ``(x1, y1, x2, y2)``.

    Args:
        boxes (Tensor[N, 4]): boxes in ``(cx, cy, w, h)`` format, ``(cx, cy)`` the centre.

    Returns:
        Tensor[N, 4]: new tensor of boxes in ``(x1, y1, x2, y2)`` format.
    """
    _check_boxes(boxes)
    return box_convert(boxes, "cxcywh", "xyxy")


def xyxy_to_xywh(boxes: Tensor) -> Tensor:
    """Convert boxes from ``(x1, y1, x2, y2)`` to ``(cx, cy, w, h)``.

    Args:
        boxes (Tensor[N, 4]): boxes in ``(x1, y1, x2, y2)`` format, ``0 <= x1 <= x2``,
            ``0 <= y1 <= y2``.

    Returns:
        Tensor[N, 4]: new tensor of boxes in ``(cx, cy, w, h)`` format.
    """
    _check_boxes(boxes)
    return box_convert(boxes, "xyxy", "cxcywh")


def clip_boxes(boxes: Tensor, shape_hw: Sequence[int]) -> Tensor:
    """Clip boxes to an image: x into ``[0, w]`` and y into ``[0, h]``.

    Args:
        boxes (Tensor[N, 4]): boxes in ``(x1, y1, x2, y2)`` format.
        shape_hw (Sequence[int]): ``(h, w)`` of the image.

    Returns:
        Tensor[N, 4]: new tensor of clipped boxes.
    """
    _check_boxes(boxes)
    return clip_boxes_to_image(boxes, (shape_hw[0], shape_hw[1]))


def scale_boxes(boxes: Tensor, info: LetterboxInfo) -> Tensor:
    """Map boxes from letterboxed-image pixels back to original-image pixels.

    Subtracts the padding, divides by the ratio, then clips to the original image.

    Args:
        boxes (Tensor[N, 4]): boxes in ``(x1, y1, x2, y2)`` format, letterboxed pixels.
        info (LetterboxInfo): the geometry returned by :func:`yolo.letterbox.letterbox`.

    Returns:
        Tensor[N, 4]: new tensor of ``(x1, y1, x2, y2)`` boxes in original pixels.
    """
    _check_boxes(boxes)
    pad_x, pad_y = info.pad
    offset = boxes.new_tensor((pad_x, pad_y, pad_x, pad_y))
    return clip_boxes((boxes - offset) / info.ratio, info.original_shape)


def unreduce_boxes(boxes: Tensor, reduction: int, original_shape: Sequence[int]) -> Tensor:
    """Map boxes from the pixels of a reduced decode back to the full-size image's pixels.

    A JPEG decoded at ``1 / reduction`` has ``ceil(W / reduction)`` columns, column ``i``
    covering full-size columns ``[i * reduction, (i + 1) * reduction)`` (the last one may be
    cut short), so coordinates scale by exactly ``reduction``; the result is clipped to the
    full-size image.

    Args:
        boxes (Tensor[N, 4]): boxes in ``(x1, y1, x2, y2)`` format, reduced-image pixels.
        reduction (int): 1, 2, 4 or 8 (:attr:`inputs.frames.Frame.reduction`).
        original_shape (Sequence[int]): ``(H, W)`` of the full-size image.

    Returns:
        Tensor[N, 4]: new tensor of ``(x1, y1, x2, y2)`` boxes in full-size pixels.
    """
    _check_boxes(boxes)
    if reduction not in REDUCTIONS:
        raise ValueError(f"expected a reduction in {REDUCTIONS}, got {reduction!r}")
    return clip_boxes(boxes * reduction, original_shape)
