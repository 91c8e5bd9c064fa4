"""yolo.labels: YOLO label lines and file names as Ultralytics' detect.py writes them."""

import pytest
import torch

from yolo.labels import frame_stem, label_lines, label_path, write_label_file
from yolo.labels import split_video_frame

SHAPE_HW = (1080, 810)


def _random_dets(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h, w = SHAPE_HW
    xy = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.8
    wh = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.2 + 1
    scores = torch.rand(n, generator=g).sort(descending=True).values
    classes = torch.randint(0, 80, (n,), generator=g).float()
    return torch.cat((xy, xy + wh, scores[:, None], classes[:, None]), 1)


def _parse(line: str) -> list[float]:
    return [float(v) for v in line.split(" ")]


@pytest.mark.parametrize("name, expected", [
    ("bus.jpg", "labels/bus.txt"),
    ("dir/x.png", "labels/dir/x.txt"),
    ("a.b.jpg", "labels/a.b.txt"),  # like pathlib's stem: only the last extension goes
    ("clip.mp4:000001", "labels/clip_1.txt"),  # names count video frames from 1, as detect.py does
    ("clip.mp4:000018", "labels/clip_18.txt"),
    ("synthetic/00003.jpg", "labels/synthetic/00003.txt"),
    ("odd:name.jpg", "labels/odd:name.txt"),  # a colon without a frame index is part of the name
])
def test_label_path(name, expected):
    assert label_path(name) == expected


def test_split_video_frame():
    assert split_video_frame("clip.mp4:000017") == ("clip.mp4", 17)
    assert split_video_frame("bus.jpg") is None
    assert split_video_frame(":000017") is None
    assert split_video_frame("clip.mp4:١٧") is None  # non-ASCII digits are not a frame index
    assert frame_stem("clip.mp4:000017") == "clip_17"


def test_lines_parse_back_to_the_boxes():
    dets = _random_dets(50)
    h, w = SHAPE_HW
    lines = label_lines(dets, SHAPE_HW)
    assert len(lines) == len(dets)
    parsed = torch.tensor([_parse(line) for line in lines], dtype=torch.float64).flip(0)  # lowest score first
    x1, y1, x2, y2 = dets[:, :4].double().unbind(1)
    expected = torch.stack(((x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h), 1)
    assert torch.equal(parsed[:, 0], dets[:, 5].double())
    assert (parsed[:, 1:] - expected).abs().max() <= 1e-6
    assert all(line.split(" ")[0] == str(int(c)) for line, c in zip(lines, dets[:, 5].flip(0).tolist()))


def test_save_conf_appends_the_score():
    dets = _random_dets(5, seed=1)
    lines = label_lines(dets, SHAPE_HW, save_conf=True)
    scores = [_parse(line)[5] for line in lines]
    assert all(len(_parse(line)) == 6 for line in lines)
    assert scores == pytest.approx(dets[:, 4].flip(0).tolist(), abs=1e-6)
    assert scores == sorted(scores)  # detect.py writes its detections in reverse: lowest score first


def test_known_line():
    dets = torch.tensor([[0.0, 0.0, 405.0, 540.0, 0.875, 5.0]])
    assert label_lines(dets, SHAPE_HW, save_conf=True) == ["5 0.25 0.25 0.5 0.5 0.875"]


def test_no_detections_no_lines():
    assert label_lines(torch.zeros(0, 6), SHAPE_HW) == []


@pytest.mark.parametrize("dets, shape, match", [
    (torch.zeros(3, 4), SHAPE_HW, r"shape \(M, 6\), got \(3, 4\)"),
    (torch.zeros(1, 6), (0, 640), r"positive image shape .* got \(0, 640\)"),
])
def test_bad_input_is_named(dets, shape, match):
    with pytest.raises(ValueError, match=match):
        label_lines(dets, shape)


def test_write_label_file(tmp_path):
    path = tmp_path / "run" / label_path("dir/x.png")
    write_label_file(str(path), ["0 0.5 0.5 0.1 0.1", "2 0.25 0.75 0.2 0.3"])
    assert path.read_text() == "0 0.5 0.5 0.1 0.1\n2 0.25 0.75 0.2 0.3\n"
    write_label_file(str(path), ["1 0.5 0.5 0.1 0.1"])  # replaced, not appended
    assert path.read_text() == "1 0.5 0.5 0.1 0.1\n"
