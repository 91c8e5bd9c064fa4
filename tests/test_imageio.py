import os
import struct
import subprocess
import sys
import textwrap
import zlib

import cv2
import numpy as np
import pytest
import torch

from tests.conftest import REPO_ROOT
from yolo.boxes import unreduce_boxes
from inputs.frames import FrameReadError
from inputs.imageio import DecodeOptions, decode_image, image_size, read_image, reduction_for

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def encode(image: np.ndarray, ext: str, params=()) -> np.ndarray:
    ok, data = cv2.imencode(ext, image, list(params))
    assert ok
    return data


def with_exif_orientation(jpeg: np.ndarray, orientation: int) -> np.ndarray:
    """The JPEG with an APP1 EXIF segment holding one Orientation tag, right after SOI."""
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)
    payload = b"Exif\x00\x00" + tiff + b"\x00\x00\x00\x00"
    data = jpeg.tobytes()
    return np.frombuffer(data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:], np.uint8)


def huge_png(path, width: int, height: int) -> None:
    """A valid 1-bit grey PNG of width x height, all black, written row by row: a few KiB on
    disk for what decodes to width * height * 3 bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte, then the packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
                + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.mark.parametrize("ext, params", [
    (".jpg", ()), (".jpg", (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)), (".png", ()), (".bmp", ()), (".webp", ()),
    (".webp", (cv2.IMWRITE_WEBP_QUALITY, 101)), (".tif", ()), (".tif", (cv2.IMWRITE_TIFF_COMPRESSION, 1)),
])
@pytest.mark.parametrize("shape", [(37, 53), (300, 17)])
def test_image_size_matches_the_decoded_shape(ext, params, shape):
    data = encode(np.zeros((*shape, 3), np.uint8), ext, params)
    assert image_size(data) == (shape[1], shape[0])
    assert cv2.imdecode(data, cv2.IMREAD_COLOR).shape[:2] == shape


def test_image_size_edge_cases():
    jpeg = encode(np.zeros((20, 30, 3), np.uint8), ".jpg").tobytes()
    big_app = b"\xff\xe2" + struct.pack(">H", 65535) + b"\0" * 65533  # 64 KiB of metadata before SOF
    assert image_size(jpeg[:2] + big_app + big_app + jpeg[2:]) == (30, 20)
    assert image_size(b"") is None and image_size(b"GIF89a....") is None
    assert image_size(jpeg[:20]) is None  # cut before its SOF
    assert image_size(encode(np.zeros((4, 4, 3), np.uint8), ".png")[:20]) is None


def test_pixel_limit_is_checked_before_decoding(tmp_path):
    path = tmp_path / "huge.png"
    huge_png(path, 20000, 20000)
    assert path.stat().st_size < 200_000 and image_size(path.read_bytes()) == (20000, 20000)
    with pytest.raises(FrameReadError, match=r"image is 20000x20000 = 400.0 MP, over the limit of 100.0 MP "
                                             r"\(max_pixels 100000000\), not decoded: .*huge.png"):
        read_image(str(path), DecodeOptions())
    script = textwrap.dedent(f"""
        import resource, sys
        from inputs.imageio import DecodeOptions, read_image
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if sys.argv[1] == "read":
            try:
                read_image({str(path)!r}, DecodeOptions())
            except ValueError:
                pass
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    grown_kib = [int(subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, check=True,
                                    cwd=str(tmp_path), env=ENV).stdout) for arg in ("read", "")]
    assert grown_kib[0] - grown_kib[1] < 20_000  # a decode would take 1.2 GB


def test_pixel_limit_option():
    data = encode(np.zeros((20, 30, 3), np.uint8), ".png")
    with pytest.raises(FrameReadError, match="30x20 .*max_pixels 599"):
        decode_image(data, DecodeOptions(max_pixels=599), "small.png")
    assert decode_image(data, DecodeOptions(max_pixels=600), "small.png")[0].shape == (20, 30, 3)


def test_opencv_pixel_limit_reaches_spawned_processes(tmp_path):
    script = tmp_path / "limit.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing
        import numpy as np
        from inputs.imageio import DecodeOptions, decode_image, set_opencv_pixel_limit

        def decode(_):
            import cv2
            data = cv2.imencode(".png", np.zeros((100, 100, 3), np.uint8))[1]
            try:
                return str(decode_image(data, DecodeOptions(), "100x100.png")[0].shape)
            except ValueError as error:
                return str(error)

        if __name__ == "__main__":
            set_opencv_pixel_limit(1000)
            print(decode(None))  # this process loaded cv2 before: unaffected
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                print(pool.map(decode, [None])[0])
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env=ENV).stdout.splitlines()
    assert out[0] == "(100, 100, 3)"
    assert out[1].startswith("cannot decode image: 100x100.png") and "CV_IO_MAX_IMAGE_PIXELS" in out[1]


@pytest.mark.parametrize("size, imgsz, factor", [
    ((810, 1080), 320, 2), ((1280, 720), 320, 2), ((1280, 720), 640, 1), ((2560, 2560), 320, 8),
    ((2559, 4000), 320, 4), ((639, 5000), 320, 1),
])
def test_reduction_for(size, imgsz, factor):
    assert reduction_for(size, imgsz) == factor


@pytest.mark.parametrize("shape, box", [((1081, 1601), (301, 203, 977, 851)), ((1300, 2600), (0, 0, 2600, 1300))])
def test_reduced_decode_boxes_map_back_to_full_size(shape, box):
    image = np.zeros((*shape, 3), np.uint8)
    x1, y1, x2, y2 = box
    image[y1:y2, x1:x2] = 255
    reduced, original_shape, factor = decode_image(encode(image, ".jpg"), DecodeOptions("reduced", imgsz=320), "r.jpg")
    assert original_shape == shape and factor == reduction_for((shape[1], shape[0]), 320) > 1
    assert reduced.shape[:2] == (-(-shape[0] // factor), -(-shape[1] // factor))  # libjpeg rounds up
    ys, xs = np.nonzero(reduced[..., 0] > 127)
    found = torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float32)
    mapped = unreduce_boxes(found, factor, original_shape)[0].tolist()
    assert all(abs(a - b) <= factor for a, b in zip(mapped, box))  # within one reduced pixel


def test_reduced_decode_keeps_exif_orientation():
    image = np.zeros((700, 1000, 3), np.uint8)
    rotated = with_exif_orientation(encode(image, ".jpg"), 6)  # shown turned a quarter: 1000 high, 700 wide
    full, full_shape, _ = decode_image(rotated, DecodeOptions(), "r.jpg")
    reduced, original_shape, factor = decode_image(rotated, DecodeOptions("reduced", imgsz=320), "r.jpg")
    assert full.shape[:2] == full_shape == original_shape == (1000, 700)
    assert (factor, reduced.shape[:2]) == (2, (500, 350))


def test_decode_full_and_non_jpeg_never_reduced():
    image = np.zeros((1400, 1400, 3), np.uint8)
    for ext in (".png", ".webp", ".bmp"):
        decoded, shape, factor = decode_image(encode(image, ext), DecodeOptions("reduced", imgsz=320), "x" + ext)
        assert (factor, shape, decoded.shape) == (1, (1400, 1400), (1400, 1400, 3))
    assert decode_image(encode(image, ".jpg"), DecodeOptions(imgsz=320), "x.jpg")[2] == 1


def test_decode_errors_and_options():
    with pytest.raises(FrameReadError, match="empty file"):
        decode_image(np.zeros(0, np.uint8), DecodeOptions(), "e.jpg")
    with pytest.raises(FrameReadError, match="cannot decode image: b.jpg"):
        decode_image(np.frombuffer(b"\xff\xd8\xff garbage", np.uint8), DecodeOptions(), "b.jpg")
    with pytest.raises(ValueError, match="decode: expected one of"):
        DecodeOptions("half")
    with pytest.raises(ValueError, match="max_pixels"):
        DecodeOptions(max_pixels=0)



@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_full_jpeg_decode_gives_opencvs_pixels_in_every_exif_orientation(orientation):
    """JPEGs are decoded by simplejpeg (libjpeg-turbo, cheaper than cv2.imdecode): the same
    pixels as OpenCV's decode, EXIF orientation applied as OpenCV applies it."""
    rng = np.random.default_rng(orientation)
    image = cv2.GaussianBlur(rng.integers(0, 255, (96, 160, 3), np.uint8), (5, 5), 0)
    data = with_exif_orientation(encode(image, ".jpg"), orientation)
    decoded, full_shape, factor = decode_image(data, DecodeOptions(), "x.jpg")
    expected = cv2.imdecode(data, cv2.IMREAD_COLOR)
    assert decoded.shape == expected.shape and full_shape == expected.shape[:2] and factor == 1
    assert np.array_equal(decoded, expected)


def test_a_jpeg_simplejpeg_refuses_is_decoded_by_opencv():
    """A damaged JPEG (its last bytes cut) that libjpeg can still show: OpenCV's decode, as before."""
    data = encode(np.full((64, 64, 3), 128, np.uint8), ".jpg")
    cut = data[:-40]
    expected = cv2.imdecode(cut, cv2.IMREAD_COLOR)
    if expected is None:
        with pytest.raises(FrameReadError):
            decode_image(cut, DecodeOptions(), "cut.jpg")
    else:
        assert np.array_equal(decode_image(cut, DecodeOptions(), "cut.jpg")[0], expected)
