"""A video URL from a server that ignores Range requests (as ``python -m http.server`` does) is
downloaded whole before it is read; one from a server that answers them is read as it streams;
a download that fails is one broken item saying why. Servers on 127.0.0.1 only."""

import os

import cv2
import numpy as np
import pytest

from tests.media import MediaServer
from inputs.downloads import DownloadFolder, probe_ranges
from inputs.frames import StreamError
from inputs.reader import FrameReader
from inputs.sources import plan_frames
from inputs.streams import StreamOptions

FRAMES, SIZE = 100, (320, 240)  # an MP4 this large cannot be read from a server that cannot seek
QUICK = dict(open_timeout_ms=3000, read_timeout_ms=2000, reconnect_attempts=1, reconnect_backoff_s=0.1)


@pytest.fixture(scope="module")
def mp4(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, SIZE)
    for i in range(FRAMES):
        writer.write(np.full((SIZE[1], SIZE[0], 3), (2 * i) % 256, np.uint8))
    writer.release()
    return path


def means(plan):
    with FrameReader(streams=StreamOptions(**QUICK)) as reader:
        return [float(reader.read(plan.ref(i)).mean()) for i in range(plan.total)]


def test_the_probe_tells_a_seekable_server_a_whole_file_and_a_live_stream_apart(mp4):
    with MediaServer({"clip.mp4": mp4.read_bytes()}) as server:
        whole, ranged = probe_ranges(server.url("/files/clip.mp4"), 5), probe_ranges(server.url("/ranged/clip.mp4"), 5)
        live, missing = probe_ranges(server.url("/live.mjpg"), 5), probe_ranges(server.url("/files/nothing.mp4"), 5)
    assert whole.must_download and whole.length == mp4.stat().st_size and not whole.ranges
    assert ranged.ranges and not ranged.must_download
    assert live.content_type.startswith("multipart/") and not live.must_download  # endless: never downloaded
    assert missing is None  # a 404 is left to FFmpeg, which names it


@pytest.mark.parametrize("mode", ["files", "ranged"])
def test_a_video_url_is_read_whole_from_either_kind_of_server(mp4, tmp_path, mode):
    folder = tmp_path / "downloads"
    with MediaServer({"clip.mp4": mp4.read_bytes()}) as server:
        plan = plan_frames(server.url(f"/{mode}/clip.mp4"), streams=StreamOptions(download_dir=str(folder), **QUICK))
        [item] = plan.items
        read = means(plan)
    assert item.kind == "video" and plan.total == FRAMES and item.name.endswith(f"/{mode}/clip.mp4")
    assert read == means(plan_frames(str(mp4)))  # every frame, in order, as from the file
    downloaded = mode == "files"  # only the server that ignores Range requests needs the download
    assert item.location.startswith(str(folder)) is downloaded and folder.is_dir() is downloaded


def test_a_download_cut_short_is_one_clear_error(mp4, tmp_path):
    with MediaServer({"clip.mp4": mp4.read_bytes()}) as server:
        with pytest.raises(ValueError, match="does not answer Range requests.*failed: .*bytes"):
            plan_frames(server.url("/cut/clip.mp4"), streams=StreamOptions(download_dir=str(tmp_path), **QUICK))
    assert [p for p in os.listdir(tmp_path) if p.endswith(".part")] == []  # no partial file left


def test_the_download_folder_is_removed_at_the_end(mp4):
    with MediaServer({"clip.mp4": mp4.read_bytes()}) as server, DownloadFolder() as folder:
        plan_frames(server.url("/files/clip.mp4"), streams=StreamOptions(download_dir=folder, **QUICK))
        assert len(os.listdir(folder)) == 1
    assert not os.path.exists(folder)


def test_without_the_download_the_same_url_cannot_be_read(mp4):
    """Why the download exists: FFmpeg cannot read this MP4 from a server that cannot seek."""
    with MediaServer({"clip.mp4": mp4.read_bytes()}) as server:
        plan = plan_frames(server.url("/files/clip.mp4"), streams=StreamOptions(**QUICK))
        with pytest.raises(StreamError, match="no frame 0"):
            means(plan)
