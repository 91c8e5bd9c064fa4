"""yolo.coco: COCO results that pycocotools evaluates, the 80 -> 91 category ids, image ids,
and a looped source counted once."""

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from yolo.coco import COCO91_IDS, category_ids, coco_results, first_pass, image_id
from yolo.detect import detection_records
from yolo.names import COCO_NAMES, default_names

PERSON, CAR, STOP_SIGN = 0, 2, 11  # class indices in YOLOv5's 80
# Two images, boxes (x1, y1, x2, y2, class index) in pixels.
GROUND_TRUTH = {
    "000000000001.jpg": [(100, 100, 200, 300, PERSON), (300, 200, 500, 300, CAR)],
    "000000000002.jpg": [(50, 60, 150, 160, STOP_SIGN), (400, 100, 460, 260, PERSON)],
}


def _ground_truth() -> COCO:
    images, annotations = [], []
    for n, (name, boxes) in enumerate(GROUND_TRUTH.items()):
        images.append({"id": image_id(name), "file_name": name, "width": 640, "height": 480})
        for x1, y1, x2, y2, cls in boxes:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id(name), "iscrowd": 0,
                                "category_id": COCO91_IDS[cls], "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "area": (x2 - x1) * (y2 - y1)})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations,
                  "categories": [{"id": i, "name": COCO_NAMES[c]} for c, i in enumerate(COCO91_IDS)]}
    gt.createIndex()
    return gt


def _records(shift: float = 0.0, wrong_class: bool = False, passes: int = 1) -> list[dict]:
    """Detection records of the ground truth boxes, the first one shifted right by ``shift``
    pixels or given the wrong class, over ``passes`` passes of a looped source."""
    records = []
    names = list(GROUND_TRUTH)
    for frame in range(passes * len(names)):
        name = names[frame % len(names)]
        rows = [[x1, y1, x2, y2, 0.9 - 0.1 * i, cls] for i, (x1, y1, x2, y2, cls) in enumerate(GROUND_TRUTH[name])]
        if frame == 0:
            rows[0][0] += shift
            rows[0][2] += shift
            if wrong_class:
                rows[0][5] = CAR
        records.extend(detection_records(torch.tensor(rows), name, frame, COCO_NAMES))
    return records


def _ap(predictions: list[dict]) -> float:
    gt = _ground_truth()
    evaluation = COCOeval(gt, gt.loadRes(predictions), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return float(evaluation.stats[0])  # AP @ IoU 0.50:0.95, all areas


def test_perfect_predictions_give_ap_1():
    assert _ap(coco_results(_records(), COCO_NAMES)) == pytest.approx(1.0)


@pytest.mark.parametrize("change", [{"shift": 30.0}, {"wrong_class": True}], ids=["shifted", "wrong-class"])
def test_a_worse_prediction_lowers_ap(change):
    assert _ap(coco_results(_records(**change), COCO_NAMES)) < 0.9


def test_looped_source_counts_each_image_once():
    once = coco_results(_records(), COCO_NAMES)
    looped = coco_results(_records(passes=3), COCO_NAMES)
    assert looped == once and len(once) == 4
    # a worse first pass is the one that counts, not a better later one
    assert _ap(coco_results(_records(shift=30.0, passes=2), COCO_NAMES)) < 0.9


def test_first_pass_keeps_order_and_each_images_first_frame():
    records = [{"image": "b", "frame": 3}, {"image": "a", "frame": 0}, {"image": "a", "frame": 2},
               {"image": "b", "frame": 1}, {"image": "a", "frame": 0}]
    assert first_pass(records) == [records[1], records[3], records[4]]


def test_result_fields():
    result = coco_results(_records(), COCO_NAMES)[0]
    assert result == {"image_id": 1, "category_id": 1, "bbox": [100.0, 100.0, 100.0, 200.0], "score": 0.9}


@pytest.mark.parametrize("index, coco_id, name", [(0, 1, "person"), (11, 13, "stop sign"), (79, 90, "toothbrush"),
                                                   (24, 27, "backpack"), (56, 62, "chair")])
def test_coco80_to_coco91_known_pairs(index, coco_id, name):
    assert COCO_NAMES[index] == name
    assert category_ids(COCO_NAMES)[index] == coco_id


def test_coco91_ids_agree_with_torchvision():
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    categories = FasterRCNN_ResNet50_FPN_Weights.COCO_V1.meta["categories"]  # index = COCO id, "N/A" unused
    assert len(COCO91_IDS) == 80 and len(set(COCO91_IDS)) == 80
    assert [categories.index(name) for name in COCO_NAMES] == list(COCO91_IDS)


def test_other_names_use_the_class_index():
    assert category_ids(default_names(3)) == [0, 1, 2]
    assert category_ids(COCO_NAMES[::-1]) == list(range(80))  # COCO's names in another order are not COCO's ids
    records = detection_records(torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.5, 2.0]]), "x.jpg", 0, ["a", "b", "c"])
    assert coco_results(records, ["a", "b", "c"])[0]["category_id"] == 2


def test_class_out_of_range_is_named():
    records = detection_records(torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.5, 5.0]]), "x.jpg", 0, ["a", "b"])
    with pytest.raises(ValueError, match=r"'x.jpg': expected a class_id in \[0, 2\), got 5"):
        coco_results(records, ["a", "b"])


@pytest.mark.parametrize("name, expected", [
    ("000000397133.jpg", 397133), ("val2017/000000000139.jpg", 139), ("synthetic/00003.jpg", 3),
    ("bus.jpg", "bus"), ("clip.mp4:000017", "clip_17"), ("٣.jpg", "٣"),
])
def test_image_id(name, expected):
    assert image_id(name) == expected
