import numpy as np
import pytest
import torch

from yolo.letterbox import LetterboxInfo, bgr_to_rgb_chw, letterbox, letterbox_shape, to_bgr
from yolo.tensors import to_tensor


def _reference_geometry(h, w, imgsz, stride, rect, scaleup):
    """Plain-python letterbox geometry: (new_h, new_w, top, bottom, left, right, pad_w, pad_h)."""
    r = imgsz / h if imgsz / h < imgsz / w else imgsz / w
    if not scaleup and r > 1:
        r = 1.0
    new_w = max(round(w * r), 1)
    new_h = max(round(h * r), 1)
    pad_w = imgsz - new_w
    pad_h = imgsz - new_h
    if rect:
        pad_w = pad_w - stride * (pad_w // stride)
        pad_h = pad_h - stride * (pad_h // stride)
    left, right = round(pad_w / 2 - 0.1), round(pad_w / 2 + 0.1)
    top, bottom = round(pad_h / 2 - 0.1), round(pad_h / 2 + 0.1)
    return new_h, new_w, top, bottom, left, right, pad_w, pad_h


def _image(h, w, c=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w) if c is None else (h, w, c)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


@pytest.mark.parametrize(
    "shape, rect, expected",
    [
        ((1080, 810), True, (640, 480)),
        ((810, 1080), True, (480, 640)),
        ((720, 1280), False, (640, 640)),
        ((720, 1280), True, (384, 640)),
        ((1, 1), False, (640, 640)),
        ((1, 1), True, (640, 640)),
    ],
)
def test_letterbox_output_shape(shape, rect, expected):
    out, info = letterbox(_image(*shape), imgsz=640, rect=rect)
    assert out.shape == (*expected, 3)
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    assert info.shape == expected
    assert info.original_shape == shape
    assert letterbox_shape(shape, 640, rect=rect) == expected


@pytest.mark.parametrize("h", [1, 7, 33, 480, 481, 719, 1080, 5000])
@pytest.mark.parametrize("w", [1, 20, 333, 640, 1279])
@pytest.mark.parametrize("rect", [False, True])
@pytest.mark.parametrize("scaleup", [False, True])
def test_letterbox_matches_reference_geometry(h, w, rect, scaleup):
    new_h, new_w, top, bottom, left, right, pad_w, pad_h = _reference_geometry(h, w, 640, 32, rect, scaleup)
    expected = (new_h + top + bottom, new_w + left + right)
    assert letterbox_shape((h, w), 640, 32, rect, scaleup) == expected
    out, info = letterbox(np.full((h, w, 3), 200, np.uint8), 640, 32, rect, scaleup)
    assert out.shape[:2] == expected
    assert info.pad == (pad_w / 2, pad_h / 2)
    assert (out[top : top + new_h, left : left + new_w] == 200).all()
    assert (out[:top] == 114).all() and (out[top + new_h :] == 114).all()
    assert (out[:, :left] == 114).all() and (out[:, left + new_w :] == 114).all()
    if rect:
        assert out.shape[0] % 32 == 0 and out.shape[1] % 32 == 0


def test_letterbox_same_size_is_copied_not_resized():
    image = _image(640, 640)
    out, info = letterbox(image)
    assert info.ratio == 1.0 and info.pad == (0.0, 0.0)
    np.testing.assert_array_equal(out, image)


def test_letterbox_no_scaleup_keeps_small_image():
    image = _image(100, 200)
    out, info = letterbox(image, scaleup=False)
    assert info.ratio == 1.0
    assert info.pad == (220.0, 270.0)
    np.testing.assert_array_equal(out[270:370, 220:420], image)


def test_letterbox_very_elongated():
    out, info = letterbox(_image(5000, 20))
    assert out.shape == (640, 640, 3)
    out, info = letterbox(_image(1, 100000, seed=1))
    assert out.shape == (640, 640, 3)
    out, _ = letterbox(_image(1, 100000, seed=1), rect=True)
    assert out.shape == (32, 640, 3)


def test_letterbox_pad_value():
    out, _ = letterbox(np.zeros((10, 20, 3), np.uint8), imgsz=64, pad_value=7)
    assert out[0, 0, 0] == 7 and out[32, 32, 0] == 0


@pytest.mark.parametrize("imgsz, stride", [(0, 32), (-32, 32), (100, 32), (640, 0)])
def test_letterbox_bad_sizes(imgsz, stride):
    with pytest.raises(ValueError, match="expected"):
        letterbox(_image(10, 10), imgsz=imgsz, stride=stride)


@pytest.mark.parametrize("channels", [None, 1, 4])
def test_to_bgr_converts(channels):
    image = _image(5, 6, channels)
    out = to_bgr(image)
    assert out.shape == (5, 6, 3) and out.dtype == np.uint8
    if channels == 4:
        np.testing.assert_array_equal(out, image[:, :, :3])
    else:
        gray = image if channels is None else image[:, :, 0]
        for c in range(3):
            np.testing.assert_array_equal(out[:, :, c], gray)


@pytest.mark.parametrize("channels", [None, 1, 4])
def test_letterbox_accepts_gray_and_bgra(channels):
    out, _ = letterbox(_image(30, 50, channels), imgsz=64)
    assert out.shape == (64, 64, 3)


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((5, 6, 2), np.uint8),
        np.zeros((5, 6, 5), np.uint8),
        np.zeros((5,), np.uint8),
        np.zeros((1, 5, 6, 3), np.uint8),
        np.zeros((5, 6, 3), np.float32),
        np.zeros((0, 6, 3), np.uint8),
        np.zeros((5, 0), np.uint8),
    ],
)
def test_to_bgr_bad_input(image):
    with pytest.raises(ValueError, match="expected"):
        to_bgr(image)
    with pytest.raises(ValueError, match="expected"):
        letterbox(image)


def test_letterbox_info_is_frozen():
    info = LetterboxInfo(ratio=1.0, pad=(0.0, 0.0), original_shape=(1, 1), shape=(1, 1))
    with pytest.raises(AttributeError):
        info.ratio = 2.0


def _reference_tensor(image):
    h, w, _ = image.shape
    out = torch.empty(3, h, w)
    for c in range(3):
        for y in range(h):
            for x in range(w):
                out[c, y, x] = float(image[y, x, 2 - c]) / 255
    return out


def test_to_tensor_single_image():
    image = _image(4, 5)
    out = to_tensor(image, "cpu")
    assert out.shape == (1, 3, 4, 5) and out.dtype == torch.float32 and out.is_contiguous()
    torch.testing.assert_close(out[0], _reference_tensor(image))
    assert 0.0 <= out.min() and out.max() <= 1.0


def test_to_tensor_rgb_order():
    image = np.zeros((2, 2, 3), np.uint8)
    image[..., 0] = 255
    out = to_tensor(image, "cpu")
    assert out[0, 2].eq(1).all() and out[0, :2].eq(0).all()


@pytest.mark.parametrize("as_list", [False, True])
def test_to_tensor_batch(as_list):
    images = [_image(3, 4, seed=i) for i in range(3)]
    batch = images if as_list else np.stack(images)
    out = to_tensor(batch, torch.device("cpu"), dtype=torch.float64)
    assert out.shape == (3, 3, 3, 4) and out.dtype == torch.float64
    for i, image in enumerate(images):
        torch.testing.assert_close(out[i].float(), _reference_tensor(image))


def test_to_tensor_bad_input():
    with pytest.raises(ValueError, match="expected"):
        to_tensor([_image(3, 4), _image(4, 3)], "cpu")
    with pytest.raises(ValueError, match="expected"):
        to_tensor([], "cpu")
    with pytest.raises(ValueError, match="expected"):
        to_tensor(np.zeros((3, 4, 3), np.float32), "cpu")
    with pytest.raises(ValueError, match="expected"):
        to_tensor(np.zeros((3, 4), np.uint8), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_to_tensor_cuda_matches_cpu():
    image = _image(17, 9)
    torch.testing.assert_close(to_tensor(image, "cuda").cpu(), to_tensor(image, "cpu"))
    half = to_tensor(image, "cuda", dtype=torch.float16)
    assert half.dtype == torch.float16 and half.device.type == "cuda"


def test_bgr_to_rgb_chw():
    image = _image(4, 5)
    out = bgr_to_rgb_chw(image)
    assert out.shape == (3, 4, 5) and out.dtype == np.uint8 and out.flags.c_contiguous
    torch.testing.assert_close(torch.from_numpy(out).float() / 255, _reference_tensor(image))
    with pytest.raises(ValueError, match="expected"):
        bgr_to_rgb_chw(np.zeros((4, 5), np.uint8))


@pytest.mark.parametrize("shape", [(1080, 810, 3), (720, 1280, 3), (100, 2000, 3), (640, 480, 3), (300, 200),
                                   (90, 70, 4)])
@pytest.mark.parametrize("rect", [True, False])
@pytest.mark.parametrize("scaleup", [True, False])
def test_letterbox_into_planes_equals_letterbox_then_planes(shape, rect, scaleup):
    """The one-pass form that preprocess writes into a frame slot gives the same bytes."""
    from yolo.letterbox import bgr_to_rgb_chw, letterbox_layout, letterbox_rgb_chw
    image = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    boxed, info = letterbox(image, 320, 32, rect=rect, scaleup=scaleup)
    out = np.full((3, *letterbox_layout(shape, 320, 32, rect, scaleup)[0].shape), 7, np.uint8)  # stale bytes
    written, info_into = letterbox_rgb_chw(image, 320, 32, rect=rect, scaleup=scaleup, out=out)
    assert written is out and info_into == info
    np.testing.assert_array_equal(out, bgr_to_rgb_chw(boxed))
    np.testing.assert_array_equal(letterbox_rgb_chw(image, 320, 32, rect=rect, scaleup=scaleup)[0], out)
    with pytest.raises(ValueError, match="expected out of shape"):
        letterbox_rgb_chw(image, 320, 32, rect=rect, scaleup=scaleup, out=np.empty((3, 32, 32), np.uint8))
