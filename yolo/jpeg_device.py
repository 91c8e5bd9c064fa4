"""JPEG encoding of RGB ``CHW`` tensors on their own device, and detections cut out of a frame
tensor for ``--save-crop``: the twins of the host path's ``cv2.imencode(".jpg", ...)`` and
:func:`yolo.crops.crop_box`, so only encoded bytes cross to the host.

``torchvision.io.encode_jpeg`` encodes CUDA tensors with nvJPEG and CPU tensors with libjpeg.
torchvision 0.29 marks its image I/O deprecated in favour of TorchCodec; its warning is
silenced here, where the choice was made (docs/gpu.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from torch import Tensor
from torchvision.io import encode_jpeg

from yolo.crops import CROP_GAIN, CROP_PAD_PX, crop_bounds
from yolo.letterbox_device import check_rgb_chw

JPEG_QUALITY = 95  # the host path's: OpenCV's default, as imwrite and workers/postprocess.py use


def _to_bytes(encoded: Tensor) -> bytes:
    return encoded.cpu().numpy().tobytes()


def encode_jpegs_device(images: Sequence[Tensor], quality: int = JPEG_QUALITY) -> list[bytes]:
    """Encode images on their device, as one call (nvJPEG batches a list on CUDA).

    Args:
        images (Sequence[Tensor[3, H, W]]): ``uint8`` RGB images, all on one device; sizes may differ.
        quality (int): JPEG quality in ``[1, 100]``.

    Returns:
        list[bytes]: one JPEG file per image; only these bytes cross to the host.
    """
    if not 1 <= quality <= 100:
        raise ValueError(f"expected a JPEG quality in [1, 100], got {quality}")
    for image in images:
        check_rgb_chw(image)
    if not images:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        encoded = encode_jpeg([image.contiguous() for image in images], quality=quality)
    return [_to_bytes(data) for data in encoded]


def encode_jpeg_device(image: Tensor, quality: int = JPEG_QUALITY) -> bytes:
    """One Tensor[3, H, W] uint8 RGB image on any device -> the bytes of a JPEG file."""
    return encode_jpegs_device([image], quality)[0]


def crop_box_device(image: Tensor, box: Sequence[float], gain: float = CROP_GAIN, pad: float = CROP_PAD_PX) -> Tensor:
    """One box cut out of an image tensor, grown as :func:`yolo.crops.crop_box` grows it.

    Args:
        image (Tensor[C, H, W]): the frame, on any device.
        box (Sequence[float]): ``(x1, y1, x2, y2)`` in ``image`` pixels.

    Returns:
        Tensor[C, h, w]: a view of the region, clipped to the image (empty when the box lies
        outside it).
    """
    if image.ndim != 3:
        raise ValueError(f"expected an image of shape (C, H, W), got {tuple(image.shape)}")
    top, bottom, left, right = crop_bounds(box, image.shape[1:], gain, pad)
    return image[:, top:bottom, left:right]


def crop_jpegs_device(image: Tensor, detections: Tensor | np.ndarray, quality: int = JPEG_QUALITY) -> list[bytes | None]:
    """Every detection's crop as a JPEG file, encoded on the image's device in one call.

    Args:
        image (Tensor[3, H, W]): ``uint8`` RGB frame, undrawn.
        detections (Tensor[M, 6] | np.ndarray[M, 6]): ``(x1, y1, x2, y2, score, class)`` rows in
            ``image`` pixels (see :func:`yolo.crops.crop_paths` for where each crop goes).

    Returns:
        list[bytes | None]: per detection, in order, the JPEG bytes, or None for a box whose
        crop is empty (outside the image).
    """
    check_rgb_chw(image)
    rows = detections.tolist() if isinstance(detections, Tensor) else np.asarray(detections).tolist()
    crops = [crop_box_device(image, row[:4]) for row in rows]
    kept = [crop for crop in crops if crop.numel()]
    encoded = iter(encode_jpegs_device(kept, quality))
    return [next(encoded) if crop.numel() else None for crop in crops]
