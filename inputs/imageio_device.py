"""Decoding image files into RGB ``CHW`` tensors on a device: the twin of
:func:`inputs.imageio.decode_image` for the device data path.

JPEGs go to ``torchvision.io.decode_jpeg(..., device=...)`` (nvJPEG on CUDA, batched where given
a list; libjpeg on the CPU), their EXIF orientation applied with tensor ops (torchvision applies
it on the CPU only; OpenCV's ``IMREAD_COLOR``, the host path, always applies it). A frame the
device decoder refuses (another format, a JPEG it cannot read) is decoded on the host by
:func:`inputs.imageio.decode_image` and uploaded: :attr:`DeviceImage.decoded_on` says so and
:attr:`DeviceImage.reason` says why. Bytes nothing can decode, an empty file or an image over
the pixel limit raise :class:`~inputs.frames.FrameReadError`, as on the host path.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg

from inputs.frames import FrameReadError
from inputs.imageio import DecodeOptions, check_pixel_limit, decode_image, exif_orientation, image_size, is_jpeg
from yolo.letterbox_device import upload_bgr

_SOURCE_PLACE = re.compile(r"^\S+, \S+:\d+, ")  # "decode_jpeg, .../decode_jpeg.cpp:171, " before the reason


@dataclass(frozen=True, eq=False)
class DeviceImage:
    """A decoded frame on the device.

    Attributes:
        image (Tensor[3, H, W]): ``uint8`` RGB pixels on the device, EXIF orientation applied.
        original_shape (tuple[int, int]): ``(H, W)``.
        decoded_on (str): ``"device"``, or ``"host"`` when the device decoder refused the frame.
        reason (str): why the host decoded it; ``""`` when the device did.
    """

    image: Tensor
    original_shape: tuple[int, int]
    decoded_on: str = "device"
    reason: str = ""


def orient(image: Tensor, orientation: int) -> Tensor:
    """Tensor[C, H, W] as EXIF ``orientation`` says to show it (1: as stored; 5-8 swap H and W)."""
    if orientation in (5, 6, 7, 8):
        image = image.transpose(1, 2)
    flips = {2: (2,), 3: (1, 2), 4: (1,), 6: (2,), 7: (1, 2), 8: (1,)}.get(orientation)
    return (image.flip(flips) if flips else image).contiguous()


def _host_decoded(data: np.ndarray, device: torch.device, options: DecodeOptions, what: str,
                  reason: str) -> DeviceImage:
    image = decode_image(data, options, what)[0]
    return DeviceImage(upload_bgr(image, device), (image.shape[0], image.shape[1]), "host", reason)


def _device_decoded(image: Tensor, data: np.ndarray) -> DeviceImage:
    image = orient(image, exif_orientation(data))
    return DeviceImage(image, (image.shape[1], image.shape[2]))


def _decode_jpeg(tensor: Tensor, device: torch.device) -> Tensor | str:
    try:
        return decode_jpeg(tensor, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as error:
        message = _SOURCE_PLACE.sub("", str(error).strip().splitlines()[-1])
        return f"device decoder refused it ({message[:200]})"


def _decode_jpegs(datas: list[np.ndarray], device: torch.device) -> list[Tensor | str]:
    """Per JPEG, its RGB tensor, or why the device decoder refused it. A batch that fails is
    retried one frame at a time, so one bad frame costs only itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")  # read only: decoders only read
        tensors = [torch.from_numpy(data) for data in datas]
        if len(tensors) > 1:
            try:
                return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                pass  # the whole batch fails for one bad frame: find it frame by frame
        return [_decode_jpeg(tensor, device) for tensor in tensors]


def decode_images_device(datas: Sequence[np.ndarray], device: torch.device | str, options: DecodeOptions,
                         names: Sequence[str]) -> list[DeviceImage | FrameReadError]:
    """Decode encoded images onto ``device``, the JPEGs among them in one batch.

    Args:
        datas (Sequence[np.ndarray[N]]): ``uint8`` bytes of each file.
        device (torch.device | str): where the pixels go.
        options (DecodeOptions): the pixel limit; ``mode`` must be ``"full"`` (no reduced decode
            on the device).
        names (Sequence[str]): each image's name, for error messages.

    Returns:
        list[DeviceImage | FrameReadError]: per image, in order, its pixels or why it failed.
    """
    if options.mode != "full":
        raise ValueError(f"decode: expected 'full' on the device data path, got {options.mode!r}")
    if len(datas) != len(names):
        raise ValueError(f"expected one name per image, got {len(names)} names for {len(datas)} images")
    device = torch.device(device)
    results: list[DeviceImage | FrameReadError | None] = [None] * len(datas)
    jpegs = []
    for index, (data, what) in enumerate(zip(datas, names)):
        try:
            if data.size == 0:
                raise FrameReadError(f"cannot decode image (empty file): {what}")
            size = image_size(data)
            if size is not None:
                check_pixel_limit(size, options.max_pixels, what)
            if is_jpeg(data):
                jpegs.append(index)
            else:
                results[index] = _host_decoded(data, device, options, what, "not a JPEG")
        except FrameReadError as error:
            results[index] = error
    decoded = _decode_jpegs([np.ascontiguousarray(datas[i]) for i in jpegs], device) if jpegs else []
    for index, image in zip(jpegs, decoded):
        try:
            results[index] = (_device_decoded(image, datas[index]) if isinstance(image, Tensor)
                              else _host_decoded(datas[index], device, options, names[index], image))
        except FrameReadError as error:
            results[index] = error
    return results


def decode_image_device(data: np.ndarray, device: torch.device | str, options: DecodeOptions,
                        what: str) -> DeviceImage:
    """One image's bytes onto ``device`` (see :func:`decode_images_device`); raises
    :class:`FrameReadError` for bytes nothing can decode."""
    result = decode_images_device([data], device, options, [what])[0]
    if isinstance(result, FrameReadError):
        raise result
    return result


def read_image_device(path: str, device: torch.device | str, options: DecodeOptions) -> DeviceImage:
    """Read and :func:`decode_image_device` the file at ``path``."""
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as error:
        raise FrameReadError(f"cannot read image: {path} ({error.strerror})") from error
    return decode_image_device(data, device, options, path)
