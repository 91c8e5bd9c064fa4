import os

import cv2
import numpy as np
import pytest

from tests.media import FakeLive, grey_level, tiny_image, write_video
from inputs.frames import FrameReadError, FrameRef, StreamError
from inputs.reader import FrameReader, ShareReader
from inputs.plans import FramePlan, SourceItem, plan_lengths
from inputs.sources import plan_frames
from inputs.streams import StreamOptions
from inputs.synthetic import synthetic_image

VIDEO_FRAMES = 12
QUICK = StreamOptions(open_timeout_ms=2000, read_timeout_ms=2000, reconnect_attempts=1, reconnect_backoff_s=0.01)


def drain(reader: ShareReader) -> list[tuple[str, int, object]]:
    """Every outcome of a share: ("frame", id, Frame), ("failed", id, reason), ("given up", -1, error)."""
    outcomes = []
    while True:
        try:
            frame = reader.next()
        except FrameReadError as error:
            outcomes.append(("failed", error.ref.frame_id, error.reason))
            continue
        except StreamError as error:
            outcomes.append(("given up", -1, error))
            continue
        if frame is None:
            return outcomes
        outcomes.append(("frame", frame.ref.frame_id, frame))


@pytest.fixture
def mixed_dir(tmp_path):
    """{a.jpg, b.png, clip.avi (12 frames), link.jpg -> nowhere, notes.txt, z/c.bmp}"""
    root = tmp_path / "mixed"
    (root / "z").mkdir(parents=True)
    for name, value in {"a.jpg": 10, "b.png": 20, "z/c.bmp": 30}.items():
        assert cv2.imwrite(str(root / name), tiny_image(value))
    write_video(root / "clip.avi", VIDEO_FRAMES)
    os.symlink(root / "nowhere.jpg", root / "link.jpg")
    (root / "notes.txt").write_text("hello")
    return root


def test_read_images_and_synthetic(mixed_dir):
    plan = plan_frames(str(mixed_dir))
    with FrameReader() as reader:
        assert int(reader.read(plan.ref(0))[0, 0, 0]) == 10
        frame = reader.read_frame(plan.ref(1))
    assert frame.image.shape == (6, 8, 3) and frame.original_shape == (6, 8) and frame.reduction == 1
    synthetic = plan_frames("synthetic", synthetic_count=4)
    with FrameReader(seed=3) as reader:
        np.testing.assert_array_equal(reader.read(synthetic.ref(2)), synthetic_image(2, seed=3))


def test_video_sequential_seek_and_loop(mixed_dir):
    plan = plan_frames(str(mixed_dir / "clip.avi"), frames=VIDEO_FRAMES + 3)
    with FrameReader() as reader:
        frames = [reader.read_frame(plan.ref(i)) for i in range(VIDEO_FRAMES)]
        assert [grey_level(f.image) for f in frames] == list(range(VIDEO_FRAMES))
        assert frames[0].video == plan.items[0].video
        assert grey_level(reader.read(plan.ref(7))) == 7
        assert grey_level(reader.read(plan.ref(2))) == 2
        assert grey_level(reader.read(plan.ref(VIDEO_FRAMES + 1))) == 1


def test_video_stride(mixed_dir):
    plan = plan_frames(str(mixed_dir / "clip.avi"), vid_stride=5)
    with ShareReader(plan) as reader:
        outcomes = drain(reader)
    assert [grey_level(frame.image) for _, _, frame in outcomes] == [0, 5, 10]
    assert outcomes[0][2].video.fps == 2.0


def test_video_past_end(mixed_dir):
    index = VIDEO_FRAMES + 5
    ref = FrameRef(0, "video", f"clip.avi:{index:06d}", 0, index, 0, str(mixed_dir / "clip.avi"), index)
    with FrameReader() as reader, pytest.raises(FrameReadError, match=f"video ended at frame {index} of 12: clip.avi"):
        reader.read(ref)


def test_corrupt_and_missing_images(tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    (tmp_path / "empty.png").write_bytes(b"")
    plan = plan_frames(str(tmp_path))
    with FrameReader() as reader:
        for i in range(plan.total):
            with pytest.raises(FrameReadError, match="cannot decode image.*(bad.jpg|empty.png)") as caught:
                reader.read(plan.ref(i))
            assert caught.value.ref == plan.ref(i)
    ref = FrameRef(0, "image", "gone.jpg", 0, 0, 0, str(tmp_path / "gone.jpg"), 0)
    with FrameReader() as reader, pytest.raises(FrameReadError, match="gone.jpg"):
        reader.read(ref)


def test_share_reads_a_mixed_folder_with_reasons(mixed_dir):
    plan = plan_frames(str(mixed_dir))
    with ShareReader(plan) as reader:
        outcomes = drain(reader)
        assert reader.position == plan.total
    assert [frame_id for _, frame_id, _ in outcomes] == list(range(plan.total))
    failed = {plan.ref(i).name: reason for kind, i, reason in outcomes if kind == "failed"}
    assert failed == {"link.jpg": f"broken symlink -> {mixed_dir / 'nowhere.jpg'}"}  # notes.txt is left out
    assert plan.skipped_files == 1
    video = [frame for kind, _, frame in outcomes if kind == "frame" and frame.ref.kind == "video"]
    assert [grey_level(frame.image) for frame in video] == list(range(VIDEO_FRAMES))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_shares_read_every_id_once_videos_whole(mixed_dir, tmp_path, workers):
    write_video(mixed_dir / "z" / "other.avi", 5)
    plan = plan_frames(str(mixed_dir), frames=40)  # loops: a pass of 22 frames, then 18 more
    seen = {}
    for worker in range(workers):
        with ShareReader(plan, worker, workers) as reader:
            outcomes = drain(reader)
        assert [i for _, i, _ in outcomes] == plan.worker_ids(worker, workers)
        for _, frame_id, _ in outcomes:
            assert frame_id not in seen
            seen[frame_id] = worker
        for item in {plan.ref(i).item for _, i, _ in outcomes if plan.ref(i).kind == "video"}:
            levels = [grey_level(f.image) for kind, _, f in outcomes if kind == "frame" and f.ref.item == item]
            cycles = [f.ref.cycle for kind, _, f in outcomes if kind == "frame" and f.ref.item == item]
            frames = plan.items[item].frames
            assert levels == [i % frames for i in range(len(levels))] and cycles == sorted(cycles)
    assert sorted(seen) == list(range(40))
    for item, source in enumerate(plan.items):
        if source.kind == "video":
            assert len({seen[i] for i in seen if plan.ref(i).item == item}) == 1  # one worker per video


@pytest.mark.parametrize("start", [0, 1, 5, 13, 20])
def test_restart_at_position_yields_the_same_tail(mixed_dir, start):
    plan = plan_frames(str(mixed_dir), frames=30)
    with ShareReader(plan, 0, 2) as reader:  # worker 0 reads the video, twice
        full = drain(reader)
    with ShareReader(plan, 0, 2, start=start) as reader:
        tail = drain(reader)
    assert [(kind, i) for kind, i, _ in tail] == [(kind, i) for kind, i, _ in full[start:]]
    for (kind, _, a), (_, _, b) in zip(full[start:], tail):
        if kind == "frame":
            assert a.ref == b.ref
            np.testing.assert_array_equal(a.image, b.image)
    with pytest.raises(ValueError, match="start"):
        ShareReader(plan, 0, 2, start=len(full) + 1)


def live_plan(spec: list[str], frames: int | None) -> FramePlan:
    """Synthetic scenes and fake cameras: a digit is a camera, anything else a scene."""
    items = [SourceItem("stream", loc, f"camera{loc}", None) if loc.isdigit() else
             SourceItem("synthetic", "", f"synthetic/{n:05d}.jpg", 1) for n, loc in enumerate(spec)]
    lengths, total = plan_lengths(items, frames)
    return FramePlan("fake", tuple(items), tuple(lengths), total)


def test_planned_live_frames_alternate_and_give_up():
    second = iter([FakeLive(2)])  # stream 2 gives two frames, then never opens again
    opener = lambda location, options: FakeLive(100) if location == "1" else next(second, FakeLive(0, opens=False))  # noqa: E731
    options = StreamOptions(reconnect_attempts=1, reconnect_backoff_s=0.0)
    plan = live_plan(["x", "1", "2"], frames=9)  # 1 synthetic + 4 + 4 live frames
    with ShareReader(plan, streams=options, opener=opener) as reader:
        outcomes = drain(reader)
        stats = {s.name: s for s in reader.stream_stats()}
    items = [(kind, plan.ref(i).item) for kind, i, _ in outcomes if i >= 0]
    assert items[:4] == [("frame", 0), ("frame", 1), ("frame", 2), ("frame", 1)]  # streams alternate
    given_up = [error for kind, _, error in outcomes if kind == "given up"]
    assert len(given_up) == 1 and given_up[0].stream == "camera2"
    assert "gave up after 1 reconnects" in given_up[0].reason and given_up[0].item == 2
    delivered = stats["camera2"].delivered  # 1 or 2: the grabber may overwrite the first before it is taken
    assert items.count(("failed", 2)) == 4 - delivered  # its remaining planned ids, failed without waiting
    assert sorted(i for _, i, _ in outcomes if i >= 0) == list(range(9))
    assert stats["camera1"].delivered == 4
    for s in stats.values():
        assert s.kept == s.delivered + s.dropped + s.pending


def test_open_ended_live_ids_and_rotation():
    opener = lambda location, options: FakeLive(3 if location == "1" else 1000)  # noqa: E731
    options = StreamOptions(reconnect_attempts=0, reconnect_backoff_s=0.0)
    plan = live_plan(["x", "y", "1", "2"], frames=None)
    assert plan.worker_streams(0, 2) == (2,) and plan.worker_streams(1, 2) == (3,)
    with ShareReader(plan, 0, 2, streams=options, opener=opener) as reader:
        outcomes = drain(reader)  # stream 1 ends after 3 frames: the share is done
    ids = [i for kind, i, _ in outcomes if kind == "frame"]
    assert ids[0] == 0 and len(ids) >= 2  # its synthetic frame, then live frames numbered 2 + 2k + 0
    assert ids[1:] == [2 + 2 * k for k in range(len(ids) - 1)]
    assert outcomes[-1][0] == "given up"
    with ShareReader(plan, 1, 2, start=7, streams=options, opener=opener) as reader:
        frame = reader.next()
    assert frame.ref.frame_id == 2 + 2 * 6 + 1 and frame.ref.name.startswith("camera2:")


def test_reduced_decode_through_the_reader(tmp_path):
    image = np.zeros((1300, 1400, 3), np.uint8)
    cv2.rectangle(image, (100, 200), (700, 900), (255, 255, 255), -1)
    assert cv2.imwrite(str(tmp_path / "big.jpg"), image)
    assert cv2.imwrite(str(tmp_path / "big.png"), image)
    from inputs.imageio import DecodeOptions
    plan = plan_frames(str(tmp_path))
    with ShareReader(plan, decode=DecodeOptions("reduced", imgsz=320)) as reader:
        jpeg, png = reader.next(), reader.next()
    assert (jpeg.reduction, jpeg.image.shape, jpeg.original_shape) == (4, (325, 350, 3), (1300, 1400))
    assert (png.reduction, png.image.shape) == (1, (1300, 1400, 3))  # only JPEG decodes reduced
