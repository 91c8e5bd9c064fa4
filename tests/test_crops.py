"""--save-crop's cut-outs against a transcription of Ultralytics' save_one_box (xyxy -> xywh,
grow, back, truncate, clip), and detect.py's file numbering."""

import numpy as np
import pytest
import torch
from torchvision.ops import box_convert

from yolo.crops import crop_box, crop_paths


def reference_crop(image, box, gain=1.02, pad=10):
    b = box_convert(torch.tensor([box], dtype=torch.float64), "xyxy", "cxcywh")
    b[:, 2:] = b[:, 2:] * gain + pad
    xyxy = box_convert(b, "cxcywh", "xyxy").long()
    xyxy[:, 0::2] = xyxy[:, 0::2].clamp(0, image.shape[1])
    xyxy[:, 1::2] = xyxy[:, 1::2].clamp(0, image.shape[0])
    x1, y1, x2, y2 = xyxy[0].tolist()
    return image[y1:y2, x1:x2]


@pytest.mark.parametrize("box", [(20.0, 30.0, 120.5, 90.2), (-15.0, -3.0, 40.0, 20.0), (150.0, 80.0, 260.0, 130.0),
                                 (0.0, 0.0, 200.0, 100.0), (99.7, 49.2, 100.1, 49.9)])
def test_a_crop_is_the_box_grown_as_detect_py_grows_it(box):
    image = np.random.default_rng(0).integers(0, 255, (100, 200, 3), dtype=np.uint8)
    crop = crop_box(image, box)
    assert np.array_equal(crop, reference_crop(image, box))
    assert crop.base is None or not np.shares_memory(crop, image)  # a copy: the slot may be reused


def test_a_box_outside_the_image_gives_an_empty_crop_and_a_bad_image_is_refused():
    image = np.zeros((50, 60, 3), np.uint8)
    assert crop_box(image, (500.0, 500.0, 600.0, 600.0)).size == 0
    with pytest.raises(ValueError, match="expected an image of shape"):
        crop_box(np.zeros((50, 60), np.uint8), (0, 0, 10, 10))


def test_crops_are_numbered_per_class_as_detect_py_numbers_them():
    names = ["person", "bicycle", "car"]
    assert crop_paths("bus.jpg", [0, 0, 2, 0, 7], names) == [
        "crops/person/bus.jpg", "crops/person/bus2.jpg", "crops/car/bus.jpg", "crops/person/bus3.jpg", "crops/7/bus.jpg"]
    assert crop_paths("clip.mp4:000005", [1], names) == ["crops/bicycle/clip_5.jpg"]  # video frames counted from 1
