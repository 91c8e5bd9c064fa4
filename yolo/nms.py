"""YOLOv5 non-maximum suppression, split into candidate selection and suppression.

:func:`select_candidates` turns raw head rows into scored ``(x1, y1, x2, y2, score, class)``
candidates and :func:`nms_candidates` suppresses overlaps among them, so a pipeline can select
on the inference side and ship only the candidates. :func:`non_max_suppression` runs both.
"""

from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.ops import batched_nms, nms

from yolo.boxes import xywh_to_xyxy


def _check_threshold(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected {name} in [0, 1], got {value}")


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"expected a positive {name}, got {value}")


def select_candidates(
    prediction: Tensor, conf_thres: float = 0.25, multi_label: bool = False
) -> Tensor:
    """Select scored detection candidates from the raw head output of one image.

    Rows whose objectness is above ``conf_thres`` are kept first; only for those is the
    class score ``objectness * class_probability`` computed. With ``multi_label`` a row gives
    one candidate per class scoring above ``conf_thres``, otherwise one candidate for its best
    class if that scores above ``conf_thres``.

    Args:
        prediction (Tensor[N, 5 + nc]): rows ``(cx, cy, w, h, objectness, p_0, ..., p_nc-1)``.
        conf_thres (float): score threshold in ``[0, 1]``.
        multi_label (bool): allow several classes per box.

    Returns:
        Tensor[K, 6]: candidates ``(x1, y1, x2, y2, score, class)`` with the class index as a
        float, in the dtype and on the device of ``prediction`` (float16 stays float16).
        Single-label candidates keep the order of the input rows; multi-label candidates are
        ordered by row, then class.
    """
    if prediction.ndim != 2 or prediction.shape[1] < 6:
        raise ValueError(
            f"expected prediction of shape (N, 5 + nc) with nc >= 1, got {tuple(prediction.shape)}"
        )
    _check_threshold("conf_thres", conf_thres)
    rows = prediction[prediction[:, 4] > conf_thres]
    scores = rows[:, 5:] * rows[:, 4:5]
    boxes = xywh_to_xyxy(rows[:, :4])
    if multi_label:
        row_index, class_index = (scores > conf_thres).nonzero(as_tuple=True)
        score = scores[row_index, class_index]
        boxes = boxes[row_index]
    else:
        score, class_index = scores.max(dim=1)
        keep = score > conf_thres
        score, class_index, boxes = score[keep], class_index[keep], boxes[keep]
    return torch.cat((boxes, score[:, None], class_index[:, None].to(boxes.dtype)), dim=1)


def nms_candidates(
    candidates: Tensor,
    iou_thres: float = 0.45,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    max_det: int = 1000,
    max_nms: int = 30000,
) -> Tensor:
    """Suppress overlapping candidates, per class unless ``agnostic``.

    Args:
        candidates (Tensor[K, 6]): ``(x1, y1, x2, y2, score, class)`` rows, as returned by
            :func:`select_candidates`.
        iou_thres (float): candidates overlapping a higher-scoring kept one with IoU above this
            are discarded; in ``[0, 1]``.
        classes (Sequence[int] | None): if given, keep only these class indices.
        agnostic (bool): suppress across classes instead of within each class.
        max_det (int): keep at most this many detections.
        max_nms (int): before suppression, keep only this many highest-scoring candidates.

    Returns:
        Tensor[M, 6]: float32 detections ``(x1, y1, x2, y2, score, class)``, ``M <= max_det``,
        sorted by decreasing score.
    """
    if candidates.ndim != 2 or candidates.shape[1] != 6:
        raise ValueError(f"expected candidates of shape (K, 6), got {tuple(candidates.shape)}")
    _check_threshold("iou_thres", iou_thres)
    _check_positive("max_det", max_det)
    _check_positive("max_nms", max_nms)
    detections = candidates.float()
    if classes is not None:
        wanted = torch.as_tensor(list(classes), dtype=detections.dtype, device=detections.device)
        detections = detections[torch.isin(detections[:, 5], wanted)]
    if detections.shape[0] > max_nms:
        detections = detections[detections[:, 4].topk(max_nms).indices]
    boxes, scores = detections[:, :4], detections[:, 4]
    if agnostic:
        keep = nms(boxes, scores, iou_thres)
    else:
        keep = batched_nms(boxes, scores, detections[:, 5].long(), iou_thres)
    return detections[keep[:max_det]]


def non_max_suppression(
    prediction: Tensor,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    max_det: int = 1000,
    multi_label: bool = False,
) -> list[Tensor]:
    """Run :func:`select_candidates` then :func:`nms_candidates` on each image of a batch.

    Args:
        prediction (Tensor[B, N, 5 + nc]): raw head rows ``(cx, cy, w, h, objectness, probs...)``.
        conf_thres (float): score threshold in ``[0, 1]``.
        iou_thres (float): IoU threshold in ``[0, 1]``.
        classes (Sequence[int] | None): if given, keep only these class indices.
        agnostic (bool): suppress across classes.
        max_det (int): at most this many detections per image.
        multi_label (bool): allow several classes per box.

    Returns:
        list[Tensor[M_i, 6]]: per image, float32 ``(x1, y1, x2, y2, score, class)`` rows sorted
        by decreasing score.
    """
    if prediction.ndim != 3:
        raise ValueError(f"expected prediction of shape (B, N, 5 + nc), got {tuple(prediction.shape)}")
    _check_threshold("iou_thres", iou_thres)
    return [
        nms_candidates(
            select_candidates(image, conf_thres, multi_label),
            iou_thres,
            classes=classes,
            agnostic=agnostic,
            max_det=max_det,
        )
        for image in prediction
    ]
