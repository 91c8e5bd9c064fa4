import numpy as np
import pytest
import torch

from yolo.boxes import box_iou, clip_boxes, scale_boxes, unreduce_boxes, xywh_to_xyxy, xyxy_to_xywh
from yolo.letterbox import LetterboxInfo, letterbox


def _random_xyxy(n, seed=0, size=100.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 2
    return torch.cat((xy, xy + wh), dim=1)


def test_xywh_to_xyxy_known_values():
    boxes = torch.tensor([[10.0, 20.0, 4.0, 6.0], [0.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([[8.0, 17.0, 12.0, 23.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(xywh_to_xyxy(boxes), expected)
    torch.testing.assert_close(xyxy_to_xywh(expected), boxes)


def test_conversions_round_trip_and_keep_dtype():
    boxes = _random_xyxy(50)
    torch.testing.assert_close(xywh_to_xyxy(xyxy_to_xywh(boxes)), boxes)
    half = boxes.half()
    assert xyxy_to_xywh(half).dtype == torch.float16
    assert xywh_to_xyxy(torch.zeros(0, 4)).shape == (0, 4)


@pytest.mark.parametrize("fn", [xywh_to_xyxy, xyxy_to_xywh, lambda b: clip_boxes(b, (5, 5))])
def test_bad_box_shape(fn):
    with pytest.raises(ValueError, match="expected boxes of shape"):
        fn(torch.zeros(3, 5))


def test_clip_boxes():
    boxes = torch.tensor([[-5.0, -1.0, 50.0, 30.0], [1.0, 2.0, 3.0, 4.0]])
    clipped = clip_boxes(boxes, (20, 40))
    torch.testing.assert_close(clipped, torch.tensor([[0.0, 0.0, 40.0, 20.0], [1.0, 2.0, 3.0, 4.0]]))
    assert boxes[0, 0] == -5.0


@pytest.mark.parametrize("shape", [(720, 1280), (1080, 810), (37, 53), (5000, 20), (100, 200)])
@pytest.mark.parametrize("rect", [False, True])
@pytest.mark.parametrize("scaleup", [False, True])
def test_scale_boxes_inverts_letterbox(shape, rect, scaleup):
    h, w = shape
    _, info = letterbox(np.zeros((h, w, 3), np.uint8), 640, rect=rect, scaleup=scaleup)
    original = torch.tensor([[0.1 * w, 0.2 * h, 0.7 * w, 0.9 * h], [0.0, 0.0, w, h]])
    left = round(info.pad[0] - 0.1)
    top = round(info.pad[1] - 0.1)
    new_w = info.shape[1] - round(info.pad[0] - 0.1) - round(info.pad[0] + 0.1)
    new_h = info.shape[0] - round(info.pad[1] - 0.1) - round(info.pad[1] + 0.1)
    sx, sy = new_w / w, new_h / h
    in_letterbox = torch.stack(
        (
            original[:, 0] * sx + left,
            original[:, 1] * sy + top,
            original[:, 2] * sx + left,
            original[:, 3] * sy + top,
        ),
        dim=1,
    )
    back = scale_boxes(in_letterbox, info)
    error_in_letterbox_pixels = (back - original).abs().max() * info.ratio
    assert error_in_letterbox_pixels <= 1.0
    if info.ratio >= 1.0:
        assert (back - original).abs().max() <= 1.0
    assert back[:, 0::2].min() >= 0 and back[:, 0::2].max() <= w
    assert back[:, 1::2].min() >= 0 and back[:, 1::2].max() <= h


def test_scale_boxes_known_values_and_no_mutation():
    info = LetterboxInfo(ratio=0.5, pad=(0.0, 140.0), original_shape=(720, 1280), shape=(640, 640))
    boxes = torch.tensor([[10.0, 150.0, 110.0, 250.0], [-20.0, 100.0, 700.0, 600.0]])
    before = boxes.clone()
    out = scale_boxes(boxes, info)
    expected = torch.tensor([[20.0, 20.0, 220.0, 220.0], [0.0, 0.0, 1280.0, 720.0]])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(boxes, before)


def test_box_iou_is_torchvision():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    torch.testing.assert_close(box_iou(a, b), torch.tensor([[1 / 3, 0.0]]))


def test_unreduce_boxes_scales_by_the_factor_and_clips():
    boxes = torch.tensor([[1.0, 2.0, 10.5, 20.0], [400.0, 300.0, 406.0, 310.0]])
    out = unreduce_boxes(boxes, 2, (615, 811))  # a 811 x 615 image decoded at 1/2 is 406 x 308
    torch.testing.assert_close(out, torch.tensor([[2.0, 4.0, 21.0, 40.0], [800.0, 600.0, 811.0, 615.0]]))
    assert unreduce_boxes(boxes, 1, (1000, 1000)).equal(boxes)
    with pytest.raises(ValueError, match="reduction in"):
        unreduce_boxes(boxes, 3, (10, 10))
