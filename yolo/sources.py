"""What frames a run reads, and how one worker process reads them.

A source is ``"synthetic"``, a directory of images (searched recursively), a single image,
a glob pattern, or a video file. :func:`plan_frames` turns it into a :class:`FramePlan`: a
fixed list of frame ids ``0 .. total-1`` that loops over the source when the run asks for
more frames than one pass holds. Each worker takes its share with
:meth:`FramePlan.worker_ids` and reads frames with a :class:`FrameReader`.

No sockets here: the plan is plain data, cheap to pass to a worker process.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from types import TracebackType

import cv2
import numpy as np

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".mpg", ".mpeg"})
SYNTHETIC_SOURCE = "synthetic"
SYNTHETIC_SHAPES = ((480, 640), (720, 1280), (1080, 810), (375, 500), (1080, 1920), (640, 640))
SYNTHETIC_SHAPE_COUNT = 8
SYNTHETIC_NOISE_SCALE = 4  # background and grain are drawn at 1/4 size, then upscaled
GLOB_CHARS = frozenset("*?[")


def split_video_frame(name: str) -> tuple[str, int] | None:
    """``"clip.mp4:000017"`` (a video frame's name, see :meth:`FramePlan.ref`) -> ``("clip.mp4", 17)``,
    the frame's 0-based index in the video; None for any other frame name."""
    video, sep, index = name.rpartition(":")
    if not (sep and video and index.isascii() and index.isdigit()):
        return None
    return video, int(index)


class FrameReadError(ValueError):
    """A planned frame could not be read: an undecodable image or a video that ended early."""


@dataclass(frozen=True)
class FrameRef:
    """One frame of a run, enough for any worker to read it and for reports to name it."""

    frame_id: int
    kind: str  # "image" | "video" | "synthetic"
    path: str  # absolute path; '' for synthetic frames
    name: str  # relative path, "video.mp4:000017" or "synthetic/00017.jpg"
    index: int  # position in the source: image list position, video frame, synthetic index
    cycle: int  # how many full passes over the source came before this frame


@dataclass(frozen=True)
class FramePlan:
    """The frames of one run: ``total`` ids that loop over ``source_len`` source frames."""

    source: str
    kind: str  # "image" | "video" | "synthetic"
    items: tuple[str, ...]  # sorted absolute image paths, (video_path,), or () for synthetic
    total: int
    source_len: int
    root: str  # names of file frames are relative to this directory; '' for synthetic

    def ref(self, frame_id: int) -> FrameRef:
        """The frame with id ``frame_id``, ``0 <= frame_id < total``."""
        if not 0 <= frame_id < self.total:
            raise IndexError(
                f"expected a frame id in [0, {self.total}) for source {self.source!r}, "
                f"got {frame_id}"
            )
        cycle, index = divmod(frame_id, self.source_len)
        if self.kind == "synthetic":
            return FrameRef(frame_id, self.kind, "", f"synthetic/{index:05d}.jpg", index, cycle)
        if self.kind == "video":
            path = self.items[0]
            name = f"{os.path.relpath(path, self.root)}:{index:06d}"
            return FrameRef(frame_id, self.kind, path, name, index, cycle)
        path = self.items[index]
        return FrameRef(frame_id, self.kind, path, os.path.relpath(path, self.root), index, cycle)

    def worker_ids(self, worker: int, workers: int) -> range:
        """The frame ids read by ``worker`` out of ``workers``; every id goes to exactly one.

        Images and synthetic frames are interleaved (``worker, worker + workers, ...``) so
        all workers start at once; video ids come in contiguous chunks, sizes differing by at
        most one, so each worker seeks once and then decodes sequentially.
        """
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"expected workers to be an int >= 1, got {workers!r}")
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < workers:
            raise ValueError(f"expected worker to be an int in [0, {workers}), got {worker!r}")
        if self.kind != "video":
            return range(worker, self.total, workers)
        base, extra = divmod(self.total, workers)
        start = worker * base + min(worker, extra)
        return range(start, start + base + (1 if worker < extra else 0))


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _is_image(path: str) -> bool:
    return _extension(path) in IMAGE_EXTENSIONS and os.path.isfile(path)


def _glob_root(pattern: str) -> str:
    """The deepest directory of ``pattern`` before its first wildcard component."""
    parts = os.path.abspath(pattern).split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or os.sep


def _sorted_images(paths: list[str], root: str) -> tuple[str, ...]:
    absolute = {os.path.abspath(p) for p in paths if _is_image(p)}
    return tuple(sorted(absolute, key=lambda p: os.path.relpath(p, root)))


def _video_frame_count(path: str) -> int:
    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise ValueError(f"expected a video that OpenCV can open, got {path!r}")
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        capture.release()
    if count <= 0:
        raise ValueError(f"expected a video with a known frame count > 0, got {count} for {path!r}")
    return count


def _plan_source(source: str, synthetic_count: int) -> tuple[str, tuple[str, ...], int, str]:
    """``(kind, items, source_len, root)`` for one pass over ``source``."""
    if source == SYNTHETIC_SOURCE:
        if isinstance(synthetic_count, bool) or not isinstance(synthetic_count, int) or synthetic_count <= 0:
            raise ValueError(f"expected synthetic_count to be an int > 0, got {synthetic_count!r}")
        return "synthetic", (), synthetic_count, ""
    if GLOB_CHARS & set(source) and not os.path.exists(source):
        root = _glob_root(source)
        items = _sorted_images(glob.glob(source, recursive=True), root)
        if not items:
            raise ValueError(
                f"expected glob {source!r} to match image files "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}), got none"
            )
        return "image", items, len(items), root
    if not os.path.exists(source):
        raise ValueError(
            f"expected {SYNTHETIC_SOURCE!r}, a directory, an image, a video or a glob, "
            f"got nonexistent path {source!r}"
        )
    if os.path.isdir(source):
        root = os.path.abspath(source)
        found = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]
        items = _sorted_images(found, root)
        if not items:
            raise ValueError(
                f"expected directory {source!r} to contain image files "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}), got none"
            )
        return "image", items, len(items), root
    path = os.path.abspath(source)
    extension = _extension(path)
    if extension in IMAGE_EXTENSIONS:
        return "image", (path,), 1, os.path.dirname(path)
    if extension in VIDEO_EXTENSIONS:
        return "video", (path,), _video_frame_count(path), os.path.dirname(path)
    raise ValueError(
        f"expected an image ({', '.join(sorted(IMAGE_EXTENSIONS))}) or video "
        f"({', '.join(sorted(VIDEO_EXTENSIONS))}) file, got extension {extension!r} in {source!r}"
    )


def plan_frames(source: str, frames: int | None = None, synthetic_count: int = 64) -> FramePlan:
    """Plan a run over ``source``: one pass if ``frames`` is None, else exactly ``frames``
    frames, looping over the source as often as needed."""
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames <= 0):
        raise ValueError(f"expected frames to be None or an int > 0, got {frames!r}")
    kind, items, source_len, root = _plan_source(source, synthetic_count)
    total = source_len if frames is None else frames
    return FramePlan(source, kind, items, total, source_len, root)


def synthetic_image(index: int, seed: int = 0) -> np.ndarray:
    """A deterministic synthetic scene, BGR uint8 ``[H, W, 3]``; the shape cycles with ``index``
    over :data:`SYNTHETIC_SHAPES`.

    A smooth colour gradient with soft grain, then a handful of filled rectangles, ellipses
    and lines in random colours: flat regions and edges, roughly like a photo for JPEG and
    for the detector's preprocessing, at a cost of a few milliseconds.
    """
    if index < 0:
        raise ValueError(f"expected a synthetic index >= 0, got {index}")
    rng = np.random.default_rng((seed, index))
    height, width = SYNTHETIC_SHAPES[index % len(SYNTHETIC_SHAPES)]
    small = (width // SYNTHETIC_NOISE_SCALE + 1, height // SYNTHETIC_NOISE_SCALE + 1)  # (w, h)
    corners = rng.integers(0, 256, size=(3, 3, 3), dtype=np.uint8)
    background = cv2.resize(corners, small, interpolation=cv2.INTER_LINEAR)
    noise = rng.integers(0, 24, size=(small[1], small[0], 3), dtype=np.uint8)
    cv2.add(background, noise, dst=background)
    image = cv2.resize(background, (width, height), interpolation=cv2.INTER_LINEAR)
    size = min(height, width)
    for _ in range(SYNTHETIC_SHAPE_COUNT):
        shape = int(rng.integers(0, 3))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        extent = int(rng.integers(size // 20, size // 3))
        if shape == 0:
            corner = (x + int(rng.integers(-extent, extent)), y + int(rng.integers(-extent, extent)))
            cv2.rectangle(image, (x, y), corner, colour, thickness=-1)
        elif shape == 1:
            axes = (extent, int(rng.integers(size // 40 + 1, extent + 1)))
            cv2.ellipse(image, (x, y), axes, float(rng.integers(0, 180)), 0, 360, colour, thickness=-1)
        else:
            end = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            cv2.line(image, (x, y), end, colour, thickness=int(rng.integers(1, 8)))
    return image


class FrameReader:
    """Reads :class:`FrameRef` frames inside one worker process; use as a context manager.

    A video stays open between reads and is only re-positioned when the requested frame is
    not the next one, so a contiguous chunk of ids decodes sequentially.
    """

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._video_path = ""
        self._video: cv2.VideoCapture | None = None
        self._video_len = 0
        self._next_index = 0

    def __enter__(self) -> FrameReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def read(self, ref: FrameRef) -> np.ndarray:
        """The pixels of ``ref``, BGR uint8 ``[H, W, 3]``; raises :class:`FrameReadError`."""
        if ref.kind == "synthetic":
            return synthetic_image(ref.index, self._seed)
        if ref.kind == "image":
            return self._read_image(ref.path)
        if ref.kind == "video":
            return self._read_video(ref.path, ref.index)
        raise ValueError(f"expected kind 'image', 'video' or 'synthetic', got {ref.kind!r}")

    def close(self) -> None:
        """Release the open video, if any; the reader may still be used afterwards."""
        if self._video is not None:
            self._video.release()
        self._video = None
        self._video_path = ""

    def _read_image(self, path: str) -> np.ndarray:
        try:
            data = np.fromfile(path, np.uint8)
        except OSError as error:
            raise FrameReadError(f"cannot read image: {path} ({error.strerror})") from error
        image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
        if image is None:
            raise FrameReadError(f"cannot decode image: {path}")
        return image

    def _open_video(self, path: str) -> cv2.VideoCapture:
        if self._video is not None and self._video_path == path:
            return self._video
        self.close()
        video = cv2.VideoCapture(path)
        if not video.isOpened():
            video.release()
            raise FrameReadError(f"cannot open video: {path}")
        self._video, self._video_path = video, path
        self._video_len = int(video.get(cv2.CAP_PROP_FRAME_COUNT))
        self._next_index = 0
        return video

    def _read_video(self, path: str, index: int) -> np.ndarray:
        video = self._open_video(path)
        if index != self._next_index:
            video.set(cv2.CAP_PROP_POS_FRAMES, index)
        ok, image = video.read()
        if not ok or image is None:
            self._next_index = -1
            raise FrameReadError(f"video ended at frame {index} of {self._video_len}: {path}")
        self._next_index = index + 1
        return image
