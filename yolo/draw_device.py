"""Drawing detections on an RGB ``CHW`` tensor on its own device: the twin of
:func:`yolo.draw.draw_detections`, with its colours, thickness and label layout.

Boxes are four tensor-slice fills each; a label is a filled rectangle with its text blended in
from a glyph atlas that ``cv2.putText`` renders once per thickness and device (printable ASCII,
one cell per character, cut at each character's advance). What differs from the host drawing:
no anti-aliased fringe on the box lines, and characters placed at whole-pixel advances, so a
long label may end a pixel or two from where OpenCV ends it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch
from torch import Tensor

from yolo.draw import _FONT, _label, _text_color, box_style, class_color
from yolo.letterbox_device import check_rgb_chw

_GLYPHS = "".join(chr(code) for code in range(32, 127))
_MISSING = "?"  # drawn for characters outside printable ASCII


@dataclass(frozen=True)
class GlyphAtlas:
    """One alpha cell per character, on one device, for one box thickness.

    Attributes:
        cells (dict[str, Tensor[h, w_c]]): float32 coverage in ``[0, 1]``, the text's baseline at
            row ``text_h + 1``, as ``draw_detections`` places it in its label box.
        text_h (int): OpenCV's text height at this font scale and thickness.
        baselines (dict[str, int]): OpenCV's baseline of each character alone.
    """

    cells: dict[str, Tensor]
    text_h: int
    baselines: dict[str, int]

    def label_size(self, text: str) -> tuple[int, int]:
        """``(w, h)`` of ``text``'s label box, as ``draw_detections`` sizes it."""
        width = sum(self.cells[c].shape[1] for c in text) + 1
        return width, self.text_h + max(self.baselines[c] for c in text) + 2

    def render(self, text: str) -> Tensor:
        """Tensor[h + 1, w + 1] float32 coverage of ``text`` over its label box of ``(w, h)``
        (:meth:`label_size`; +1: OpenCV's filled rectangle includes both corners)."""
        width, height = self.label_size(text)
        mask = torch.cat([self.cells[c] for c in text], dim=1)[:height + 1]
        return torch.nn.functional.pad(mask, (0, width + 1 - mask.shape[1]))


@functools.lru_cache(maxsize=16)
def glyph_atlas(thickness: int, device: torch.device) -> GlyphAtlas:
    """The :class:`GlyphAtlas` of box ``thickness`` on ``device``, made once (cached)."""
    _, font_scale, font_thickness = box_style((0, 0), thickness)
    sizes = {c: cv2.getTextSize(c, _FONT, font_scale, font_thickness) for c in _GLYPHS}
    text_h = max(size[0][1] for size in sizes.values())
    height = text_h + max(size[1] for size in sizes.values()) + 3
    margin = thickness + 2
    cells = {}
    for c, ((width, _), _) in sizes.items():
        advance = max(width - 1, 1)  # OpenCV 5: a string is 1 px narrower per character than its parts
        canvas = np.zeros((height, advance + 2 * margin), np.uint8)
        cv2.putText(canvas, c, (margin, text_h + 1), _FONT, font_scale, 255, font_thickness, cv2.LINE_AA)
        cells[c] = torch.from_numpy(canvas[:, margin:margin + advance] / np.float32(255)).to(device)
    return GlyphAtlas(cells, text_h, {c: size[1] for c, size in sizes.items()})


def _fill(image: Tensor, top: int, bottom: int, left: int, right: int, color: Tensor) -> None:
    """Paint rows ``[top, bottom)`` and columns ``[left, right)``, clipped to the image."""
    top, left = max(top, 0), max(left, 0)
    bottom, right = min(bottom, image.shape[1]), min(right, image.shape[2])
    if top < bottom and left < right:
        image[:, top:bottom, left:right] = color


def _draw_box(image: Tensor, corners: tuple[int, int, int, int], thickness: int, color: Tensor) -> None:
    """The outline of ``cv2.rectangle(..., thickness, LINE_AA)``'s solid part: a band of
    ``2 * half + 1`` pixels centred on each edge (OpenCV's anti-aliased thick lines are wider
    than ``thickness``: 3 px at 2, 5 px at 3 and 4, 7 px at 5)."""
    x1, y1, x2, y2 = corners
    half = (thickness + 1) // 2 if thickness > 1 else 0
    _fill(image, y1 - half, y1 + half + 1, x1 - half, x2 + half + 1, color)
    _fill(image, y2 - half, y2 + half + 1, x1 - half, x2 + half + 1, color)
    _fill(image, y1 - half, y2 + half + 1, x1 - half, x1 + half + 1, color)
    _fill(image, y1 - half, y2 + half + 1, x2 - half, x2 + half + 1, color)


def _draw_label(image: Tensor, atlas: GlyphAtlas, text: str, corner: tuple[int, int], colors: Tensor) -> None:
    """A filled label box above the box's top-left ``corner`` (below it where there is no
    room), kept inside the image as ``draw_detections`` keeps it; ``colors`` is Tensor[2, 3, 1, 1]
    float32 (box colour, text colour)."""
    h, w = image.shape[1:]
    text_w, box_h = atlas.label_size(text)
    left = min(max(corner[0], 0), max(w - text_w, 0))
    top = corner[1] - box_h if corner[1] - box_h >= 0 else corner[1]
    top = min(max(top, 0), max(h - box_h, 0))
    mask = atlas.render(text)[:h - top, :w - left]
    blended = colors[0] + (colors[1] - colors[0]) * mask
    image[:, top:top + mask.shape[0], left:left + mask.shape[1]] = blended.round_().to(torch.uint8)


def _rgb(bgr: tuple[int, int, int]) -> tuple[int, int, int]:
    return bgr[2], bgr[1], bgr[0]


def draw_detections_device(
    image: Tensor,
    detections: Tensor | np.ndarray,
    names: Sequence[str],
    line_width: int | None = None,
    hide_labels: bool = False,
    hide_conf: bool = False,
) -> Tensor:
    """Draw boxes with ``"name score"`` labels on an image tensor, in place, on its device.

    Args:
        image (Tensor[3, H, W]): ``uint8`` RGB image on any device; drawn on.
        detections (Tensor[M, 6] | np.ndarray[M, 6]): ``(x1, y1, x2, y2, score, class)`` rows in
            ``image`` pixels; they come to the host (the kept rows only: a few hundred bytes).
        names (Sequence[str]): class names; ids outside it are labelled with the id.
        line_width (int | None): box thickness; by default scaled with the image size.
        hide_labels (bool): boxes only, no label.
        hide_conf (bool): labels with the class name only, no score.

    Returns:
        Tensor[3, H, W]: ``image``.
    """
    check_rgb_chw(image)
    rows = detections.detach().float().cpu().numpy() if isinstance(detections, Tensor) else detections
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, 6) if np.size(rows) else np.zeros((0, 6))
    if not len(rows):
        return image
    thickness = box_style(image.shape[1:], line_width)[0]
    class_ids = [int(cls) for cls in rows[:, 5]]
    palette = [(_rgb(class_color(c)), _rgb(_text_color(class_color(c)))) for c in class_ids]
    colors = torch.tensor(palette, dtype=torch.float32).to(image.device, non_blocking=True)[..., None, None]
    atlas = None if hide_labels else glyph_atlas(thickness, image.device)
    box_colors = colors[:, 0].to(torch.uint8)
    for (x1, y1, x2, y2, score, _), class_id, pair, box_color in zip(rows, class_ids, colors, box_colors):
        corners = tuple(int(round(v)) for v in (x1, y1, x2, y2))
        _draw_box(image, corners, thickness, box_color)
        if atlas is not None:
            text = "".join(c if c in atlas.cells else _MISSING for c in _label(class_id, float(score), names, hide_conf))
            _draw_label(image, atlas, text, corners[:2], pair)
    return image
