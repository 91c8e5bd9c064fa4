import pytest

from yolo.detect import annotated_name


@pytest.mark.parametrize("name, cycle, expected", [
    ("bus.jpg", 0, "bus.jpg"),
    ("bus.jpg", 2, "bus_pass2.jpg"),
    ("dir/x.png", 0, "dir/x.png"),
    ("a.bmp", 0, "a.bmp.jpg"),  # does not collide with a.jpg
    ("clip.mp4:000017", 0, "clip.mp4_000017.jpg"),  # one file per video frame
    ("clip.mp4:000017", 1, "clip.mp4_000017_pass1.jpg"),
    ("synthetic/00003.jpg", 0, "synthetic/00003.jpg"),
])
def test_annotated_names_are_unique_per_frame(name, cycle, expected):
    assert annotated_name(name, cycle) == expected
