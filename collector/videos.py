"""Annotated videos, written by the collector in frame order with OpenCV's VideoWriter.

Frames of one video come from one preprocess worker in order but reach the collector in any
order (several inference and postprocess workers), so each video keeps a small reorder buffer:
a frame waits (its pixels still in the preprocess worker's shared-memory slot) until the frames
before it are written or known to have failed. One file per video and pass over the source:
``videos/<name>.mp4`` (``_passK`` when the source loops), at the source's frame rate divided by
the frames kept (``--vid-stride``, ``--save-images N``). With the run's outputs in a store
(``store``: its root URL), OpenCV still writes a local file in the run's own folder; once closed it
is copied to ``<root>/videos/<name>`` and removed (a failed copy is a failed write of that video).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np

from workers.store import Store, store_errors, why
from yolo.draw import DrawOptions, draw_detections

FOURCC = "mp4v"  # in every OpenCV build, FFmpeg or not
DEFAULT_FPS = 30.0  # when a capture does not know its rate

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    detections: list  # [x1, y1, x2, y2, score, cls] in the decoded image's pixels
    pixels: Callable[[], np.ndarray]  # the original, read from its slot when written
    release: Callable[[], None]  # gives the slot back


@dataclass
class _Video:
    path: str
    fps: float
    step: int  # index distance between kept frames
    next_index: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    writer: cv2.VideoWriter | None = None
    size: tuple[int, int] | None = None  # (w, h) of the first frame written
    written: int = 0
    missing: int = 0


class AnnotatedVideos:
    def __init__(self, run_dir: str, names: list[str], keep_every: int, draw: DrawOptions | None = None,
                 store: str = ""):
        self.folder = os.path.join(run_dir, "videos")
        self.store = Store(store) if store else None
        self.names = names
        self.draw = draw or DrawOptions()
        self.keep_every = max(1, keep_every)
        self.videos: dict[tuple[int, int], _Video] = {}
        self.error: str | None = None

    def add(self, name: str, cycle: int, video: dict, detections: list, pixels: Callable[[], np.ndarray],
            release: Callable[[], None]) -> None:
        """A kept frame of a video: write it when the frames before it are done."""
        entry = self._video(name, cycle, video)
        index = int(video["index"])
        if index < entry.next_index or index in entry.pending:
            release()  # a duplicate of a frame already written (sent again after a worker died)
            return
        entry.pending[index] = _Pending(detections, pixels, release)
        self._flush(entry)

    def skip(self, name: str, cycle: int, video: dict) -> None:
        """A frame of a video failed: do not wait for it."""
        key = (int(video["item"]), cycle)
        entry = self.videos.get(key)
        if entry is None:
            entry = self._video(name, cycle, video)
        entry.skipped.add(int(video["index"]))
        self._flush(entry)

    def finish(self) -> list[dict]:
        """Write what is still waiting, in order despite gaps; close every file; what was written."""
        for entry in self.videos.values():
            for index in sorted(entry.pending):
                entry.missing += (index - entry.next_index) // entry.step
                entry.next_index = index
                self._write_next(entry)
            if entry.writer is not None:
                entry.writer.release()
                self._copy_to_store(entry)
        return [{"video": os.path.relpath(e.path, os.path.dirname(self.folder)), "frames": e.written,
                 "missing": e.missing, "fps": e.fps} for e in self.videos.values()]

    def _copy_to_store(self, entry: _Video) -> None:
        """A closed video's local file to the store, then removed whatever happened."""
        if self.store is None or not os.path.exists(entry.path):
            return
        relative = os.path.relpath(entry.path, os.path.dirname(self.folder)).replace(os.sep, "/")
        try:
            self.store.put(entry.path, relative)
        except store_errors() as exc:
            reason = f"{why(exc)} copying {relative} to {self.store.where(relative)}"
            self.error = self.error or reason
            log.error("%s", reason)
        finally:
            os.remove(entry.path)

    def _video(self, name: str, cycle: int, video: dict) -> _Video:
        key = (int(video["item"]), cycle)
        if key not in self.videos:
            stem = name.rpartition(":")[0] or name
            suffix = f"_pass{cycle}" if cycle else ""
            path = os.path.join(self.folder, f"{os.path.splitext(stem)[0]}{suffix}.mp4")
            fps = (float(video.get("fps") or 0.0) or DEFAULT_FPS) / self.keep_every
            self.videos[key] = _Video(path, fps, self.keep_every)
        return self.videos[key]

    def _flush(self, entry: _Video) -> None:
        while True:
            if entry.next_index in entry.skipped:
                entry.skipped.discard(entry.next_index)
                entry.missing += 1
                entry.next_index += entry.step
            elif entry.next_index in entry.pending:
                self._write_next(entry)
            else:
                return

    def _write_next(self, entry: _Video) -> None:
        pending = entry.pending.pop(entry.next_index)
        entry.next_index += entry.step
        try:
            if self.error is None:
                self._write(entry, pending)
        finally:
            pending.release()

    def _write(self, entry: _Video, pending: _Pending) -> None:
        image = np.array(pending.pixels())  # a copy: drawing must not touch the lender's slot
        draw_detections(image, np.asarray(pending.detections, dtype=np.float64).reshape(-1, 6), self.names,
                        inplace=True, **dataclasses.asdict(self.draw))
        if entry.writer is None:
            os.makedirs(os.path.dirname(entry.path), exist_ok=True)
            entry.size = (image.shape[1], image.shape[0])
            entry.writer = cv2.VideoWriter(entry.path, cv2.VideoWriter_fourcc(*FOURCC), entry.fps, entry.size)
            if not entry.writer.isOpened():
                self.error = f"cannot open a video writer for {entry.path}"
                log.error("%s", self.error)
                return
        if (image.shape[1], image.shape[0]) != entry.size:  # a stream that changed resolution
            image = cv2.resize(image, entry.size, interpolation=cv2.INTER_AREA)
        entry.writer.write(image)
        entry.written += 1
