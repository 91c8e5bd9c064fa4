"""The README's example scripts: the clip of the worked example, and the comparison of two
detection files (fp32 against --half)."""

import sys

import cv2

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "examples"))
import compare_detections  # noqa: E402
import make_bus_pan  # noqa: E402


def test_bus_pan_is_72_frames_of_640x480_at_24_fps_panning_down(fixtures_dir, tmp_path):
    out = tmp_path / "bus_pan.mp4"
    assert make_bus_pan.main([str(fixtures_dir / "bus.jpg"), str(out)]) == 0
    capture = cv2.VideoCapture(str(out))
    try:
        assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 72 and capture.get(cv2.CAP_PROP_FPS) == 24.0
        assert (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (640, 480)
    finally:
        capture.release()
    frames = make_bus_pan.pan_frames(cv2.imread(str(fixtures_dir / "bus.jpg")), 72, 640, 480)
    scaled = cv2.resize(cv2.imread(str(fixtures_dir / "bus.jpg")), (640, 853), interpolation=cv2.INTER_AREA)
    assert (frames[0] == scaled[:480]).all() and (frames[-1] == scaled[-480:]).all()  # top to bottom


def record(image, class_id, box, score):
    return {"image": image, "frame": 0, "class_id": class_id, "class": str(class_id), "score": score, "box": box}


def test_matching_pairs_boxes_of_one_class_by_iou_each_once():
    a = [record("x.jpg", 0, [0, 0, 10, 10], 0.9), record("x.jpg", 0, [1, 1, 11, 11], 0.8),
         record("x.jpg", 1, [0, 0, 10, 10], 0.7), record("y.jpg", 0, [0, 0, 10, 10], 0.6)]
    b = [record("x.jpg", 0, [0, 0, 10, 10], 0.88), record("x.jpg", 1, [50, 50, 60, 60], 0.7),
         record("y.jpg", 0, [0, 0, 10, 11], 0.5)]
    pairs = compare_detections.match(a, b)
    assert [(x["score"], y["score"]) for x, y in pairs] == [(0.9, 0.88), (0.6, 0.5)]  # the 0.8 box finds B's taken


def test_the_comparison_prints_the_shares(tmp_path, capsys):
    import json
    boxes = [record("x.jpg", 0, [0, 0, 10, 10], 0.9)]
    (tmp_path / "a.json").write_text(json.dumps(boxes))
    (tmp_path / "b.json").write_text(json.dumps(boxes + [record("x.jpg", 2, [0, 0, 5, 5], 0.3)]))
    assert compare_detections.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "A 1 boxes, B 2 boxes; matched (same class, IoU >= 0.5) 1: 100.0% of A, 50.0% of B" in capsys.readouterr().out
