"""A feed: frames handed to a running pipeline a few at a time, by whoever writes the feed files.

``feed:DIR`` as a source is one feed file per preprocess worker, ``DIR/0.jsonl`` ...
``DIR/<n-1>.jsonl`` (the run needs ``--pre-workers n``). Each line is one :class:`FeedEntry` (an
image, a whole video or the rest of one, a broken entry, a synthetic scene), written by another
process while the run goes on, and one :data:`END` line closes the file. A cluster node's
pipeline runs on a feed (``cluster/node.py``): the driver keeps each node a few seconds of work
ahead, so a faster node takes more and one runner start serves the whole run.

The plan of a feed is open-ended: one live item of kind ``"feed"`` per file (see
:mod:`inputs.kinds`), so each worker reads its own file (:meth:`FramePlan.worker_streams`). A
worker's ``k``-th frame gets the open-ended id :meth:`FramePlan.open_stream_id` (the writer maps
it back: it knows what it wrote, in order) and the entry's own name, so the outputs carry the writer's names. Every entry yields exactly its
``frames`` frames, read or failed (:class:`FrameReadError`), so the ``k``-th frame of a file
is known to the writer whatever happened to the ones before it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from inputs.frames import Frame, FrameReadError, FrameRef, SourceItem

FEED_PREFIX = "feed:"
FEED_SUFFIX = ".jsonl"
END = b'{"end": true}\n'
FEED_KINDS = frozenset({"image", "video", "synthetic", "broken"})


class FeedWaiting(Exception):
    """No whole line in the feed yet: the caller does something else and asks again."""


def is_feed(source: str) -> bool:
    return source.startswith(FEED_PREFIX)


def feed_path(folder: str, worker: int) -> str:
    return os.path.join(folder, f"{worker}{FEED_SUFFIX}")


@dataclass(frozen=True)
class FeedEntry:
    """One line of a feed.

    Attributes:
        kind (str): ``"image"``, ``"video"``, ``"synthetic"`` or ``"broken"``.
        location (str): absolute path or URL; ``""`` for a synthetic scene.
        name (str): the frames' name in the outputs (a video's frames add ``:<frame number>``).
        frames (int): frames this entry yields (after ``vid_stride``).
        item (int): the writer's number of the item: frames of one video share it.
        start (int): a video's first frame read, after ``vid_stride`` (the rest of a video).
        scene (int): a synthetic scene's number.
        reason (str): why a ``"broken"`` entry cannot be read.
        first_id (int): the run-wide id of its first frame, where the writer has one (a cluster
            run's driver), so ``--save-images N`` keeps the run's every N-th image; -1: none.
            (A video part keeps every N-th of its own frames: its annotated part is written
            from them.)
    """

    kind: str
    location: str
    name: str
    frames: int
    item: int
    start: int = 0
    scene: int = 0
    reason: str = ""
    first_id: int = -1

    def __post_init__(self) -> None:
        if self.kind not in FEED_KINDS and not _finite_kind(self.kind):
            raise ValueError(f"expected a feed entry of kind {sorted(FEED_KINDS)} or another finite input kind, "
                             f"got {self.kind!r}")
        for name in ("frames", "item", "start", "scene"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (name == "frames"):
                raise ValueError(f"expected feed entry {name} to be an int >= {int(name == 'frames')}, got {value!r}")
        if isinstance(self.first_id, bool) or not isinstance(self.first_id, int) or self.first_id < -1:
            raise ValueError(f"expected feed entry first_id to be an int >= -1, got {self.first_id!r}")

    def line(self) -> bytes:
        return (json.dumps(asdict(self), ensure_ascii=True) + "\n").encode("ascii")

    @classmethod
    def parse(cls, line: bytes) -> FeedEntry | None:
        """The entry of a line; None for the end line."""
        try:
            fields = json.loads(line)
            return None if fields.get("end") is True else cls(**fields)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"expected a feed line (JSON of a FeedEntry), got {line[:200]!r}: {exc}") from None


_finite_kind = FEED_KINDS.__contains__  # until inputs.kinds, once imported, says which registered kinds are read frame by frame


def accept_kinds(finite_kind) -> None:
    """What a feed line may name beside FEED_KINDS: ``finite_kind(name)``, a registered kind read
    frame by frame (an image in object storage, a plugin's). Set by inputs.kinds, which imports
    this module: the registry sits above the feed, not beside it."""
    global _finite_kind
    _finite_kind = finite_kind


def feed_items(source: str) -> list[SourceItem]:
    """The plan's items of ``feed:DIR``: a live ``"feed"`` item per file, ``0.jsonl`` upwards."""
    folder = source[len(FEED_PREFIX):]
    count = 0
    while os.path.isfile(feed_path(folder, count)):
        count += 1
    if not count:
        raise ValueError(f"expected feed folder {folder!r} to hold 0{FEED_SUFFIX} (one file per preprocess worker), "
                         "got none")
    return [SourceItem("feed", feed_path(folder, w), f"feed{w}", None) for w in range(count)]


def check_feed_workers(plan, readers: int) -> None:
    """A feed is read by one preprocess worker per file: ValueError for another count."""
    if readers != len(plan.items):
        raise ValueError(f"a feed of {len(plan.items)} files needs --pre-workers {len(plan.items)} (one reader per "
                         f"file), got {readers}")


class FeedReader:
    """One preprocess worker's feed file, with :class:`inputs.reader.ShareReader`'s interface;
    ``plan`` is the feed's :class:`inputs.plans.FramePlan`, ``frames`` the
    :class:`inputs.reader.FrameReader` that reads its entries' frames (closed with this reader).
    :func:`inputs.reader.open_share` makes one for a feed.

    :meth:`next` raises :class:`FeedWaiting` when the writer has not written the next line yet,
    and returns None after the end line. ``start`` frames (a restarted worker's predecessor read
    them) are passed over without reading.
    """

    def __init__(self, plan, worker: int = 0, workers: int = 1, start: int = 0, *, frames) -> None:
        mine = plan.worker_streams(worker, workers)
        if len(mine) != 1:
            raise ValueError(f"expected one feed file per preprocess worker, got {len(plan.items)} files for "
                             f"{workers} workers: run with --pre-workers {len(plan.items)}")
        self._plan, self._worker, self._workers = plan, worker, workers
        self._file = open(plan.items[mine[0]].location, "rb")
        self._partial = b""
        self._entry: FeedEntry | None = None
        self._index = 0  # frames of the entry handed out
        self._ended = False
        self._position = 0
        self._frames = frames
        while self._position < start:
            if self.skip() is None:
                break

    @property
    def position(self) -> int:
        return self._position

    @property
    def planned(self) -> int:
        return 0  # every frame of a feed is a live one

    def next(self) -> Frame | None:
        ref = self._current()
        if ref is None:
            return None
        try:
            frame = self._frames.read_frame(ref)
        except FrameReadError:
            self._advance()
            raise
        self._advance()
        return frame

    def skip(self) -> FrameRef | None:
        """Pass over the next frame without reading it; its ref, or None after the end line."""
        ref = self._current()
        if ref is not None:
            self._advance()
        return ref

    def stream_stats(self) -> list:
        return []

    def close(self) -> None:
        self._frames.close()
        self._file.close()

    def _current(self) -> FrameRef | None:
        while not self._ended and (self._entry is None or self._index >= self._entry.frames):
            line = self._read_line()
            if line is None:
                raise FeedWaiting(f"feed {self._file.name}: no line yet")
            self._entry, self._index = FeedEntry.parse(line), 0
            self._ended = self._entry is None
        if self._ended:
            return None
        return self._ref(self._entry, self._index)

    def _advance(self) -> None:
        self._index += 1
        self._position += 1

    def _ref(self, entry: FeedEntry, index: int) -> FrameRef:
        frame_id = self._plan.open_stream_id(self._worker, self._workers, self._position)
        if entry.kind == "video":
            # Named by its frame number in the file; indexed from 0 within the entry, so that the
            # rest of a video (start > 0) is a video of its own to the collector's video writer.
            source_index = (entry.start + index) * self._plan.vid_stride
            return FrameRef(frame_id, "video", f"{entry.name}:{source_index + 1:06d}", entry.item, index, 0,
                            entry.location, source_index)  # kept every N-th of the entry: its video part's own count
        source_index = entry.scene if entry.kind == "synthetic" else 0
        save_number = entry.first_id + index if entry.first_id >= 0 else -1
        return FrameRef(frame_id, entry.kind, entry.name, entry.item, 0, 0, entry.location, source_index, entry.reason,
                        save_number)

    def _read_line(self) -> bytes | None:
        """The next whole line, or None: a line being written is kept until its newline comes."""
        while b"\n" not in self._partial:
            more = self._file.read(1 << 16)
            if not more:
                return None
            self._partial += more
        line, _, self._partial = self._partial.partition(b"\n")
        return line
