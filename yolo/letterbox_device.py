"""Letterboxing on the device: the twin of :func:`yolo.letterbox.letterbox` for RGB ``CHW``
tensors on any device, with the same geometry (:func:`yolo.letterbox.letterbox_layout`).

Two resizes (docs/gpu.md has the measured differences):

- ``"opencv"`` (the default): OpenCV's ``INTER_LINEAR`` for uint8 reproduced with integer tensor
  ops, bit for bit on the fixtures: half-pixel centres, weights rounded to 11 bits, the
  horizontal pass exact, the vertical pass rounded as OpenCV's SIMD kernel rounds it (each
  product's high 16 bits, then ``+2 >> 2``). Detections then equal the host path's.
- ``"bilinear"``: ``torch.nn.functional.interpolate`` in float32 (CUDA's bilinear kernels take no
  uint8), rounded half up. Same sampling points, float weights: about 12 % of the pixels differ
  from OpenCV's by 1 grey level, none by more, unless ``antialias`` is set, which filters over
  the whole footprint of an output pixel on a downscale as OpenCV's ``INTER_LINEAR`` does not.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from yolo.letterbox import LetterboxInfo, letterbox_layout, to_bgr


def check_rgb_chw(image: Tensor) -> None:
    if not isinstance(image, Tensor) or image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
        found = f"{image.dtype} {tuple(image.shape)}" if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"expected a uint8 RGB tensor of shape (3, H, W), got {found}")


def upload_bgr(image: np.ndarray, device: torch.device | str) -> Tensor:
    """A host image to the device as RGB ``CHW``: one copy of its uint8 bytes, then the channel
    flip and the permute on the device.

    Args:
        image (np.ndarray[H, W] | np.ndarray[H, W, C]): ``uint8`` gray, BGR or BGRA image.
        device (torch.device | str): where the result lives.

    Returns:
        Tensor[3, H, W]: contiguous ``uint8`` RGB image on ``device``.
    """
    bgr = torch.from_numpy(np.ascontiguousarray(to_bgr(image))).to(device, non_blocking=True)
    return bgr.permute(2, 0, 1).flip(0).contiguous()


def download_bgr(image: Tensor) -> np.ndarray:
    """Tensor[3, H, W] uint8 RGB on any device -> np.ndarray[H, W, 3] uint8 BGR on the host."""
    check_rgb_chw(image)
    return np.ascontiguousarray(image.flip(0).permute(1, 2, 0).cpu().numpy())


RESIZES = ("opencv", "bilinear")
_COEF_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS


@functools.lru_cache(maxsize=64)
def _taps(src: int, dst: int, across: bool, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """OpenCV's linear taps from ``src`` to ``dst`` samples: first and second source index
    (Tensor[dst] int64) and their weights (Tensor[dst] int32, summing to about 2**11). Across
    (x), a sample beyond the first or last pixel's centre takes that pixel whole; down (y),
    OpenCV keeps the fraction and clips the rows, so both taps are the edge row."""
    fraction = ((np.arange(dst) + 0.5) * (src / dst) - 0.5).astype(np.float32)
    first = np.floor(fraction)
    fraction -= first
    first = first.astype(np.int64)
    if across:
        fraction[first < 0], first[first < 0] = 0, 0
        fraction[first >= src - 1], first[first >= src - 1] = 0, src - 1
    weights = [np.rint(w * (1 << _COEF_BITS)).astype(np.int32) for w in (1 - fraction, fraction)]
    taps = (np.clip(first, 0, src - 1), np.clip(first + 1, 0, src - 1), *weights)
    return tuple(torch.from_numpy(tap).to(device) for tap in taps)


def _resize_opencv(image: Tensor, size_hw: tuple[int, int]) -> Tensor:
    y0, y1, wy0, wy1 = _taps(image.shape[1], size_hw[0], False, image.device)
    x0, x1, wx0, wx1 = _taps(image.shape[2], size_hw[1], True, image.device)
    pixels = image.permute(1, 2, 0)  # [H, W, 3]: a gathered column carries its 3 channels

    def down(rows: Tensor, weights: Tensor) -> Tensor:  # [h, W, 3] uint8 -> [h, w, 3], OpenCV's rounding
        across = rows.to(torch.int32).index_select(1, x0).mul_(wx0[:, None])
        across.add_(rows.to(torch.int32).index_select(1, x1).mul_(wx1[:, None]))  # scaled by 2**11
        return across.bitwise_right_shift_(4).mul_(weights[:, None, None]).bitwise_right_shift_(16)

    out = down(pixels.index_select(0, y0), wy0).add_(down(pixels.index_select(0, y1), wy1))
    return out.add_(2).bitwise_right_shift_(2).clamp_(0, 255).to(torch.uint8).permute(2, 0, 1).contiguous()


def resize_rgb(image: Tensor, size_hw: tuple[int, int], method: str = "opencv", antialias: bool = False) -> Tensor:
    """Bilinear resize of a uint8 image on its device.

    Args:
        image (Tensor[3, H, W]): ``uint8`` RGB image.
        size_hw (tuple[int, int]): ``(h, w)`` of the result.
        method (str): ``"opencv"``, OpenCV's ``INTER_LINEAR`` in integer ops, or ``"bilinear"``,
            ``torch.nn.functional.interpolate`` in float32 (see the module docstring).
        antialias (bool): with ``"bilinear"``, low-pass filter on a downscale.

    Returns:
        Tensor[3, h, w]: ``uint8`` image on ``image``'s device.
    """
    check_rgb_chw(image)
    if method not in RESIZES:
        raise ValueError(f"expected a resize method in {RESIZES}, got {method!r}")
    if antialias and method != "bilinear":
        raise ValueError(f"expected antialias only with method 'bilinear', got method {method!r}")
    if tuple(image.shape[1:]) == tuple(size_hw):
        return image
    if method == "opencv":
        return _resize_opencv(image, size_hw)
    resized = F.interpolate(image[None].float(), size=size_hw, mode="bilinear", align_corners=False,
                            antialias=antialias)
    return resized[0].add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)  # half up, as OpenCV rounds


def letterbox_device(
    image: Tensor,
    imgsz: int = 640,
    stride: int = 32,
    rect: bool = False,
    scaleup: bool = True,
    pad_value: int = 114,
    method: str = "opencv",
    antialias: bool = False,
) -> tuple[Tensor, LetterboxInfo]:
    """Resize an RGB tensor keeping its aspect ratio, then pad it, on its own device.

    Same ratio, resized size, borders and :class:`~yolo.letterbox.LetterboxInfo` as
    :func:`yolo.letterbox.letterbox` for an image of the same ``(H, W)``.

    Args:
        image (Tensor[3, H, W]): ``uint8`` RGB image, on any device.
        imgsz (int): target size, a positive multiple of ``stride``.
        stride (int): network stride.
        rect (bool): minimal padding instead of a square output.
        scaleup (bool): allow enlarging images smaller than ``imgsz``.
        pad_value (int): grey level of the padding.
        method (str): ``"opencv"`` or ``"bilinear"``, see :func:`resize_rgb`.
        antialias (bool): with ``"bilinear"``, see :func:`resize_rgb`.

    Returns:
        tuple[Tensor[3, H', W'], LetterboxInfo]: the contiguous ``uint8`` RGB letterboxed image
        on ``image``'s device (the model's input once scaled, see
        :func:`yolo.tensors.chw_batch_to_input`) and the geometry to map boxes back.
    """
    check_rgb_chw(image)
    info, (new_h, new_w), (top, _, left, _) = letterbox_layout(image.shape[1:], imgsz, stride, rect, scaleup)
    resized = resize_rgb(image, (new_h, new_w), method, antialias)
    out = image.new_full((3, *info.shape), pad_value)
    out[:, top:top + new_h, left:left + new_w] = resized
    return out, info
