"""Letterbox resizing: scale an image to fit a network input and pad the rest.

The geometry matches YOLOv5's ``letterbox`` exactly (ratio, rounding of the resized size,
the split of the padding between the two sides), so detections mapped back through
:class:`LetterboxInfo` agree with those of the reference implementation.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

LETTERBOX_STRIDE = 32  # the max stride of every YOLOv5 P5 model: the pipeline letterboxes to it, whatever the model


@dataclass(frozen=True)
class LetterboxInfo:
    """How an image was letterboxed, enough to map boxes back to it.

    Attributes:
        ratio (float): scale factor applied to both sides of the original image.
        pad (tuple[float, float]): ``(pad_x, pad_y)``, half the total horizontal and vertical
            padding (``dw / 2``, ``dh / 2``); the left/top border is ``round(pad - 0.1)``.
        original_shape (tuple[int, int]): ``(h, w)`` of the image before letterboxing.
        shape (tuple[int, int]): ``(h, w)`` of the letterboxed image.
    """

    ratio: float
    pad: tuple[float, float]
    original_shape: tuple[int, int]
    shape: tuple[int, int]


def to_bgr(image: np.ndarray) -> np.ndarray:
    """Convert a grayscale, BGR or BGRA ``uint8`` image to 3-channel BGR.

    Args:
        image (np.ndarray[H, W] | np.ndarray[H, W, C]): ``uint8`` image with C in {1, 3, 4};
            3 channels are taken as BGR and 4 as BGRA.

    Returns:
        np.ndarray[H, W, 3]: ``uint8`` BGR image; the input itself when it is already BGR.

    Raises:
        ValueError: for another dtype, number of dimensions or channels, or an empty image.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"expected a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got dtype {image.dtype}")
    if image.ndim not in (2, 3):
        raise ValueError(f"expected an image of shape (H, W) or (H, W, C), got {image.shape}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"expected a non-empty image, got shape {image.shape}")
    channels = 1 if image.ndim == 2 else image.shape[2]
    if channels == 3:
        return image
    if channels == 1:
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_GRAY2BGR)
    if channels == 4:
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_BGRA2BGR)
    raise ValueError(f"expected 1, 3 or 4 channels, got {channels} (shape {image.shape})")


def _check_sizes(imgsz: int, stride: int) -> None:
    if stride <= 0:
        raise ValueError(f"expected a positive stride, got {stride}")
    if imgsz <= 0 or imgsz % stride != 0:
        raise ValueError(f"expected imgsz to be a positive multiple of stride {stride}, got {imgsz}")


def _check_shape(original_shape: Sequence[int]) -> tuple[int, int]:
    if len(original_shape) < 2 or original_shape[0] <= 0 or original_shape[1] <= 0:
        raise ValueError(f"expected a positive (h, w) shape, got {tuple(original_shape)}")
    return int(original_shape[0]), int(original_shape[1])


def _geometry(
    original_shape: Sequence[int], imgsz: int, stride: int, rect: bool, scaleup: bool
) -> tuple[float, tuple[int, int], tuple[float, float]]:
    """Return ``(ratio, (new_h, new_w), (dw, dh))`` with dw, dh already halved."""
    _check_sizes(imgsz, stride)
    h, w = _check_shape(original_shape)
    ratio = min(imgsz / h, imgsz / w)
    if not scaleup:
        ratio = min(ratio, 1.0)
    new_w = max(int(round(w * ratio)), 1)
    new_h = max(int(round(h * ratio)), 1)
    dw, dh = imgsz - new_w, imgsz - new_h
    if rect:
        dw, dh = dw % stride, dh % stride
    return ratio, (new_h, new_w), (dw / 2, dh / 2)


def _borders(half_pad: float) -> tuple[int, int]:
    return int(round(half_pad - 0.1)), int(round(half_pad + 0.1))


def letterbox_shape(
    original_shape: Sequence[int],
    imgsz: int,
    stride: int = 32,
    rect: bool = False,
    scaleup: bool = True,
) -> tuple[int, int]:
    """Return the ``(h, w)`` that :func:`letterbox` produces for an image of this shape.

    Args:
        original_shape (Sequence[int]): ``(h, w)`` or ``(h, w, c)`` of the input image.
        imgsz (int): target size of the longer side, a positive multiple of ``stride``.
        stride (int): the output sides are multiples of it in ``rect`` mode.
        rect (bool): pad only up to the next multiple of ``stride`` instead of to a square.
        scaleup (bool): allow enlarging images smaller than ``imgsz``.

    Returns:
        tuple[int, int]: ``(h, w)`` of the letterboxed image.
    """
    return letterbox_layout(original_shape, imgsz, stride, rect, scaleup)[0].shape


def letterbox_layout(original_shape: Sequence[int], imgsz: int, stride: int = 32, rect: bool = False,
                     scaleup: bool = True) -> tuple[LetterboxInfo, tuple[int, int], tuple[int, int, int, int]]:
    """Where :func:`letterbox` puts an image of this shape, for it and its device twin.

    Args:
        original_shape (Sequence[int]): ``(h, w)`` or ``(h, w, c)`` of the input image.
        imgsz, stride, rect, scaleup: as for :func:`letterbox`.

    Returns:
        tuple[LetterboxInfo, tuple[int, int], tuple[int, int, int, int]]: the geometry, the
        ``(new_h, new_w)`` the image is resized to, and the ``(top, bottom, left, right)`` borders.
    """
    h, w = _check_shape(original_shape)
    ratio, (new_h, new_w), (dw, dh) = _geometry((h, w), imgsz, stride, rect, scaleup)
    (top, bottom), (left, right) = _borders(dh), _borders(dw)
    info = LetterboxInfo(ratio=ratio, pad=(dw, dh), original_shape=(h, w),
                         shape=(new_h + top + bottom, new_w + left + right))
    return info, (new_h, new_w), (top, bottom, left, right)


def letterbox(
    image: np.ndarray,
    imgsz: int = 640,
    stride: int = 32,
    rect: bool = False,
    scaleup: bool = True,
    pad_value: int = 114,
) -> tuple[np.ndarray, LetterboxInfo]:
    """Resize an image keeping its aspect ratio, then pad it with a constant colour.

    The ratio is ``min(imgsz / h, imgsz / w)`` (capped at 1 when ``scaleup`` is false). In fixed
    mode the output is ``imgsz x imgsz``; in ``rect`` mode each side is padded only to the next
    multiple of ``stride``.

    Args:
        image (np.ndarray[H, W] | np.ndarray[H, W, C]): ``uint8`` gray, BGR or BGRA image.
        imgsz (int): target size, a positive multiple of ``stride``.
        stride (int): network stride.
        rect (bool): minimal padding instead of a square output.
        scaleup (bool): allow enlarging images smaller than ``imgsz``.
        pad_value (int): grey level of the padding.

    Returns:
        tuple[np.ndarray[H', W', 3], LetterboxInfo]: the contiguous ``uint8`` BGR letterboxed
        image and the geometry needed to map boxes back (see :func:`yolo.boxes.scale_boxes`).
    """
    bgr, info, (top, bottom, left, right) = _resized(image, imgsz, stride, rect, scaleup)
    out = cv2.copyMakeBorder(
        bgr, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(pad_value, pad_value, pad_value)
    )
    return np.ascontiguousarray(out), info


def _resized(image: np.ndarray, imgsz: int, stride: int, rect: bool, scaleup: bool
             ) -> tuple[np.ndarray, LetterboxInfo, tuple[int, int, int, int]]:
    """The image as BGR at its letterboxed size, not yet padded; the geometry; the borders
    ``(top, bottom, left, right)``."""
    bgr = to_bgr(image)
    info, (new_h, new_w), borders = letterbox_layout(bgr.shape, imgsz, stride, rect, scaleup)
    if (new_h, new_w) != info.original_shape:
        bgr = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return bgr, info, borders


def letterbox_rgb_chw(
    image: np.ndarray,
    imgsz: int = 640,
    stride: int = 32,
    rect: bool = False,
    scaleup: bool = True,
    pad_value: int = 114,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, LetterboxInfo]:
    """:func:`letterbox` then :func:`bgr_to_rgb_chw` in one pass over the output: the resized
    image's planes are written straight into ``out`` (a frame slot, say) and only the borders
    are filled, so neither the padded BGR image nor the stacked planes are made.

    Args:
        image, imgsz, stride, rect, scaleup, pad_value: as :func:`letterbox`.
        out (np.ndarray[3, H', W'] | None): where to write (``uint8``, C-contiguous, the
            letterboxed shape: :func:`letterbox_layout`); None: a new array.

    Returns:
        tuple[np.ndarray[3, H', W'], LetterboxInfo]: ``out`` (or the new array), the same pixels as
        ``bgr_to_rgb_chw(letterbox(...)[0])``, and the geometry.
    """
    bgr, info, (top, _, left, _) = _resized(image, imgsz, stride, rect, scaleup)
    new_h, new_w = bgr.shape[:2]
    shape = (3, *info.shape)
    if out is None:
        out = np.empty(shape, np.uint8)
    elif out.shape != shape or out.dtype != np.uint8:
        raise ValueError(f"expected out of shape {shape} uint8, got {out.shape} {out.dtype}")
    out[:, :top] = pad_value
    out[:, top + new_h:] = pad_value
    out[:, top:top + new_h, :left] = pad_value
    out[:, top:top + new_h, left + new_w:] = pad_value
    for channel, plane in enumerate(cv2.split(bgr)):  # planar split: several times faster than strided copies
        out[2 - channel, top:top + new_h, left:left + new_w] = plane
    return out, info


def check_bgr(image: np.ndarray) -> None:
    if image.dtype != np.uint8 or image.ndim < 3 or image.shape[-1] != 3:
        raise ValueError(
            f"expected uint8 BGR image(s) of shape (..., H, W, 3), got {image.dtype} {image.shape}"
        )


def bgr_to_rgb_chw(image: np.ndarray) -> np.ndarray:
    """Reorder a BGR ``HWC`` image to RGB ``CHW``, keeping ``uint8``.

    Args:
        image (np.ndarray[H, W, 3]): ``uint8`` BGR image.

    Returns:
        np.ndarray[3, H, W]: contiguous ``uint8`` RGB image.
    """
    if image.ndim != 3:
        raise ValueError(f"expected an image of shape (H, W, 3), got {image.shape}")
    check_bgr(image)
    return np.stack(cv2.split(image)[::-1])  # planar split: several times faster than a transpose copy
