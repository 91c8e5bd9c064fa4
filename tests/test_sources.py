import os

import cv2
import numpy as np
import pytest

from yolo.sources import (
    SYNTHETIC_SHAPES,
    FramePlan,
    FrameReader,
    FrameReadError,
    FrameRef,
    plan_frames,
    synthetic_image,
)

VIDEO_FRAMES = 12
VIDEO_SIZE = (64, 48)  # (w, h)


def tiny_image(value: int, shape=(6, 8)) -> np.ndarray:
    return np.full((*shape, 3), value, dtype=np.uint8)


@pytest.fixture
def image_tree(tmp_path):
    """root/{b.png, a.jpg, nested/c.PNG, nested/deeper/d.bmp, notes.txt, empty/}"""
    root = tmp_path / "images"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    files = {"b.png": 20, "a.jpg": 10, "nested/c.PNG": 30, "nested/deeper/d.bmp": 40}
    for relpath, value in files.items():
        assert cv2.imwrite(str(root / relpath), tiny_image(value))
    (root / "notes.txt").write_text("not an image")
    return root


def write_video(path, frames=VIDEO_FRAMES) -> None:
    """Frame i is a flat grey of level 20 * i, so frames are told apart after lossy coding."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG" if path.suffix == ".avi" else "mp4v"),
                             10, VIDEO_SIZE)
    if not writer.isOpened():
        return
    for i in range(frames):
        writer.write(np.full((VIDEO_SIZE[1], VIDEO_SIZE[0], 3), 20 * i, dtype=np.uint8))
    writer.release()


@pytest.fixture
def video(tmp_path):
    for name in ("clip.mp4", "clip.avi"):
        path = tmp_path / name
        write_video(path)
        if path.exists() and cv2.VideoCapture(str(path)).isOpened():
            return path
    pytest.skip("no OpenCV video writer works on this machine")


def grey_level(image: np.ndarray) -> int:
    return int(round(float(image.mean()) / 20))


def test_plan_directory_sorted_recursive_case_insensitive(image_tree):
    plan = plan_frames(str(image_tree))
    assert plan.kind == "image"
    assert plan.root == str(image_tree)
    assert plan.source_len == plan.total == 4
    names = [plan.ref(i).name for i in range(plan.total)]
    assert names == ["a.jpg", "b.png", "nested/c.PNG", "nested/deeper/d.bmp"]
    assert all(os.path.isabs(p) for p in plan.items)
    ref = plan.ref(2)
    assert ref == FrameRef(2, "image", str(image_tree / "nested" / "c.PNG"), "nested/c.PNG", 2, 0)


def test_read_images(image_tree):
    plan = plan_frames(str(image_tree))
    with FrameReader() as reader:
        levels = [int(reader.read(plan.ref(i))[0, 0, 0]) for i in range(plan.total)]
        image = reader.read(plan.ref(0))
    assert levels == [10, 20, 30, 40]
    assert image.dtype == np.uint8 and image.shape == (6, 8, 3)


def test_plan_single_file(image_tree):
    plan = plan_frames(str(image_tree / "nested" / "c.PNG"))
    assert (plan.kind, plan.total, plan.source_len) == ("image", 1, 1)
    assert plan.ref(0).name == "c.PNG"
    assert plan.root == str(image_tree / "nested")


def test_plan_unicode_path(tmp_path):
    folder = tmp_path / "bilder-ü"
    folder.mkdir()
    path = folder / "straße.png"
    ok, encoded = cv2.imencode(".png", tiny_image(77))
    assert ok
    encoded.tofile(str(path))
    plan = plan_frames(str(folder))
    with FrameReader() as reader:
        assert int(reader.read(plan.ref(0))[0, 0, 0]) == 77
    assert plan.ref(0).name == "straße.png"


def test_plan_glob(image_tree):
    plan = plan_frames(str(image_tree / "**" / "*.png"))
    assert plan.root == str(image_tree)
    assert [plan.ref(i).name for i in range(plan.total)] == ["b.png"]
    plan = plan_frames(str(image_tree / "nested" / "*"))
    assert plan.root == str(image_tree / "nested")
    assert [plan.ref(i).name for i in range(plan.total)] == ["c.PNG"]
    plan = plan_frames(str(image_tree / "*" / "*"))
    assert [plan.ref(i).name for i in range(plan.total)] == ["nested/c.PNG"]


def test_plan_synthetic():
    plan = plan_frames("synthetic", synthetic_count=10)
    assert (plan.kind, plan.items, plan.total, plan.source_len, plan.root) == ("synthetic", (), 10, 10, "")
    assert plan.ref(7) == FrameRef(7, "synthetic", "", "synthetic/00007.jpg", 7, 0)
    with FrameReader() as reader:
        np.testing.assert_array_equal(reader.read(plan.ref(3)), synthetic_image(3))


def test_looping(image_tree):
    plan = plan_frames(str(image_tree), frames=10)
    assert (plan.total, plan.source_len) == (10, 4)
    refs = [plan.ref(i) for i in range(10)]
    assert [r.index for r in refs] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [r.cycle for r in refs] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert refs[5].name == refs[1].name == "b.png"
    assert plan_frames(str(image_tree), frames=2).total == 2
    synthetic = plan_frames("synthetic", frames=5, synthetic_count=2)
    assert synthetic.ref(4).name == "synthetic/00000.jpg" and synthetic.ref(4).cycle == 2


def test_ref_out_of_range(image_tree):
    plan = plan_frames(str(image_tree), frames=6)
    with pytest.raises(IndexError, match=r"\[0, 6\).*got 6"):
        plan.ref(6)
    with pytest.raises(IndexError, match="got -1"):
        plan.ref(-1)


def plan_of(kind: str, total: int) -> FramePlan:
    items = ("/v.mp4",) if kind == "video" else ()
    return FramePlan("x", kind, items, total, max(total, 1), "/")


@pytest.mark.parametrize("kind", ["image", "synthetic", "video"])
@pytest.mark.parametrize("total", [1, 2, 7, 10, 64, 101])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 8, 16])
def test_worker_ids_partition(kind, total, workers):
    plan = plan_of(kind, total)
    shares = [plan.worker_ids(w, workers) for w in range(workers)]
    flat = [i for share in shares for i in share]
    assert sorted(flat) == list(range(total))
    assert len(flat) == len(set(flat))
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1
    if kind == "video":
        assert [i for share in shares for i in share] == list(range(total))
        assert all(share.step == 1 for share in shares)
    else:
        assert shares[0] == range(0, total, workers)


@pytest.mark.parametrize("worker, workers", [(0, 0), (-1, 2), (2, 2), (0, 1.5), (True, 2)])
def test_worker_ids_rejects_bad_arguments(worker, workers):
    with pytest.raises(ValueError, match="expected worker"):
        plan_of("image", 4).worker_ids(worker, workers)


def test_video_plan_and_sequential_read(video):
    plan = plan_frames(str(video))
    assert (plan.kind, plan.items, plan.total, plan.source_len) == ("video", (str(video),), VIDEO_FRAMES,
                                                                   VIDEO_FRAMES)
    assert plan.ref(3).name == f"{video.name}:000003"
    with FrameReader() as reader:
        images = [reader.read(plan.ref(i)) for i in range(plan.total)]
    assert all(image.shape == (VIDEO_SIZE[1], VIDEO_SIZE[0], 3) for image in images)
    assert all(image.dtype == np.uint8 for image in images)
    assert [grey_level(image) for image in images] == list(range(VIDEO_FRAMES))


def test_video_seek_and_loop(video):
    plan = plan_frames(str(video), frames=VIDEO_FRAMES + 3)
    with FrameReader() as reader:
        assert grey_level(reader.read(plan.ref(7))) == 7
        assert grey_level(reader.read(plan.ref(8))) == 8
        assert grey_level(reader.read(plan.ref(2))) == 2
        assert grey_level(reader.read(plan.ref(VIDEO_FRAMES + 1))) == 1
        for worker in range(3):
            ids = plan.worker_ids(worker, 3)
            assert [grey_level(reader.read(plan.ref(i))) for i in ids] == [i % VIDEO_FRAMES for i in ids]


def test_video_past_end(video):
    index = VIDEO_FRAMES + 5
    ref = FrameRef(0, "video", str(video), f"{video.name}:{index:06d}", index, 0)
    expected = f"video ended at frame {index} of {VIDEO_FRAMES}: .*{video.name}"
    with FrameReader() as reader, pytest.raises(FrameReadError, match=expected):
        reader.read(ref)


def test_unopenable_video(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(b"not a video at all")
    with pytest.raises(ValueError, match="broken.mp4"):
        plan_frames(str(path))


def test_corrupt_image(tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    (tmp_path / "empty.png").write_bytes(b"")
    plan = plan_frames(str(tmp_path))
    with FrameReader() as reader:
        for i in range(plan.total):
            with pytest.raises(FrameReadError, match="cannot decode image: .*(bad.jpg|empty.png)"):
                reader.read(plan.ref(i))


def test_missing_image_file(tmp_path):
    ref = FrameRef(0, "image", str(tmp_path / "gone.jpg"), "gone.jpg", 0, 0)
    with FrameReader() as reader, pytest.raises(FrameReadError, match="gone.jpg"):
        reader.read(ref)


def test_bad_sources(tmp_path, image_tree):
    with pytest.raises(ValueError, match="nonexistent path .*missing"):
        plan_frames(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="directory .*empty.* got none"):
        plan_frames(str(image_tree / "empty"))
    with pytest.raises(ValueError, match=r"glob .*\*\.gif.* got none"):
        plan_frames(str(image_tree / "*.gif"))
    with pytest.raises(ValueError, match="extension '.txt'"):
        plan_frames(str(image_tree / "notes.txt"))
    for frames in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="expected frames"):
            plan_frames(str(image_tree), frames=frames)
    with pytest.raises(ValueError, match="synthetic_count"):
        plan_frames("synthetic", synthetic_count=0)


def test_synthetic_image_deterministic_and_varied():
    first = synthetic_image(5)
    np.testing.assert_array_equal(first, synthetic_image(5))
    assert not np.array_equal(synthetic_image(5, seed=1), first)
    shapes = [synthetic_image(i).shape for i in range(len(SYNTHETIC_SHAPES))]
    assert shapes == [(h, w, 3) for h, w in SYNTHETIC_SHAPES]
    assert synthetic_image(len(SYNTHETIC_SHAPES)).shape == shapes[0]
    assert not np.array_equal(synthetic_image(len(SYNTHETIC_SHAPES)), synthetic_image(0))
    assert first.dtype == np.uint8 and first.flags.c_contiguous
    assert first.std() > 10
    with pytest.raises(ValueError, match="got -1"):
        synthetic_image(-1)
