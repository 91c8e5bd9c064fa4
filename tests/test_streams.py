import threading
import time

import pytest

from tests.media import FakeLive, MediaServer, grey_level, write_video
from inputs.frames import FrameReadError, StreamError
from inputs.reader import ShareReader
from inputs.sources import plan_frames
from inputs.streams import LiveStream, StreamOptions, VideoReader, stream_name, url_name

CLIP_FRAMES = 40
QUICK = StreamOptions(open_timeout_ms=1000, read_timeout_ms=500, reconnect_attempts=2, reconnect_backoff_s=0.01)
HANG_GUARD_S = 60  # only so that a hang fails the test instead of blocking the suite


@pytest.fixture
def clip(tmp_path):
    return write_video(tmp_path / "clip.avi", CLIP_FRAMES)  # MJPG in AVI: readable from a cut stream


def read_all(plan, options=QUICK):
    """Every outcome of a one-worker share, in a thread bounded by HANG_GUARD_S."""
    outcomes = []

    def run():
        with ShareReader(plan, streams=options) as reader:
            while True:
                try:
                    frame = reader.next()
                except (FrameReadError, StreamError) as error:
                    outcomes.append(error)
                    continue
                if frame is None:
                    return
                outcomes.append(frame)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"reading did not finish in {HANG_GUARD_S} s"
    return outcomes


def test_url_video_reads_every_frame_like_the_file(clip):
    with MediaServer({"clip.avi": clip.read_bytes()}) as server:
        plan = plan_frames(server.url("/files/clip.avi"), streams=QUICK)
        assert plan.items[0].kind == "video" and plan.total == CLIP_FRAMES
        frames = read_all(plan)
    file_frames = read_all(plan_frames(str(clip)))
    assert len(frames) == len(file_frames) == CLIP_FRAMES
    assert [grey_level(f.image) for f in frames] == [grey_level(f.image) for f in file_frames]
    assert frames[0].video.frames == CLIP_FRAMES and frames[0].ref.name.endswith("/files/clip.avi:000001")


@pytest.mark.parametrize("mode", ["cut", "stall"])
def test_url_that_stops_mid_file_reconnects_then_gives_up(clip, mode):
    with MediaServer({"clip.avi": clip.read_bytes()}, stall_s=30) as server:
        plan = plan_frames(server.url(f"/{mode}/clip.avi"), streams=QUICK)
        probes = server.connections[f"/{mode}/clip.avi"]
        outcomes = read_all(plan)
        connections = server.connections[f"/{mode}/clip.avi"] - probes
    frames = [o for o in outcomes if not isinstance(o, Exception)]
    errors = [o for o in outcomes if isinstance(o, StreamError)]
    failed = [o for o in outcomes if isinstance(o, FrameReadError)]
    assert 0 < len(frames) < CLIP_FRAMES  # what came before the cut is read
    assert len(errors) == 1 and "gave up after 2 reconnects" in errors[0].reason
    assert "read timeout 500 ms" in errors[0].reason and errors[0].attempts == 3
    assert connections >= 3  # the first open and two reconnects reached the server
    assert len(frames) + len(failed) == CLIP_FRAMES  # the rest of the planned ids fail without waiting
    assert all("was given up" in f.reason and f.repeat for f in failed)  # a log says the reason once, not per frame


def test_fake_live_stream_keeps_the_newest_frame_and_counts_drops():
    hold = threading.Event()  # the fake camera stalls after 10 frames until this is set
    stream = LiveStream("7", "camera7", 1, StreamOptions(reconnect_attempts=0), opener=lambda *_: FakeLive(10, hold=hold))
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while stream.stats().kept < 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        source_index, image, info = stream.next()
        assert source_index == 9 and int(image[0, 0, 0]) == 9  # the newest, not the oldest
        stats = stream.stats()
        assert (stats.grabbed, stats.kept, stats.delivered, stats.dropped, stats.pending) == (10, 10, 1, 9, 0)
        assert info.frames is None and info.fps == 30.0
        hold.set()  # the camera fails; no reconnect allowed
        with pytest.raises(StreamError, match="camera7: stopped sending frames; gave up after 0 reconnects"):
            stream.next()
    finally:
        hold.set()
        stream.close()


def test_fake_live_stream_stride():
    hold = threading.Event()
    stream = LiveStream("7", "camera7", 4, StreamOptions(), opener=lambda *_: FakeLive(10, hold=hold))
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while stream.stats().grabbed < 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        source_index, _, info = stream.next()
        stats = stream.stats()
        assert source_index == 8 and info.fps == 7.5
        assert (stats.kept, stats.dropped, stats.delivered) == (3, 2, 1)  # frames 0, 4, 8 kept
    finally:
        hold.set()
        stream.close()


def test_live_http_stream_slow_consumer_drops_and_counts():
    with MediaServer(live_fps=100) as server:
        plan = plan_frames(server.url("/live.mjpg"), frames=4, vid_stride=2, streams=QUICK)
        assert plan.items[0].kind == "stream" and plan.total == 4
        with ShareReader(plan, streams=QUICK) as reader:
            frames = [reader.next()]
            for _ in range(3):
                time.sleep(0.5)  # a slow pipeline: the grabber keeps only the newest frame meanwhile
                frames.append(reader.next())
            assert reader.next() is None
            stats = reader.stream_stats()
    indices = [frame.ref.source_index for frame in frames]
    assert [frame.ref.frame_id for frame in frames] == [0, 1, 2, 3]
    assert all(i % 2 == 0 for i in indices) and indices == sorted(indices)
    assert len(stats) == 1 and stats[0].delivered == 4 and stats[0].dropped > 0
    assert stats[0].kept == stats[0].delivered + stats[0].dropped + stats[0].pending
    assert frames[0].video.frames is None and (frames[0].video.width, frames[0].video.height) == (64, 48)


def test_live_stream_that_goes_away_reconnects_then_gives_up():
    with MediaServer(short_frames=5, short_requests=2) as server:  # the plan's probe, then the reader's open
        plan = plan_frames(server.url("/live-ends.mjpg"), streams=QUICK)
        outcomes = read_all(plan)
        connections = server.connections["/live-ends.mjpg"]
    assert plan.open_ended
    frames = [o for o in outcomes if not isinstance(o, Exception)]
    assert 1 <= len(frames) <= 5 and isinstance(outcomes[-1], StreamError)
    assert "stopped sending frames; gave up after 2 reconnects" in outcomes[-1].reason
    assert connections == 1 + 1 + 2  # the plan's probe, the first open, two reconnects


def test_camera_that_does_not_exist_gives_up():
    plan = plan_frames("97", frames=3)
    outcomes = read_all(plan, StreamOptions(reconnect_attempts=2, reconnect_backoff_s=0.01))
    assert isinstance(outcomes[0], StreamError)
    assert str(outcomes[0]).startswith("stream camera97: never opened; gave up after 2 reconnects")
    assert outcomes[0].attempts == 3
    assert [type(o) for o in outcomes[1:]] == [FrameReadError] * 3  # its planned frames fail at once


def test_video_reader_of_a_file_ends_with_frame_read_error(clip):
    reader = VideoReader(str(clip), "clip.avi", 1, QUICK)
    try:
        assert grey_level(reader.read(11)) == 11
        with pytest.raises(FrameReadError, match=f"video ended at frame {CLIP_FRAMES} of {CLIP_FRAMES}"):
            reader.read(CLIP_FRAMES)
        assert grey_level(reader.read(0)) == 0  # back to the start after a failed read
        assert grey_level(reader.read(2)) == 2
    finally:
        reader.close()


def test_names_and_options():
    assert url_name("rtsp://user:pw@cam.local:554/live/ch1?x=1&y=2") == "cam.local_554/live/ch1_x=1_y=2"
    assert url_name("http://example.com/") == "example.com"
    assert stream_name("3") == "camera3"
    with pytest.raises(ValueError, match="read_timeout_ms"):
        StreamOptions(read_timeout_ms=0)
    with pytest.raises(ValueError, match="reconnect_attempts"):
        StreamOptions(reconnect_attempts=-1)
    options = StreamOptions(open_timeout_ms=1000, read_timeout_ms=1000, reconnect_attempts=3,
                            reconnect_backoff_s=0.5, reconnect_backoff_max_s=1.0)
    assert [options.backoff_s(a) for a in (1, 2, 3)] == [0.5, 1.0, 1.0]
    assert options.give_up_s == pytest.approx(1 + 3 * 2 + 2.5 + 2)
