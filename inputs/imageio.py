"""Reading image files within limits: the size from the header before decoding, a pixel
limit, and an optional reduced JPEG decode.

- :func:`image_size` reads ``(w, h)`` from the first bytes of a JPEG, PNG, BMP, WebP or TIFF
  file (a few lines per format rather than Pillow: ``PIL.Image.open`` applies Pillow's own
  process-wide decompression-bomb limit, which refuses images over ~179 MP without saying
  their width and height, and the bytes are already in memory for ``cv2.imdecode``).
- :func:`read_image` refuses an image over ``max_pixels`` before decoding it, then decodes it
  in full or, with ``mode="reduced"``, a JPEG at least 2x/4x/8x larger than ``imgsz`` on both
  sides with ``IMREAD_REDUCED_COLOR_2/4/8`` (libjpeg-turbo decodes at that scale directly;
  OpenCV's other decoders decode in full and then resize, which saves nothing, so they are
  always decoded in full). Boxes found on a reduced image map back to full-size pixels with
  :func:`yolo.boxes.unreduce_boxes`.
- :func:`set_opencv_pixel_limit` sets OpenCV's own limit, ``OPENCV_IO_MAX_IMAGE_PIXELS``, the
  second line of defence for formats :func:`image_size` does not parse.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import cv2
import numpy as np
import simplejpeg

from inputs.frames import FrameReadError

DEFAULT_MAX_PIXELS = 100_000_000
DECODE_MODES = ("full", "reduced")
REDUCTIONS = (8, 4, 2)  # largest first
_REDUCED_FLAGS = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0..SOF15 less DHT, JPG, DAC
_JPEG_STANDALONE_MARKERS = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length
_EXIF_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class DecodeOptions:
    """How image files are decoded.

    Attributes:
        mode (str): ``"full"``, or ``"reduced"`` for a reduced JPEG decode when the image is at
            least 2x larger than ``imgsz`` on both sides.
        imgsz (int): the letterbox target size the reduction is measured against.
        max_pixels (int): an image with more pixels is refused before decoding.
    """

    mode: str = "full"
    imgsz: int = 640
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.mode not in DECODE_MODES:
            raise ValueError(f"decode: expected one of {DECODE_MODES}, got {self.mode!r}")
        if isinstance(self.imgsz, bool) or not isinstance(self.imgsz, int) or self.imgsz <= 0:
            raise ValueError(f"imgsz: expected an int > 0, got {self.imgsz!r}")
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels <= 0:
            raise ValueError(f"max_pixels: expected an int > 0, got {self.max_pixels!r}")


def _png_size(data: memoryview) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    return None


def _bmp_size(data: memoryview) -> tuple[int, int] | None:
    if data[:2] != b"BM" or len(data) < 26:
        return None
    if struct.unpack("<I", data[14:18])[0] == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        return struct.unpack("<HH", data[18:22])
    width, height = struct.unpack("<ii", data[18:26])
    return abs(width), abs(height)  # a negative height is a top-down bitmap


def _webp_size(data: memoryview) -> tuple[int, int] | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        bits = struct.unpack("<I", data[21:25])[0]
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _tiff_size(data: memoryview) -> tuple[int, int] | None:
    order = {b"II": "<", b"MM": ">"}.get(bytes(data[:2]))
    if order is None or len(data) < 8 or struct.unpack(order + "H", data[2:4])[0] != 42:  # 43: BigTIFF
        return None
    ifd = struct.unpack(order + "I", data[4:8])[0]
    if len(data) < ifd + 2:
        return None
    sizes = {}
    for entry in range(struct.unpack(order + "H", data[ifd:ifd + 2])[0]):
        start = ifd + 2 + 12 * entry
        if len(data) < start + 12:
            return None
        tag, kind = struct.unpack(order + "HH", data[start:start + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT (3) or LONG (4)
            sizes[tag] = struct.unpack(order + ("H" if kind == 3 else "I"), data[start + 8:start + (10 if kind == 3 else 12)])[0]
    return (sizes[256], sizes[257]) if len(sizes) == 2 else None


def _jpeg_size(data: memoryview) -> tuple[int, int] | None:
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_STANDALONE_MARKERS:
            at += 2
            continue
        if marker in _JPEG_SOF_MARKERS:
            if at + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return (width, height) if height else None  # height 0: set later by a DNL marker
        at += 2 + struct.unpack(">H", data[at + 2:at + 4])[0]
    return None


def is_jpeg(data: bytes | np.ndarray) -> bool:
    return bytes(data[:3]) == b"\xff\xd8\xff"


def image_size(data: bytes | np.ndarray) -> tuple[int, int] | None:
    """``(w, h)`` from the header of a JPEG, PNG, BMP, WebP or TIFF file's bytes; None for
    another format or a header it cannot parse. A JPEG's EXIF orientation is not applied (the
    decoded image may have ``w`` and ``h`` swapped)."""
    data = memoryview(data)  # no copy; slices compare to bytes and unpack like bytes
    for parse in (_jpeg_size, _png_size, _bmp_size, _webp_size, _tiff_size):
        size = parse(data)
        if size is not None:
            return int(size[0]), int(size[1])
    return None


def check_pixel_limit(size: tuple[int, int], max_pixels: int, what: str) -> None:
    """Raise :class:`FrameReadError` if an image of ``size`` ``(w, h)`` has more than
    ``max_pixels`` pixels."""
    width, height = size
    if width * height > max_pixels:
        raise FrameReadError(f"image is {width}x{height} = {width * height / 1e6:.1f} MP, over the limit of "
                             f"{max_pixels / 1e6:.1f} MP (max_pixels {max_pixels}), not decoded: {what}")


def reduction_for(size: tuple[int, int], imgsz: int) -> int:
    """The largest of 8, 4, 2 such that both sides of ``size`` are at least that many times
    ``imgsz``; 1 if none. The reduced image's short side stays >= ``imgsz``, so letterboxing
    still shrinks it."""
    short_side = min(size)
    return next((factor for factor in REDUCTIONS if short_side >= factor * imgsz), 1)


def decode_image(data: np.ndarray, options: DecodeOptions, what: str) -> tuple[np.ndarray, tuple[int, int], int]:
    """Decode an encoded image within ``options``.

    Args:
        data (np.ndarray[N]): ``uint8`` bytes of the file.
        options (DecodeOptions): mode, target size and pixel limit.
        what (str): the image's name, for error messages.

    Returns:
        tuple[np.ndarray[h, w, 3], tuple[int, int], int]: the BGR ``uint8`` image, the
        ``(H, W)`` a full decode gives (EXIF orientation applied, like the image), and the
        reduction factor used (1, 2, 4 or 8).

    Raises:
        FrameReadError: an empty file, an image over ``max_pixels``, or one OpenCV cannot decode.
    """
    if data.size == 0:
        raise FrameReadError(f"cannot decode image (empty file): {what}")
    size = image_size(data)
    if size is not None:
        check_pixel_limit(size, options.max_pixels, what)
    factor = 1
    if options.mode == "reduced" and size is not None and is_jpeg(data):
        factor = reduction_for(size, options.imgsz)
    image = _decode_full_jpeg(data) if factor == 1 and is_jpeg(data) else None
    try:
        if image is None:
            image = cv2.imdecode(data, _REDUCED_FLAGS[factor] if factor > 1 else cv2.IMREAD_COLOR)
    except cv2.error as error:  # OpenCV's own limit, OPENCV_IO_MAX_IMAGE_PIXELS
        raise FrameReadError(f"cannot decode image: {what} ({str(error).strip().splitlines()[-1]})") from error
    if image is None:
        raise FrameReadError(f"cannot decode image: {what}")
    if factor == 1:
        return image, (image.shape[0], image.shape[1]), 1
    width, height = size
    if image.shape[:2] != (-(-height // factor), -(-width // factor)):
        width, height = height, width  # EXIF orientation turned the image a quarter turn
    return image, (height, width), factor


def exif_orientation(data: bytes | np.ndarray) -> int:
    """The EXIF orientation (1-8) in a JPEG's APP1 segment; 1 when it has none or it cannot be
    read. Only the segments before the first scan are looked at."""
    data = memoryview(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data).cast("B")
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF and data[at + 1] not in (0xDA, 0xD9):
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if data[at + 1] == 0xE1 and bytes(data[at + 4:at + 10]) == b"Exif\0\0":
            return _tiff_orientation(bytes(data[at + 10:at + 2 + length]))
        at += 2 + length
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = struct.unpack(order + "I", tiff[4:8])[0]
    if len(tiff) < ifd + 2:
        return 1
    for entry in range(struct.unpack(order + "H", tiff[ifd:ifd + 2])[0]):
        start = ifd + 2 + 12 * entry
        if len(tiff) < start + 10:
            return 1
        if struct.unpack(order + "H", tiff[start:start + 2])[0] == _EXIF_ORIENTATION_TAG:
            value = struct.unpack(order + "H", tiff[start + 8:start + 10])[0]
            return value if 1 <= value <= 8 else 1
    return 1


def oriented(image: np.ndarray, orientation: int) -> np.ndarray:
    """An HxWxC image as EXIF ``orientation`` (1-8) says to show it, as cv2.imdecode turns it."""
    if orientation in (5, 6, 7, 8):
        image = image.transpose(1, 0, 2)
    flips = {2: (1,), 3: (0, 1), 4: (0,), 6: (1,), 7: (0, 1), 8: (0,)}.get(orientation)
    return np.ascontiguousarray(np.flip(image, flips)) if flips else image


def _decode_full_jpeg(data: np.ndarray) -> np.ndarray | None:
    """A JPEG decoded in full by libjpeg-turbo through simplejpeg: the pixels cv2.imdecode gives
    (the same library, default settings), at about 0.6-0.75x its CPU time on the fixtures (it
    skips OpenCV's extra buffer handling); EXIF orientation applied as OpenCV applies it. None
    where simplejpeg refuses (CMYK, a damaged file): OpenCV then tries, as before."""
    try:
        image = simplejpeg.decode_jpeg(data, colorspace="BGR")
    except ValueError:
        return None
    return oriented(image, exif_orientation(data))


def read_image(path: str, options: DecodeOptions) -> tuple[np.ndarray, tuple[int, int], int]:
    """Read and :func:`decode_image` the file at ``path``."""
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as error:
        raise FrameReadError(f"cannot read image: {path} ({error.strerror})") from error
    return decode_image(data, options, path)


def read_encoded(data: np.ndarray, options: DecodeOptions, what: str) -> tuple[np.ndarray, tuple[int, int]]:
    """An image file's bytes, checked as far as its header allows (not empty, within the pixel
    limit), left encoded for a decoder elsewhere (the device data path's); and ``(H, W)`` from
    that header (as stored: an EXIF rotation is applied by the decoder), ``(0, 0)`` when the
    header does not say."""
    if data.size == 0:
        raise FrameReadError(f"cannot decode image (empty file): {what}")
    size = image_size(data)
    if size is None:
        return data, (0, 0)
    check_pixel_limit(size, options.max_pixels, what)
    return data, (size[1], size[0])


def set_opencv_pixel_limit(max_pixels: int) -> None:
    """Set ``OPENCV_IO_MAX_IMAGE_PIXELS``, OpenCV's own limit on decoded image size, for
    processes started from now on.

    OpenCV reads the variable once, when its library loads (``import cv2``), not at the first
    decode: setting it later, even before any decode, does nothing in this process (measured
    with OpenCV 5.1). This module imports cv2, so call this in a parent process before it
    starts its workers (a ``spawn`` child loads cv2 afresh and inherits the environment).
    """
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels <= 0:
        raise ValueError(f"max_pixels: expected an int > 0, got {max_pixels!r}")
    os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(max_pixels)
