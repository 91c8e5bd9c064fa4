"""YOLO label files as Ultralytics' ``detect.py --save-txt`` writes them: one line per detection,
``class cx cy w h [conf]``, the box normalised by the original image's width and height, numbers
written with ``%g``, lowest score first (detect.py walks its detections in reverse)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch import Tensor
from torchvision.ops import box_convert


LABELS_DIR = "labels"


def split_video_frame(name: str) -> tuple[str, int] | None:
    """``"clip.mp4:000017"`` (a video frame's name, see :meth:`FramePlan.ref`) -> ``("clip.mp4", 17)``,
    the frame's number in the video counted from 1; None for any other frame name."""
    video, sep, index = name.rpartition(":")
    if not (sep and video and index.isascii() and index.isdigit()):
        return None
    return video, int(index)


def frame_stem(name: str) -> str:
    """The extension-less name of a frame's outputs, as detect.py forms it.

    ``"bus.jpg"`` -> ``"bus"``; ``"dir/x.png"`` -> ``"dir/x"`` (detect.py reads a folder without
    recursing, so it has no such case; keeping the folder keeps two ``x.png`` apart);
    ``"clip.mp4:000017"`` -> ``"clip_17"``: the frame's number, counted from 1 in the name as
    detect.py counts it.
    """
    video = split_video_frame(name)
    if video is None:
        return os.path.splitext(name)[0]
    path, index = video
    return f"{os.path.splitext(path)[0]}_{index}"


def label_path(name: str) -> str:
    """The label file of a frame, relative to the save folder: ``labels/<frame_stem>.txt``."""
    return os.path.join(LABELS_DIR, frame_stem(name) + ".txt")


def label_lines(dets: Tensor, image_shape_hw: Sequence[int], save_conf: bool = False) -> list[str]:
    """The label lines of one image.

    Args:
        dets (Tensor[M, 6]): ``(x1, y1, x2, y2, score, class)`` rows in original-image pixels,
            best score first (as :func:`yolo.detect.final_detections` gives them).
        image_shape_hw (Sequence[int]): ``(h, w)`` of the original image.
        save_conf (bool): append the score to each line (detect.py's ``--save-conf``).

    Returns:
        list[str]: ``"class cx cy w h"`` or ``"class cx cy w h score"`` per detection, in reverse
        order of ``dets``, without line ends.
    """
    if dets.ndim != 2 or dets.shape[1] != 6:
        raise ValueError(f"expected detections of shape (M, 6), got {tuple(dets.shape)}")
    h, w = image_shape_hw[0], image_shape_hw[1]
    if h <= 0 or w <= 0:
        raise ValueError(f"expected a positive image shape (h, w), got {tuple(image_shape_hw)}")
    dets = dets.float().flip(0)
    xywh = box_convert(dets[:, :4], "xyxy", "cxcywh") / dets.new_tensor((w, h, w, h))
    lines = []
    for (cx, cy, bw, bh), score, cls in zip(xywh.tolist(), dets[:, 4].tolist(), dets[:, 5].tolist()):
        values = (cls, cx, cy, bw, bh, score) if save_conf else (cls, cx, cy, bw, bh)
        lines.append(" ".join(f"{v:g}" for v in values))
    return lines


def write_label_file(path: str, lines: Sequence[str]) -> None:
    """Write ``lines`` to ``path``, creating its folder; replaces an older file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)
