import numpy as np
import pytest
import torch

from yolo.draw import class_color, draw_detections
from yolo.names import COCO_NAMES, default_names


def test_class_colors_stable_and_distinct():
    colors = [class_color(i) for i in range(80)]
    assert colors == [class_color(i) for i in range(80)]
    assert len(set(colors)) == 80
    for color in colors:
        assert len(color) == 3 and all(isinstance(c, int) and 0 <= c <= 255 for c in color)
    for a, b in zip(colors, colors[1:]):
        assert sum(abs(x - y) for x, y in zip(a, b)) > 60


def test_draw_on_copy_by_default():
    image = np.zeros((100, 200, 3), np.uint8)
    detections = torch.tensor([[20.0, 30.0, 120.0, 90.0, 0.82, 0.0]])
    out = draw_detections(image, detections, COCO_NAMES)
    assert out is not image and image.sum() == 0
    assert out.shape == image.shape and out.dtype == np.uint8
    assert (out[60, 20] == class_color(0)).all()
    assert out[60, 70].sum() == 0


def test_draw_inplace_and_numpy_detections():
    image = np.zeros((100, 200, 3), np.uint8)
    detections = np.array([[20.0, 30.0, 120.0, 90.0, 0.5, 3.0]])
    out = draw_detections(image, detections, COCO_NAMES, line_width=3, inplace=True)
    assert out is image and image.sum() > 0


def test_labels_stay_inside_image():
    image = np.zeros((60, 80, 3), np.uint8)
    detections = torch.tensor([[-10.0, -10.0, 90.0, 70.0, 0.99, 5.0], [70.0, 50.0, 79.0, 59.0, 0.3, 999.0]])
    out = draw_detections(image, detections, ["a"])
    assert out.shape == image.shape and out.sum() > 0


def test_empty_detections_and_bad_image():
    image = np.full((10, 10, 3), 9, np.uint8)
    np.testing.assert_array_equal(draw_detections(image, torch.zeros(0, 6), COCO_NAMES), image)
    with pytest.raises(ValueError, match="expected a uint8 BGR image"):
        draw_detections(np.zeros((10, 10), np.uint8), torch.zeros(0, 6), COCO_NAMES)


def test_names():
    assert len(COCO_NAMES) == 80 and len(set(COCO_NAMES)) == 80
    assert COCO_NAMES[0] == "person" and COCO_NAMES[62] == "tv" and COCO_NAMES[-1] == "toothbrush"
    assert default_names(80) == list(COCO_NAMES)
    assert default_names(3) == ["class0", "class1", "class2"]
    with pytest.raises(ValueError, match="expected a positive number of classes, got 0"):
        default_names(0)


def test_label_text():
    from yolo.draw import _label

    assert _label(0, 0.8234, COCO_NAMES) == "person 0.82"
    assert _label(80, 0.5, COCO_NAMES) == "80 0.50"
    assert _label(-1, 0.5, COCO_NAMES) == "-1 0.50"


def test_hide_labels_draws_the_box_only_and_hide_conf_the_name_only():
    detections = np.array([[20.0, 40.0, 120.0, 90.0, 0.87, 0.0]])
    image = np.zeros((100, 200, 3), np.uint8)
    full = draw_detections(image, detections, COCO_NAMES, line_width=2)
    boxes_only = draw_detections(image, detections, COCO_NAMES, line_width=2, hide_labels=True)
    name_only = draw_detections(image, detections, COCO_NAMES, line_width=2, hide_conf=True)
    label_area = (slice(0, 36), slice(20, 200))  # above the box (and its anti-aliased edge): the label
    assert boxes_only[label_area].sum() == 0 and full[label_area].sum() > 0
    assert 0 < name_only[label_area].sum() < full[label_area].sum()  # "person" is shorter than "person 0.87"
    boxes_area = (slice(42, 100), slice(0, 200))
    assert np.array_equal(boxes_only[boxes_area], full[boxes_area])


def test_the_line_thickness_sets_the_box_edge_width():
    def edge_px(width):
        image = draw_detections(np.zeros((100, 200, 3), np.uint8), np.array([[50.0, 50.0, 150.0, 90.0, 0.5, 0.0]]),
                                COCO_NAMES, line_width=width, hide_labels=True)
        return int(image[70, 30:70].any(axis=1).sum())  # across the left edge at x = 50

    assert edge_px(1) <= 3 < edge_px(5) < edge_px(9)  # anti-aliasing widens each by a pixel or two
