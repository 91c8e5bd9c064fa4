"""What frames a run reads: the items of a source, and the plan of frame ids over them.

Sources (:func:`plan_frames`):

- ``"synthetic"``: ``synthetic_count`` generated scenes (:mod:`yolo.synthetic`).
- an image file (:data:`IMAGE_EXTENSIONS`) or a video file (:data:`VIDEO_EXTENSIONS`).
- a directory, searched recursively, following directory symlinks (a directory reached twice,
  e.g. through a symlink loop, is listed once). Images are images and videos are read frame by
  frame; every other entry still becomes an item, of kind ``"broken"``, that yields one failed
  frame with its reason: ``"broken symlink -> target"``, ``"unsupported file type .txt"``,
  ``"unreadable file (permission denied)"``, ``"not a regular file"``, ``"cannot open video"``,
  ``"cannot list directory (...)"``. Hidden entries (names starting with ``.``: ``.git``,
  ``.DS_Store``, ``._x.jpg``) are left out, as ``ls`` and ``glob`` leave them out, and counted
  in :attr:`FramePlan.skipped` with the directories listed twice.
- a glob (``data/**/*.jpg``): the files it matches, classified like a directory's entries; the
  directories it matches are ignored (``**`` descends).
- a ``.txt`` list: one source per line (blank lines and ``#`` comments ignored): a path
  (relative to the list's folder) of an image, video, directory or glob, a URL, or a camera
  index. Lines that name nothing readable become ``"broken"`` items.
- a camera index (``"0"``, ``"1"``): a live stream from ``cv2.VideoCapture(int)``. A source
  made of digits is always a camera; write ``./0`` for a file named ``0``.
- a URL of :data:`yolo.streams.URL_SCHEMES`. An http(s) URL is opened once here: with a known
  frame count it is a video, read frame by frame like a file; without one it is a live stream.
  Other schemes (rtsp, rtmp, ...) are live streams and are not opened here.

A source that names nothing usable (a missing path, an empty directory, an unsupported or
unopenable single file, a glob that matches nothing) is a :class:`ValueError`.

Frame ids (:class:`FramePlan`): items have a planned length per pass (``lengths``: 1 for an
image, synthetic scene or broken entry, the frame count after ``vid_stride`` for a video, see
below for live streams). One pass gives ids ``0 .. pass_len - 1`` in item order, and ids go on
pass after pass, so the id of frame ``index`` of item ``i`` in pass ``c`` is
``c * pass_len + sum(lengths[:i]) + index`` and :meth:`FramePlan.ref` maps an id back.

- A finite plan (no live stream) holds one pass, or exactly ``frames`` ids looping over the
  source as often as needed: ``total`` is exact.
- With live streams and ``frames`` given, the finite items are read once (truncated if
  ``frames`` is smaller) and the live streams share the remaining ids, split evenly (the first
  streams get one more), each stream's ids one contiguous block in item order: ``total ==
  frames``. The plan does not loop.
- With live streams and no ``frames`` the plan is open-ended: ``total`` is None, the finite items
  are read once (ids ``0 .. pass_len - 1``) and live frames get ids when read: the ``k``-th
  live frame of ``worker`` gets ``pass_len + k * workers + worker``
  (:meth:`FramePlan.open_stream_id`).

Worker shares (:meth:`FramePlan.worker_ids`): each video and live stream goes whole to one
worker, so its frames come from one process in order: live streams first, spread over the
workers, then videos longest first, each to the worker with the fewest streams and then the
fewest frames (balanced by frame count). Single frames (images, synthetic scenes, broken
entries) fill the workers up to an even frame count, interleaved in id order (with no videos,
frame ``i`` goes to worker ``i % workers`` as before). A worker reads its ids in this order:
its non-live ids ascending, then its live streams' ids alternating between its streams. Every
planned id belongs to exactly one worker.

No sockets here: the plan is plain data, cheap to pass to a worker process.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from yolo.frames import FrameReadError, FrameRef, VideoInfo
from yolo.reader import FrameReader, ShareReader
from yolo.streams import FILE_URL_SCHEMES, StreamOptions, is_camera, is_url, probe_video, stream_name, url_name

__all__ = ["FramePlan", "FrameReadError", "FrameReader", "FrameRef", "ShareReader", "SourceItem", "plan_frames"]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".mpg", ".mpeg"})
LIST_EXTENSIONS = frozenset({".txt"})
SYNTHETIC_SOURCE = "synthetic"
GLOB_CHARS = frozenset("*?[")
WHOLE_KINDS = frozenset({"video", "stream"})  # read whole, in order, by one worker


@dataclass(frozen=True)
class SourceItem:
    """One image, video, live stream, synthetic scene or broken entry of a source.

    Attributes:
        kind (str): ``"image"``, ``"video"``, ``"stream"``, ``"synthetic"`` or ``"broken"``.
        location (str): absolute path, URL, camera index, or ``""`` for a synthetic scene.
        name (str): relative, file-system-safe name (see :class:`yolo.frames.FrameRef`).
        frames (int | None): frames in one pass, after ``vid_stride``; None for a live stream.
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


def _broken(location: str, name: str, reason: str) -> SourceItem:
    return SourceItem("broken", location, name, 1, reason=reason)


def _relative_name(path: str, root: str) -> str:
    """``path`` relative to ``root``; a path outside ``root`` keeps its absolute form without
    the leading separator, so names never climb out of an output folder."""
    name = os.path.relpath(path, root)
    if name == os.pardir or name.startswith(os.pardir + os.sep):
        return os.path.abspath(path).lstrip(os.sep)
    return name


def _video_item(location: str, name: str, vid_stride: int, options: StreamOptions) -> SourceItem:
    info = probe_video(location, vid_stride, options)
    if info is None:
        what = f"cannot open URL (open timeout {options.open_timeout_ms} ms)" if is_url(location) else "cannot open video"
        return _broken(location, name, what)
    if info.frames is None:
        if is_url(location):
            return SourceItem("stream", location, name, None)  # an http stream of unknown length: live
        return _broken(location, name, "video with an unknown frame count")
    return SourceItem("video", location, name, info.frames, video=info)


def _url_item(url: str, vid_stride: int, options: StreamOptions) -> SourceItem:
    if url.partition("://")[0].lower() in FILE_URL_SCHEMES:
        return _video_item(url, url_name(url), vid_stride, options)
    return SourceItem("stream", url, url_name(url), None)


def _file_item(path: str, root: str, vid_stride: int, options: StreamOptions) -> SourceItem:
    """The item of one directory entry, glob match or list line naming a file."""
    name = _relative_name(path, root)
    if os.path.islink(path) and not os.path.exists(path):
        return _broken(path, name, f"broken symlink -> {os.readlink(path)}")
    if not os.path.exists(path):
        return _broken(path, name, "no such file or directory")
    if not os.path.isfile(path):
        return _broken(path, name, "not a regular file")
    if not os.access(path, os.R_OK):
        return _broken(path, name, "unreadable file (permission denied)")
    extension = os.path.splitext(path)[1].lower()
    if extension in IMAGE_EXTENSIONS:
        return SourceItem("image", path, name, 1)
    if extension in VIDEO_EXTENSIONS:
        return _video_item(path, name, vid_stride, options)
    suffix = " (a list is read only as the source itself)" if extension in LIST_EXTENSIONS else ""
    return _broken(path, name, f"unsupported file type {extension or '(no extension)'}{suffix}")


def _walk(directory: str, root: str, vid_stride: int, options: StreamOptions) -> tuple[list[SourceItem], list[str]]:
    """The items under ``directory`` sorted by name, and notes on what was left out."""
    items, skipped, hidden = [], [], 0
    seen = {os.path.realpath(directory)}

    def unlistable(error: OSError) -> None:
        items.append(_broken(error.filename, _relative_name(error.filename, root),
                             f"cannot list directory ({error.strerror})"))

    for folder, dirs, files in os.walk(directory, onerror=unlistable, followlinks=True):
        kept = []
        for name in sorted(dirs, key=lambda d: (os.path.islink(os.path.join(folder, d)), d)):  # real ones first
            path = os.path.join(folder, name)
            if name.startswith("."):
                hidden += 1
            elif os.path.realpath(path) in seen:
                skipped.append(f"{_relative_name(path, root)}: a directory listed already ({os.path.realpath(path)})")
            else:
                seen.add(os.path.realpath(path))
                kept.append(name)
        dirs[:] = sorted(kept)
        for name in files:
            if name.startswith("."):
                hidden += 1
            else:
                items.append(_file_item(os.path.join(folder, name), root, vid_stride, options))
    if hidden:
        skipped.append(f"{hidden} hidden entries (names starting with '.') under {_relative_name(directory, root)}")
    return sorted(items, key=lambda item: item.name), skipped


def _glob_root(pattern: str) -> str:
    """The deepest directory of ``pattern`` before its first wildcard component."""
    parts = os.path.abspath(pattern).split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or os.sep


def _glob_items(pattern: str, root: str, vid_stride: int, options: StreamOptions) -> list[SourceItem]:
    matches = {os.path.abspath(p) for p in glob.glob(pattern, recursive=True)}
    files = [p for p in matches if not os.path.isdir(p)]
    return sorted((_file_item(p, root, vid_stride, options) for p in files), key=lambda item: item.name)


def _list_items(path: str, vid_stride: int, options: StreamOptions) -> tuple[list[SourceItem], list[str]]:
    """The items of a ``.txt`` list, in its order."""
    root = os.path.dirname(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"expected a readable UTF-8 list file, got {path!r} ({error})") from None
    items, skipped = [], []
    for entry in (line for line in lines if line and not line.startswith("#")):
        if is_camera(entry):
            items.append(SourceItem("stream", entry, stream_name(entry), None))
            continue
        if is_url(entry):
            items.append(_url_item(entry, vid_stride, options))
            continue
        target = os.path.join(root, os.path.expanduser(entry))
        if GLOB_CHARS & set(entry) and not os.path.exists(target):
            matched = _glob_items(target, root, vid_stride, options)
            items.extend(matched or [_broken(target, _relative_name(target, root), "glob matched no file")])
        elif os.path.isdir(target):
            found, notes = _walk(target, root, vid_stride, options)
            items.extend(found or [_broken(target, _relative_name(target, root), "directory holds no entry")])
            skipped.extend(notes)
        else:
            items.append(_file_item(os.path.abspath(target), root, vid_stride, options))
    if not items:
        raise ValueError(f"expected list file {path!r} to name at least one source, got none")
    return items, skipped


def _single_file_items(path: str, vid_stride: int, options: StreamOptions) -> list[SourceItem]:
    extension = os.path.splitext(path)[1].lower()
    item = _file_item(path, os.path.dirname(path), vid_stride, options)
    if item.kind == "broken" and (extension in IMAGE_EXTENSIONS or extension in VIDEO_EXTENSIONS):
        raise ValueError(f"expected an image or a video OpenCV can open, got {path!r}: {item.reason}")
    if item.kind == "broken":
        raise ValueError(
            f"expected an image ({', '.join(sorted(IMAGE_EXTENSIONS))}), video "
            f"({', '.join(sorted(VIDEO_EXTENSIONS))}) or list ({', '.join(sorted(LIST_EXTENSIONS))}) file, "
            f"got extension {extension!r} in {path!r}")
    return [item]


def _discover(source: str, synthetic_count: int, vid_stride: int, options: StreamOptions
              ) -> tuple[list[SourceItem], str, list[str]]:
    """``(items, root, skipped)`` of ``source``; names are relative to ``root``."""
    if source == SYNTHETIC_SOURCE:
        if isinstance(synthetic_count, bool) or not isinstance(synthetic_count, int) or synthetic_count <= 0:
            raise ValueError(f"expected synthetic_count to be an int > 0, got {synthetic_count!r}")
        return [SourceItem("synthetic", "", f"synthetic/{i:05d}.jpg", 1) for i in range(synthetic_count)], "", []
    if is_camera(source):
        return [SourceItem("stream", source, stream_name(source), None)], "", []
    if is_url(source):
        item = _url_item(source, vid_stride, options)
        if item.kind == "broken":
            raise ValueError(f"expected a URL OpenCV can open, got {item.name}: {item.reason}")
        return [item], "", []
    if GLOB_CHARS & set(source) and not os.path.exists(source):
        root = _glob_root(source)
        items = _glob_items(source, root, vid_stride, options)
        if not items:
            raise ValueError(f"expected glob {source!r} to match files, got none")
        return items, root, []
    path = os.path.abspath(source)
    if os.path.islink(path) and not os.path.exists(path):
        raise ValueError(f"expected an existing source, got broken symlink {source!r} -> {os.readlink(path)}")
    if not os.path.exists(path):
        raise ValueError(f"expected {SYNTHETIC_SOURCE!r}, a directory, an image, a video, a list, a glob, a URL "
                         f"or a camera index, got nonexistent path {source!r}")
    if os.path.isdir(path):
        items, skipped = _walk(path, path, vid_stride, options)
        if not items:
            raise ValueError(f"expected directory {source!r} to contain files, got none"
                             + (f" ({'; '.join(skipped)})" if skipped else ""))
        return items, path, skipped
    if os.path.splitext(path)[1].lower() in LIST_EXTENSIONS:
        items, skipped = _list_items(path, vid_stride, options)
        return items, os.path.dirname(path), skipped
    return _single_file_items(path, vid_stride, options), os.path.dirname(path), []


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"expected {name} to be an int >= {minimum}, got {value!r}")


def _check_worker(worker: int, workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"expected workers to be an int >= 1, got {workers!r}")
    if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < workers:
        raise ValueError(f"expected worker to be an int in [0, {workers}), got {worker!r}")


def _water_fill(loads: np.ndarray, count: int) -> np.ndarray:
    """How many of ``count`` single frames each worker takes so that ``loads + quotas`` is as
    level as possible; frames left over go to the lowest worker indices at the level."""
    level, top = int(loads.min()), int(loads.min()) + count
    while level < top:  # the highest level the frames fill completely
        middle = (level + top + 1) // 2
        if int(np.maximum(0, middle - loads).sum()) <= count:
            level = middle
        else:
            top = middle - 1
    quotas = np.maximum(0, level - loads)
    extra = count - int(quotas.sum())
    quotas[np.flatnonzero(loads <= level)[:extra]] += 1
    return quotas


def _interleave(quotas: np.ndarray) -> np.ndarray:
    """A sequence holding worker ``w`` ``quotas[w]`` times, each worker's turns spread evenly:
    its ``r``-th turn sits at ``(r + 1/2) / quotas[w]`` of the way, ties to the lower index."""
    owners = np.repeat(np.arange(len(quotas)), quotas)
    ranks = np.arange(len(owners)) - np.repeat(np.cumsum(quotas) - quotas, quotas)
    keys = (2 * ranks + 1) / (2 * quotas[owners])
    return owners[np.lexsort((owners, keys))]


@dataclass(frozen=True)
class FramePlan:
    """The frames of one run (see the module docstring for the id layout and worker shares).

    Attributes:
        source (str): the source as given.
        items (tuple[SourceItem, ...]): what the source holds, in reading order.
        lengths (tuple[int, ...]): planned frames of each item per pass: a live stream's share
            of ``frames``, or 0 in an open-ended plan.
        total (int | None): the exact number of frame ids; None for an open-ended plan.
        vid_stride (int): every ``vid_stride``-th frame of videos and live streams is read.
        root (str): names of file frames are relative to this directory; ``''`` otherwise.
        skipped (tuple[str, ...]): what was left out on purpose (hidden entries, directories
            reached twice), for the run's log.
    """

    source: str
    items: tuple[SourceItem, ...]
    lengths: tuple[int, ...]
    total: int | None
    vid_stride: int = 1
    root: str = ""
    skipped: tuple[str, ...] = ()

    @property
    def open_ended(self) -> bool:
        return self.total is None

    @cached_property
    def _offsets(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.lengths, dtype=np.int64)))

    @property
    def pass_len(self) -> int:
        """Ids in one pass over the items (of an open-ended plan: its finite ids)."""
        return int(self._offsets[-1])

    @property
    def planned(self) -> int:
        """How many ids the plan fixes in advance: ``total``, or ``pass_len`` if open-ended."""
        return self.pass_len if self.total is None else self.total

    def summary(self) -> str:
        """One line for the run's log: the items by kind, and what was skipped."""
        kinds = {}
        for item in self.items:
            kinds[item.kind] = kinds.get(item.kind, 0) + 1
        frames = "open-ended" if self.total is None else f"{self.total} frames"
        text = f"{frames} from {', '.join(f'{n} {kind}' for kind, n in kinds.items())}"
        return text + (f"; skipped: {'; '.join(self.skipped)}" if self.skipped else "")

    def ref(self, frame_id: int) -> FrameRef:
        """The frame with id ``frame_id``, ``0 <= frame_id < planned``; a planned live frame
        has ``source_index`` -1 until read."""
        if isinstance(frame_id, bool) or not 0 <= frame_id < self.planned:
            stream_note = " (the ids of an open-ended plan's live frames are given when read)" if self.open_ended else ""
            raise IndexError(f"expected a frame id in [0, {self.planned}) for source {self.source!r}, "
                             f"got {frame_id}{stream_note}")
        cycle, rest = divmod(int(frame_id), self.pass_len)
        item = int(np.searchsorted(self._offsets, rest, side="right")) - 1
        return self.stream_ref(frame_id, item, rest - int(self._offsets[item]), -1, cycle)

    def stream_ref(self, frame_id: int, item: int, index: int, source_index: int, cycle: int = 0) -> FrameRef:
        """The :class:`FrameRef` of frame ``index`` of ``items[item]``; readers use it to name
        the live frames they read."""
        source = self.items[item]
        name = source.name
        if source.kind == "video":
            source_index = index * self.vid_stride
            name = f"{source.name}:{source_index:06d}"
        elif source.kind == "stream":
            name = f"{source.name}:{index:06d}"
        elif source.kind == "synthetic":
            source_index = item
        else:
            source_index = 0
        return FrameRef(int(frame_id), source.kind, name, item, int(index), int(cycle), source.location,
                        int(source_index), source.reason)

    def _item_of_ids(self) -> np.ndarray:
        """The item of every planned id."""
        one_pass = np.repeat(np.arange(len(self.items), dtype=np.int32), self.lengths)
        passes = -(-self.planned // len(one_pass)) if len(one_pass) else 0
        return np.tile(one_pass, passes)[:self.planned]

    def _assign_whole(self, frames: np.ndarray, workers: int) -> np.ndarray:
        """The worker of each video and live stream, -1 for items shared frame by frame."""
        owners = np.full(len(self.items), -1, dtype=np.int64)
        whole = [i for i, item in enumerate(self.items) if item.kind in WHOLE_KINDS
                 and (frames[i] > 0 or (item.kind == "stream" and self.open_ended))]
        whole.sort(key=lambda i: (self.items[i].kind != "stream", -frames[i], i))
        loads = [(0, 0)] * workers  # (live streams, frames)
        for i in whole:
            worker = min(range(workers), key=lambda w: (loads[w], w))
            owners[i] = worker
            streams, count = loads[worker]
            loads[worker] = (streams + (self.items[i].kind == "stream"), count + int(frames[i]))
        return owners

    def _owners(self, workers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(item of each planned id, worker of each planned id, worker of each item or -1)``."""
        item_of_ids = self._item_of_ids()
        whole = self._assign_whole(np.bincount(item_of_ids, minlength=len(self.items)), workers)
        owners = whole[item_of_ids]
        singles = np.flatnonzero(owners < 0)
        loads = np.bincount(owners[owners >= 0], minlength=workers)
        owners[singles] = _interleave(_water_fill(loads, len(singles)))
        return item_of_ids, owners, whole

    def assignment(self, workers: int) -> tuple[int, ...]:
        """For each item, the worker that reads it whole (videos and live streams), or -1 for
        items whose frames are shared among the workers."""
        _check_worker(0, workers)
        return tuple(int(w) for w in self._owners(workers)[2])

    def worker_streams(self, worker: int, workers: int) -> tuple[int, ...]:
        """The items of the live streams ``worker`` reads."""
        _check_worker(worker, workers)
        whole = self._owners(workers)[2]
        return tuple(i for i, item in enumerate(self.items) if item.kind == "stream" and whole[i] == worker)

    def worker_ids(self, worker: int, workers: int) -> list[int]:
        """The ids ``worker`` of ``workers`` reads, in reading order; every planned id goes to
        exactly one worker. A reader restarted at position ``p`` resumes at ``ids[p]``.

        Its non-live ids ascending, then its live streams' ids (a finite plan's stream
        shares) alternating between its streams. For an open-ended plan only the finite ids:
        the live frames that follow get :meth:`open_stream_id`.
        """
        _check_worker(worker, workers)
        item_of_ids, owners, _ = self._owners(workers)
        live = np.array([item.kind == "stream" for item in self.items], dtype=bool)[item_of_ids]
        finite_ids = np.flatnonzero((owners == worker) & ~live)
        live_ids = np.flatnonzero((owners == worker) & live)
        turns = live_ids - self._offsets[item_of_ids[live_ids]]  # each frame's index within its stream
        live_ids = live_ids[np.lexsort((item_of_ids[live_ids], turns))]
        return np.concatenate((finite_ids, live_ids)).tolist()

    def open_stream_id(self, worker: int, workers: int, k: int) -> int:
        """The id of the ``k``-th live frame ``worker`` reads in an open-ended plan."""
        if not self.open_ended:
            raise ValueError(f"expected an open-ended plan, got one of {self.total} frames: its live ids are planned")
        return self.pass_len + k * workers + worker


def _plan_lengths(items: list[SourceItem], frames: int | None) -> tuple[list[int], int | None]:
    """``(lengths, total)``: see the module docstring."""
    lengths = [0 if item.kind == "stream" else item.frames for item in items]
    finite = sum(lengths)
    live = [i for i, item in enumerate(items) if item.kind == "stream"]
    if not live:
        return lengths, finite if frames is None else frames
    if frames is None:
        return lengths, None
    share, extra = divmod(max(0, frames - finite), len(live))
    for turn, i in enumerate(live):
        lengths[i] = share + (turn < extra)
    return lengths, frames


def plan_frames(source: str, frames: int | None = None, synthetic_count: int = 64, vid_stride: int = 1,
                streams: StreamOptions | None = None) -> FramePlan:
    """Plan a run over ``source`` (see the module docstring).

    Args:
        source (str): ``"synthetic"``, a path, a glob, a ``.txt`` list, a URL or a camera index.
        frames (int | None): exactly this many frames, looping over a finite source as often as
            needed; None: one pass, or open-ended with a live stream.
        synthetic_count (int): how many scenes ``"synthetic"`` holds.
        vid_stride (int): read every ``vid_stride``-th frame of videos and live streams.
        streams (StreamOptions | None): the open timeout for probing http(s) URLs.

    Returns:
        FramePlan: plain data, to pass to every reader.

    Raises:
        ValueError: a source that names nothing usable, or a bad argument.
    """
    if frames is not None:
        _check_int("frames", frames, 1)
    _check_int("vid_stride", vid_stride, 1)
    items, root, skipped = _discover(source, synthetic_count, vid_stride, streams or StreamOptions())
    lengths, total = _plan_lengths(items, frames)
    return FramePlan(source, tuple(items), tuple(lengths), total, vid_stride, root, tuple(skipped))
