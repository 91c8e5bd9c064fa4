"""What the tree's own input kinds do; :mod:`inputs.kinds` registers them under their names.

Each function is one part of an :class:`inputs.kinds.InputKind`: read a finite frame by its ref
(given the :class:`inputs.reader.FrameReader` that reads it, for its options and the video it
keeps open), plan a source string or a file into items (given the
:class:`inputs.kinds.Planning` options), open a live item, or tell the frame sizes of items
(to size the frame slots before a run starts).
"""

from __future__ import annotations

import numpy as np

from inputs.frames import Frame, FrameReadError, FrameRef, SourceItem, StreamError
from inputs.imageio import image_size, read_encoded, read_image
from inputs.streams import LiveStream, VideoReader, is_url, probe_video, stream_name
from inputs.synthetic import SYNTHETIC_SHAPES, synthetic_image

PROBED_FILES = 64  # image headers read to size the slots
HEADER_BYTES = 1 << 16  # enough of a file for its width and height


def broken_item(location: str, name: str, reason: str) -> SourceItem:
    """An entry that yields one failed frame saying ``reason``."""
    return SourceItem("broken", location, name, 1, reason=reason)


def read_broken(ref: FrameRef, reader) -> Frame:
    raise FrameReadError(ref.reason or f"unreadable: {ref.name}")


def read_image_file(ref: FrameRef, reader) -> Frame:
    image, original_shape, reduction = read_image(ref.location, reader.decode)
    return Frame(ref, image, original_shape, reduction)


def read_image_file_encoded(ref: FrameRef, reader) -> Frame:
    """The image file's bytes, left for the device to decode (:func:`inputs.imageio.read_encoded`)."""
    try:
        data = np.fromfile(ref.location, np.uint8)
    except OSError as error:
        raise FrameReadError(f"cannot read image: {ref.location} ({error.strerror})") from error
    data, shape = read_encoded(data, reader.decode, ref.location)
    return Frame(ref, None, shape, encoded=data)


def image_sizes(items: list[SourceItem]) -> list[tuple[int, int]]:
    """``(H, W)`` from the headers of the first PROBED_FILES images; unreadable ones are left
    out (they are failed frames later)."""
    sizes = []
    for item in items[:PROBED_FILES]:
        try:
            with open(item.location, "rb") as f:
                size = image_size(f.read(HEADER_BYTES))
        except OSError:
            continue
        if size:
            sizes.append((size[1], size[0]))
    return sizes


def video_item(location: str, name: str, planning) -> SourceItem:
    """A video file or URL, probed once for its frame count and size: a ``"video"`` item, a
    ``"stream"`` for a URL of unknown length (live), or ``"broken"``."""
    info = probe_video(location, planning.vid_stride, planning.streams)
    if info is None:
        what = (f"cannot open URL (open timeout {planning.streams.open_timeout_ms} ms)" if is_url(location)
                else "cannot open video")
        return broken_item(location, name, what)
    if info.frames is None:
        if is_url(location):
            return SourceItem("stream", location, name, None)  # an http stream of unknown length: live
        return broken_item(location, name, "video with an unknown frame count")
    return SourceItem("video", location, name, info.frames, video=info)


def video_sizes(items: list[SourceItem]) -> list[tuple[int, int]]:
    return [(item.video.height, item.video.width) for item in items if item.video is not None]


def _video_name(ref: FrameRef) -> str:
    return ref.name.rpartition(":")[0] or ref.name


def read_video_frame(ref: FrameRef, reader) -> Frame:
    """A frame of a finite video; the reader keeps the video open for the next frame. A video
    URL given up (:class:`StreamError`) stays given up: its other frames fail at once."""
    if ref.location in reader.given_up:
        raise FrameReadError(f"video {_video_name(ref)} was given up: {reader.given_up[ref.location]}", repeat=True)
    try:
        video = _open_video(ref, reader)
        image = video.read(ref.source_index)
    except StreamError as error:
        reader.given_up[ref.location] = error.reason
        reader.close()
        error.item = ref.item
        raise
    return Frame(ref, image, (image.shape[0], image.shape[1]), 1, video.info)


def _open_video(ref: FrameRef, reader) -> VideoReader:
    video = reader.held.get("video")
    if video is not None and video.location == ref.location:
        return video
    reader.close()
    reader.held["video"] = VideoReader(ref.location, _video_name(ref), reader.vid_stride, reader.streams, ref.item,
                                       reader.opener)
    return reader.held["video"]


def camera_items(source: str, planning) -> list[SourceItem]:
    return [SourceItem("stream", source, stream_name(source), None)]


def open_stream(item: SourceItem, index: int, reader) -> LiveStream:
    """A camera or live URL, read by a grabber thread that keeps only the newest frame."""
    return LiveStream(item.location, item.name, reader.vid_stride, reader.streams, index, reader.opener)


def synthetic_items(source: str, planning) -> list[SourceItem]:
    count = planning.synthetic_count
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise ValueError(f"expected synthetic_count to be an int > 0, got {count!r}")
    return [SourceItem("synthetic", "", f"synthetic/{i:05d}.jpg", 1) for i in range(count)]


def read_synthetic(ref: FrameRef, reader) -> Frame:
    image = synthetic_image(ref.source_index, reader.seed)
    return Frame(ref, image, (image.shape[0], image.shape[1]))


def synthetic_sizes(items: list[SourceItem]) -> list[tuple[int, int]]:
    return list(SYNTHETIC_SHAPES)
