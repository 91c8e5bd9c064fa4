"""Reading the frames of a plan inside one process.

- :class:`ShareReader` reads one worker's share of a :class:`inputs.plans.FramePlan`, one
  frame per :meth:`ShareReader.next` call, so a worker reads only when the pipeline has room.
- :class:`FrameReader` reads a finite frame (image, video, synthetic, broken, a plugin's) by
  its :class:`~inputs.frames.FrameRef`, in any order, through its input kind
  (:mod:`inputs.kinds`); :class:`ShareReader` uses one, and opens live items through their kind.
- :func:`open_share` is the reader a worker uses: a :class:`ShareReader`, or the reader of a
  source kind that reads its shares itself (a feed).

Contract of :meth:`ShareReader.next`, with ``position`` the number of the worker's ids consumed:

- returns a :class:`~inputs.frames.Frame` and consumes its id;
- raises :class:`~inputs.frames.FrameReadError` (``.ref`` names the frame) and consumes its id:
  report it as failed;
- raises :class:`~inputs.frames.StreamError` and consumes no id: that video URL or live stream is
  given up; call ``next`` again to go on with the other items. A finite plan's remaining ids of
  that stream then come out as :class:`FrameReadError` without waiting, so every planned id is
  still consumed exactly once, in :meth:`inputs.plans.FramePlan.worker_ids` order;
- returns None when the share is done: every planned id consumed and, in an open-ended plan,
  every live stream given up.

``ShareReader(plan, worker, workers, start=p)`` resumes a share after ``p`` consumed ids: the
same ids and refs follow for finite items; live streams are simply reopened.
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType
from typing import Any, Callable

import cv2
import numpy as np

from inputs.frames import Frame, FrameReadError, FrameRef, StreamError, VideoInfo
from inputs.imageio import DecodeOptions
from inputs.kinds import input_kind, input_kinds, source_kind
from inputs.plans import FramePlan
from inputs.streams import StreamOptions, StreamStats, open_capture

Opener = Callable[[str, StreamOptions], cv2.VideoCapture]


class FrameReader:
    """Reads finite frames by :class:`FrameRef`, in any order, each by its input kind's ``read``
    (:mod:`inputs.kinds`); use as a context manager.

    What a kind keeps open between reads (``held``: one video, so reading its frames in order
    decodes sequentially) is closed by :meth:`close`. A video URL given up (:class:`StreamError`)
    stays given up (``given_up``): its other frames raise :class:`FrameReadError` at once.
    """

    def __init__(self, seed: int = 0, decode: DecodeOptions | None = None, streams: StreamOptions | None = None,
                 vid_stride: int = 1, opener: Opener = open_capture, encoded: bool = False) -> None:
        self.seed = seed
        self.encoded = encoded  # files of kinds that can are read undecoded (Frame.encoded)
        self.decode = decode or DecodeOptions()
        self.streams = streams or StreamOptions()
        self.vid_stride = vid_stride
        self.opener = opener
        self.held: dict[str, Any] = {}  # what a kind keeps open between reads, each with a close()
        self.given_up: dict[str, str] = {}  # location -> reason

    def __enter__(self) -> FrameReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def read(self, ref: FrameRef) -> np.ndarray:
        """The pixels of ``ref``, BGR uint8 ``[h, w, 3]`` (see :meth:`read_frame`)."""
        return self.read_frame(ref).image

    def read_frame(self, ref: FrameRef) -> Frame:
        """The :class:`Frame` of a finite ``ref``; raises :class:`FrameReadError` (with
        ``.ref`` set) or, for a video URL, :class:`StreamError`."""
        kind = input_kind(ref.kind)
        if kind.read is None:
            finite = ", ".join(k.name for k in input_kinds() if k.read is not None)
            raise ValueError(f"expected a frame of a finite kind ({finite}), got {ref.kind!r} for {ref.name}: "
                             "live frames are read by their share's reader")
        try:
            if self.encoded and kind.read_encoded is not None:
                return kind.read_encoded(ref, self)
            return kind.read(ref, self)
        except FrameReadError as error:
            error.ref = ref
            raise

    def close(self) -> None:
        """Release what is held open (a video); the reader may still be used afterwards."""
        for held in self.held.values():
            held.close()
        self.held.clear()


def open_share(plan: FramePlan, worker: int = 0, workers: int = 1, start: int = 0, *,
               decode: DecodeOptions | None = None, streams: StreamOptions | None = None, seed: int = 0,
               encoded: bool = False):
    """The reader of one worker's share: the ``share_reader`` of the kind that recognised the
    plan's source (a feed's :class:`inputs.feed.FeedReader`), else a :class:`ShareReader`.
    ``encoded``: image files come undecoded (``Frame.encoded``), for a decoder on the device."""
    kind = source_kind(plan.source)
    if kind is not None and kind.share_reader is not None:
        frames = FrameReader(seed, decode, streams, plan.vid_stride, encoded=encoded)
        return kind.share_reader(plan, worker, workers, start, frames=frames)
    return ShareReader(plan, worker, workers, start, decode=decode, streams=streams, seed=seed, encoded=encoded)


class ShareReader:
    """One worker's share of a plan, one frame per :meth:`next` (see the module docstring).

    Args:
        plan (FramePlan): the run's plan.
        worker (int): this worker's index, ``0 <= worker < workers``.
        workers (int): how many readers share the plan.
        start (int): ids of this share already consumed (a restarted worker resumes there).
        decode (DecodeOptions | None): image decoding (mode, target size, pixel limit).
        streams (StreamOptions | None): timeouts and reconnects of URLs and live streams.
        seed (int): the seed of synthetic scenes.
        opener (Callable): opens a capture; tests pass fakes.
        encoded (bool): frames of kinds that can (image files, stored images) come undecoded:
            ``Frame.encoded`` holds the file's bytes (see :class:`inputs.kinds.InputKind`).
    """

    def __init__(self, plan: FramePlan, worker: int = 0, workers: int = 1, start: int = 0, *,
                 decode: DecodeOptions | None = None, streams: StreamOptions | None = None, seed: int = 0,
                 opener: Opener = open_capture, encoded: bool = False) -> None:
        self._plan, self._worker, self._workers = plan, worker, workers
        self._ids = plan.worker_ids(worker, workers)
        self._rotation = list(plan.worker_streams(worker, workers)) if plan.open_ended else []
        limit = len(self._ids) if not plan.open_ended else None
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or (limit is not None and start > limit):
            raise ValueError(f"expected start to be an int in [0, {limit if limit is not None else 'inf'}], "
                             f"got {start!r}")
        self._position = start
        self._frames = FrameReader(seed, decode, streams, plan.vid_stride, opener, encoded)
        self._live: dict[int, Any] = {}  # item -> its open live stream (see InputKind.open_live)
        self._finished: list[StreamStats] = []
        self._given_up: dict[int, str] = {}
        resumed = max(0, start - len(self._ids))  # live frames read before a restart
        count = len(self._rotation)
        self._turn = resumed % count if count else 0
        self._live_index = {item: resumed // count + (turn < resumed % count) for turn, item in enumerate(self._rotation)}

    def __enter__(self) -> ShareReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    @property
    def position(self) -> int:
        """How many ids of this share are consumed, counting ``start``."""
        return self._position

    @property
    def planned(self) -> int:
        """How many ids this share plans (an open-ended share's live frames come on top)."""
        return len(self._ids)

    def next(self) -> Frame | None:
        """The next frame of the share; see the module docstring for what it raises."""
        if self._position < len(self._ids):
            ref = self._plan.ref(self._ids[self._position])
            try:
                live = input_kind(ref.kind).live
                frame = self._read_planned_live(ref) if live else self._frames.read_frame(ref)
            except FrameReadError:
                self._position += 1
                raise
            self._position += 1
            return frame
        if self._rotation:
            return self._read_open_live()
        return None

    def skip(self) -> FrameRef | None:
        """Consume the next planned id without reading it (a frame that killed its reader); its
        ref, or None when no planned id is left."""
        if self._position >= len(self._ids):
            return None
        ref = self._plan.ref(self._ids[self._position])
        self._position += 1
        return ref

    def stream_stats(self) -> list[StreamStats]:
        """What happened to the frames of every live stream opened so far."""
        return self._finished + [stream.stats() for stream in self._live.values()]

    def close(self) -> None:
        """Stop every live stream and release the open video."""
        for stream in self._live.values():
            stream.stop()  # all at once: each may take up to a timeout to notice
        for item in list(self._live):
            self._close_stream(item)
        self._frames.close()

    def _stream(self, item: int):
        if item not in self._live:
            source = self._plan.items[item]
            kind = input_kind(source.kind)
            if kind.open_live is None:
                raise ValueError(f"expected a live kind that opens its items, got {kind.name!r} for {source.name} "
                                 "(read by its source's own reader: open_share)")
            self._live[item] = kind.open_live(source, item, self._frames)
        return self._live[item]

    def _close_stream(self, item: int) -> None:
        stream = self._live.pop(item)
        stream.close()
        self._finished.append(stream.stats())

    def _take(self, item: int) -> tuple[int, np.ndarray, VideoInfo]:
        try:
            return self._stream(item).next()
        except StreamError as error:
            self._given_up[item] = error.reason
            self._close_stream(item)
            raise

    def _read_planned_live(self, ref: FrameRef) -> Frame:
        if ref.item in self._given_up:
            raise FrameReadError(f"stream {self._plan.items[ref.item].name} was given up: {self._given_up[ref.item]}",
                                 ref)
        source_index, image, info = self._take(ref.item)
        if ref.index == self._plan.lengths[ref.item] - 1:
            self._close_stream(ref.item)  # its share is read: free the camera
        return Frame(replace(ref, source_index=source_index), image, (image.shape[0], image.shape[1]), 1, info)

    def _read_open_live(self) -> Frame:
        item = self._rotation[self._turn % len(self._rotation)]
        try:
            source_index, image, info = self._take(item)
        except StreamError:
            self._rotation.remove(item)
            raise
        self._turn += 1
        frame_id = self._plan.open_stream_id(self._worker, self._workers, self._position - len(self._ids))
        ref = self._plan.stream_ref(frame_id, item, self._live_index[item], source_index)
        self._live_index[item] += 1
        self._position += 1
        return Frame(ref, image, (image.shape[0], image.shape[1]), 1, info)
