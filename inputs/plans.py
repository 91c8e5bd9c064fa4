"""The frame ids of a run and each worker's share of them.

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

An item's input kind (:mod:`inputs.kinds`) says which of these it is: a live kind (a camera,
a live URL, a feed file) or a video kind (frames with a place in a video), else single frames.

Worker shares (:meth:`FramePlan.worker_ids`): each video and live stream goes whole to one
worker, so its frames come from one process in order: live streams first, spread over the
workers, then videos longest first, each to the worker with the fewest streams and then the
fewest frames (balanced by frame count). Single frames (images, synthetic scenes, broken
entries) fill the workers up to an even frame count, interleaved in id order (with no videos,
frame ``i`` goes to worker ``i % workers`` as before). A worker reads its ids in this order:
its non-live ids ascending, then its live streams' ids alternating between its streams. Every
planned id belongs to exactly one worker.

:func:`inputs.sources.plan_frames` makes a plan from a source; the plan is plain data (no
sockets, no open files), cheap to pass to a worker process.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from inputs.frames import FrameRef, SourceItem
from inputs.kinds import input_kind


def _live(item: SourceItem) -> bool:
    return input_kind(item.kind).live


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
            reached twice, files that are not images or videos), for the run's log.
        skipped_files (int): files of a directory left out for not being images or videos.
    """

    source: str
    items: tuple[SourceItem, ...]
    lengths: tuple[int, ...]
    total: int | None
    vid_stride: int = 1
    root: str = ""
    skipped: tuple[str, ...] = ()
    skipped_files: int = 0

    @property
    def open_ended(self) -> bool:
        return self.total is None

    @cached_property
    def _offsets(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.lengths, dtype=np.int64)))

    @cached_property
    def _offset_list(self) -> list[int]:
        """:attr:`_offsets` as Python ints: bisect on it costs a tenth of a numpy call per frame
        (the collector looks up every frame's name)."""
        return [int(offset) for offset in self._offsets]

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
        offsets = self._offset_list
        cycle, rest = divmod(int(frame_id), offsets[-1])
        item = bisect.bisect_right(offsets, rest) - 1
        return self.stream_ref(frame_id, item, rest - offsets[item], -1, cycle)

    def stream_ref(self, frame_id: int, item: int, index: int, source_index: int, cycle: int = 0) -> FrameRef:
        """The :class:`FrameRef` of frame ``index`` of ``items[item]``; readers use it to name
        the live frames they read."""
        source = self.items[item]
        name = source.name
        kind = input_kind(source.kind)
        # A video's or stream's frame is named with its number counted from 1, as detect.py
        # numbers them (labels/clip_1.txt): one numbering in every output file.
        if kind.live:
            name = f"{source.name}:{index + 1:06d}"
        elif kind.video:
            source_index = index * self.vid_stride
            name = f"{source.name}:{source_index + 1:06d}"
        else:
            source_index = item if kind.numbered_by_item else 0
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
        live = [_live(item) for item in self.items]
        whole = [i for i, item in enumerate(self.items) if (live[i] or input_kind(item.kind).video)
                 and (frames[i] > 0 or (live[i] and self.open_ended))]
        whole.sort(key=lambda i: (not live[i], -frames[i], i))
        loads = [(0, 0)] * workers  # (live streams, frames)
        for i in whole:
            worker = min(range(workers), key=lambda w: (loads[w], w))
            owners[i] = worker
            streams, count = loads[worker]
            loads[worker] = (streams + live[i], count + int(frames[i]))
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
        return tuple(i for i, item in enumerate(self.items) if _live(item) and whole[i] == worker)

    def worker_ids(self, worker: int, workers: int) -> list[int]:
        """The ids ``worker`` of ``workers`` reads, in reading order; every planned id goes to
        exactly one worker. A reader restarted at position ``p`` resumes at ``ids[p]``.

        Its non-live ids ascending, then its live streams' ids (a finite plan's stream
        shares) alternating between its streams. For an open-ended plan only the finite ids:
        the live frames that follow get :meth:`open_stream_id`.
        """
        _check_worker(worker, workers)
        item_of_ids, owners, _ = self._owners(workers)
        live = np.array([_live(item) for item in self.items], dtype=bool)[item_of_ids]
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


def plan_lengths(items: list[SourceItem], frames: int | None) -> tuple[list[int], int | None]:
    """``(lengths, total)`` of a plan over ``items`` (see the module docstring)."""
    lengths = [0 if _live(item) else item.frames for item in items]
    finite = sum(lengths)
    live = [i for i, item in enumerate(items) if _live(item)]
    if not live:
        return lengths, finite if frames is None else frames
    if frames is None:
        return lengths, None
    share, extra = divmod(max(0, frames - finite), len(live))
    for turn, i in enumerate(live):
        lengths[i] = share + (turn < extra)
    return lengths, frames
