"""What a source holds and a read frame is: one item of a source (:class:`SourceItem`), which
frame (:class:`FrameRef`), its pixels (:class:`Frame`), the metadata of the video or stream it
came from (:class:`VideoInfo`), and the two ways a read goes wrong (:class:`FrameReadError` for
one frame, :class:`StreamError` for a whole stream).

Plain data shared by the input kinds (:mod:`inputs.kinds`), the plans (:mod:`inputs.plans`),
the decoders (:mod:`inputs.imageio`, :mod:`inputs.streams`) and the readers
(:mod:`inputs.reader`). An item's and a frame's ``kind`` names an input kind of
:mod:`inputs.kinds`: ``"image"``, ``"video"``, ``"stream"``, ``"synthetic"``, ``"broken"``,
``"feed"``, or one a plugin registered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# What a folder, a glob or a list reads as images and videos, by extension (inputs.kinds).
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".mpg", ".mpeg"})



@dataclass(frozen=True)
class VideoInfo:
    """What writing the annotated video of one video or live stream needs, from OpenCV's
    capture properties (``CAP_PROP_FPS``, ``CAP_PROP_FRAME_WIDTH/HEIGHT``, ``CAP_PROP_FRAME_COUNT``).

    Attributes:
        fps (float): frames per second of the frames read: the capture's fps / ``vid_stride``;
            0.0 when the capture does not know its rate.
        width (int): frame width in pixels.
        height (int): frame height in pixels.
        frames (int | None): frames read per pass, after ``vid_stride``; None for a live stream.
        source_fps (float): the capture's own fps, before ``vid_stride``.
        vid_stride (int): every ``vid_stride``-th source frame is read.
    """

    fps: float
    width: int
    height: int
    frames: int | None
    source_fps: float
    vid_stride: int


@dataclass(frozen=True)
class SourceItem:
    """One image, video, live stream, synthetic scene, feed file or broken entry of a source.

    Attributes:
        kind (str): its input kind (:mod:`inputs.kinds`): ``"image"``, ``"video"``,
            ``"stream"``, ``"synthetic"``, ``"feed"``, ``"broken"`` or a plugin's.
        location (str): absolute path, URL, camera index, or ``""`` for a synthetic scene.
        name (str): relative, file-system-safe name (see :class:`FrameRef`).
        frames (int | None): frames in one pass, after ``vid_stride``; None for a live item.
        video (VideoInfo | None): a video's metadata, probed when planning; None otherwise
            (a live stream's comes with its frames).
        reason (str): why a ``"broken"`` item cannot be read.
    """

    kind: str
    location: str
    name: str
    frames: int | None
    video: VideoInfo | None = None
    reason: str = ""


@dataclass(frozen=True)
class FrameRef:
    """One frame of a run: enough to read it (finite kinds) and for reports to name it.

    Attributes:
        frame_id (int): unique within the run.
        kind (str): its input kind (:mod:`inputs.kinds`); ``"broken"`` frames always fail with ``reason``.
        name (str): relative, file-system-safe name: ``"a/b.jpg"``, ``"clip.mp4:000035"`` (the
            source frame number counted from 1, as detect.py counts), ``"camera0:000018"``
            (``index + 1``),
            ``"synthetic/00017.jpg"``. URLs are named without scheme and credentials.
        item (int): index of the item in :attr:`inputs.plans.FramePlan.items`.
        index (int): position of the frame within its item, after ``vid_stride``: 0 for an
            image; for a live stream, how many frames of that stream came before it.
        cycle (int): how many full passes over the source came before this frame.
        location (str): absolute path, URL (credentials included: never log it), camera index
            (``"0"``), or ``""`` for synthetic frames.
        source_index (int): the frame's number in its source: a video's frame number before
            ``vid_stride``, a live stream's grab count (gaps are stride and dropped frames), a
            synthetic scene's number; 0 for image files. -1 for a live frame not read yet.
        reason (str): why a ``"broken"`` frame cannot be read; ``""`` otherwise.
        save_number (int): what ``--save-images N`` counts for this frame (kept when a multiple
            of N): -1 for its own (``index`` in a video, else ``frame_id``); an image on a node of
            a ``--ray`` run is told the driver's (its id in the whole run).
    """

    frame_id: int
    kind: str
    name: str
    item: int
    index: int
    cycle: int
    location: str
    source_index: int
    reason: str = ""
    save_number: int = -1


@dataclass(frozen=True, eq=False)
class Frame:
    """A frame's pixels and how they relate to the full-size frame.

    Attributes:
        ref (FrameRef): which frame this is (for live streams, with ``source_index`` filled in).
        image (np.ndarray[h, w, 3]): BGR ``uint8`` pixels; ``reduction`` times smaller than the
            original on each side when a reduced JPEG decode was used.
        original_shape (tuple[int, int]): ``(H, W)`` of the full-size frame, as a full decode
            would give it: boxes found on ``image`` map back with
            :func:`yolo.boxes.unreduce_boxes`.
        reduction (int): 1, 2, 4 or 8.
        video (VideoInfo | None): metadata of the video or stream; None for images.
        encoded (np.ndarray[N] | None): the file's ``uint8`` bytes, undecoded, when the reader
            was asked for them (the device data path decodes on the device); ``image`` is then
            None and ``original_shape`` the file header's ``(H, W)`` as stored.
    """

    ref: FrameRef
    image: np.ndarray | None
    original_shape: tuple[int, int]
    reduction: int = 1
    video: VideoInfo | None = None
    encoded: np.ndarray | None = None


class FrameReadError(ValueError):
    """One planned frame could not be read (its id is consumed and reported as failed): an
    undecodable or oversized image, a video that ended early, a broken directory entry, or a
    planned frame of a stream that was given up.

    Attributes:
        reason (str): the message, naming the file or stream and what went wrong.
        ref (FrameRef | None): the frame; set by the readers of :mod:`inputs.reader`.
        repeat (bool): the reason was given already for an earlier frame of the same video
            (one that was given up), so a log need not say it again.
    """

    def __init__(self, reason: str, ref: FrameRef | None = None, repeat: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ref = ref
        self.repeat = repeat

    def __reduce__(self):
        return type(self), (self.reason, self.ref, self.repeat)


class StreamError(RuntimeError):
    """A video URL or live stream was given up after every reconnect attempt failed, or a
    camera never opened. Consumes no frame id; after it the stream is done (a planned frame of
    it then raises :class:`FrameReadError` without waiting) and the reader goes on with its
    other items.

    Attributes:
        stream (str): the stream's name (no credentials).
        item (int): its index in the plan's items; -1 when unknown.
        attempts (int): how many times it was opened (the first open and every reconnect).
        reason (str): what failed and what was tried (timeouts, backoff).
    """

    def __init__(self, stream: str, reason: str, attempts: int, item: int = -1) -> None:
        super().__init__(f"stream {stream}: {reason}")
        self.stream = stream
        self.reason = reason
        self.attempts = attempts
        self.item = item

    def __reduce__(self):
        return type(self), (self.stream, self.reason, self.attempts, self.item)
