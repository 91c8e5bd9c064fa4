"""Video files, video URLs and live streams through OpenCV's ``VideoCapture``.

- :class:`VideoReader` reads a finite video (a file, or an http(s) URL with a known frame
  count) frame by frame, nothing dropped. A URL that stops sending or closes the connection is
  reopened at the frame it stopped at, up to ``reconnect_attempts`` times in a row without a
  new frame, then :class:`~inputs.frames.StreamError`.
- :class:`LiveStream` reads a camera, an rtsp/rtmp/... URL or an http stream of unknown length
  with a grabber thread that keeps only the newest frame, so a slow consumer never falls behind
  the live source; the frames it overwrites are counted (:class:`StreamStats`). It reconnects
  like :class:`VideoReader` and then raises :class:`~inputs.frames.StreamError` from
  :meth:`LiveStream.next`.

URLs open with FFmpeg and the open/read timeouts of :class:`StreamOptions`
(``CAP_PROP_OPEN_TIMEOUT_MSEC`` / ``CAP_PROP_READ_TIMEOUT_MSEC``, passed as open parameters);
cameras open by index with OpenCV's default backend, whose timeouts these options cannot set,
so :meth:`LiveStream.next` also gives up after :attr:`StreamOptions.give_up_s` without a frame.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import cv2
import numpy as np

from inputs.frames import FrameReadError, StreamError, VideoInfo

STREAM_OPEN_TIMEOUT_MS = 10_000
STREAM_READ_TIMEOUT_MS = 5_000
STREAM_RECONNECT_ATTEMPTS = 3
STREAM_RECONNECT_BACKOFF_S = 0.5  # the wait before the first reconnect; doubles after each
STREAM_RECONNECT_BACKOFF_MAX_S = 4.0
GIVE_UP_MARGIN_S = 2.0  # slack on top of the worst case of timeouts and backoffs
GRAB_FORWARD_MAX_FRAMES = 30  # a video skips forward this far by decoding; further, it seeks
URL_SCHEMES = frozenset({"http", "https", "rtsp", "rtsps", "rtmp", "rtmps", "rtp", "srt", "udp", "tcp", "mms"})
FILE_URL_SCHEMES = frozenset({"http", "https"})  # may serve a finite file; the others are live
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._=/-]+")


@dataclass(frozen=True)
class StreamOptions:
    """How long to wait for video URLs and live streams, and how often to reconnect.

    Attributes:
        open_timeout_ms (int): FFmpeg's limit for opening a URL.
        read_timeout_ms (int): FFmpeg's limit for one frame of a URL.
        reconnect_attempts (int): reconnects in a row without a new frame before giving up.
        reconnect_backoff_s (float): wait before the first reconnect; doubles after each.
        reconnect_backoff_max_s (float): the longest wait between reconnects.
        download_dir (str): where planning downloads a video URL whose server does not answer
            Range requests (see :mod:`inputs.downloads`); "" reads every URL as it streams.
    """

    open_timeout_ms: int = STREAM_OPEN_TIMEOUT_MS
    read_timeout_ms: int = STREAM_READ_TIMEOUT_MS
    reconnect_attempts: int = STREAM_RECONNECT_ATTEMPTS
    reconnect_backoff_s: float = STREAM_RECONNECT_BACKOFF_S
    reconnect_backoff_max_s: float = STREAM_RECONNECT_BACKOFF_MAX_S
    download_dir: str = ""

    def __post_init__(self) -> None:
        for name in ("open_timeout_ms", "read_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected an int > 0, got {value!r}")
        if isinstance(self.reconnect_attempts, bool) or not isinstance(self.reconnect_attempts, int) \
                or self.reconnect_attempts < 0:
            raise ValueError(f"reconnect_attempts: expected an int >= 0, got {self.reconnect_attempts!r}")
        if not 0 <= self.reconnect_backoff_s <= self.reconnect_backoff_max_s:
            raise ValueError(f"expected 0 <= reconnect_backoff_s <= reconnect_backoff_max_s, got "
                             f"{self.reconnect_backoff_s} and {self.reconnect_backoff_max_s}")

    def backoff_s(self, attempt: int) -> float:
        """The wait before reconnect number ``attempt`` (1-based)."""
        return min(self.reconnect_backoff_s * 2 ** (attempt - 1), self.reconnect_backoff_max_s)

    @property
    def give_up_s(self) -> float:
        """The longest a stream can go without a frame before its reconnects are exhausted,
        if every capture call keeps to its timeout, plus a margin."""
        per_try_s = (self.open_timeout_ms + self.read_timeout_ms) / 1000
        backoffs_s = sum(self.backoff_s(a) for a in range(1, self.reconnect_attempts + 1))
        return self.read_timeout_ms / 1000 + self.reconnect_attempts * per_try_s + backoffs_s + GIVE_UP_MARGIN_S

    def tried(self, url: bool = True) -> str:
        """What a reconnecting reader tries, for error messages; the timeouts apply to URLs."""
        timeouts = f"open timeout {self.open_timeout_ms} ms, read timeout {self.read_timeout_ms} ms, " if url else ""
        return f"{timeouts}{self.reconnect_attempts} reconnects with backoff from {self.reconnect_backoff_s:g} s"


def is_camera(location: str) -> bool:
    """``"0"``, ``"1"``, ...: a camera index for ``cv2.VideoCapture(int)``."""
    return location.isascii() and location.isdigit()


def is_url(location: str) -> bool:
    """A URL with a scheme of :data:`URL_SCHEMES`."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.lower() in URL_SCHEMES


def url_name(url: str) -> str:
    """A relative, file-system-safe name for ``url``, without scheme, credentials or ':'.

    ``rtsp://user:pw@cam.local:554/live/ch1?x=1`` -> ``cam.local_554/live/ch1_x=1``
    """
    parts = urlsplit(url)
    host = parts.hostname or "stream"
    name = host + (f"_{parts.port}" if parts.port else "") + parts.path.rstrip("/")
    if parts.query:
        name += f"_{parts.query}"
    return _UNSAFE_NAME_CHARS.sub("_", name).strip("/")


def stream_name(location: str) -> str:
    """How reports name a camera (``camera0``) or a URL (:func:`url_name`)."""
    return f"camera{int(location)}" if is_camera(location) else url_name(location)


def open_capture(location: str, options: StreamOptions) -> cv2.VideoCapture:
    """A capture of a camera index, a URL (FFmpeg, with the timeouts of ``options``) or a
    video file; check ``isOpened()``."""
    if is_camera(location):
        return cv2.VideoCapture(int(location))
    if is_url(location):
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, options.open_timeout_ms,
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, options.read_timeout_ms]
        return cv2.VideoCapture(location, cv2.CAP_FFMPEG, params)
    return cv2.VideoCapture(location)


def capture_info(capture: cv2.VideoCapture, vid_stride: int, live: bool) -> VideoInfo:
    """The :class:`VideoInfo` of an open capture; ``frames`` after ``vid_stride``, None if live
    or unknown (OpenCV reports an unknown count as 0 or negative)."""
    source_fps = float(capture.get(cv2.CAP_PROP_FPS))
    source_fps = source_fps if np.isfinite(source_fps) and source_fps > 0 else 0.0
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if not live else 0
    return VideoInfo(fps=source_fps / vid_stride, width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
                     height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                     frames=-(-count // vid_stride) if count > 0 else None,
                     source_fps=source_fps, vid_stride=vid_stride)


def probe_video(location: str, vid_stride: int, options: StreamOptions) -> VideoInfo | None:
    """Open a video file or URL once for its :class:`VideoInfo`; None if it does not open.
    ``frames`` is None when the capture does not know its frame count (a live http stream)."""
    capture = open_capture(location, options)
    try:
        return capture_info(capture, vid_stride, live=False) if capture.isOpened() else None
    finally:
        capture.release()


class VideoReader:
    """Frame by frame reading of one finite video file or video URL; close when done.

    Frames are asked for by source frame number; the next frame, or one a little ahead
    (:data:`GRAB_FORWARD_MAX_FRAMES`, e.g. with ``vid_stride``), is reached by decoding forward,
    any other by seeking. Past the end of a file, or of a URL's known frame count, a read raises
    :class:`FrameReadError`. A URL that fails before its end is reopened at the missing frame
    (see :class:`StreamOptions`), then :class:`StreamError`.
    """

    def __init__(self, location: str, name: str, vid_stride: int, options: StreamOptions, item: int = -1,
                 opener: Callable[[str, StreamOptions], cv2.VideoCapture] = open_capture) -> None:
        self.location, self.name, self.options, self.item = location, name, options, item
        self._url = is_url(location)
        self._opener = opener
        self._capture = opener(location, options)
        if not self._capture.isOpened():
            self._capture.release()
            if not self._url:
                raise FrameReadError(f"cannot open video: {name}")
            self._capture = self._reopen_url("never opened")
        self.info = capture_info(self._capture, vid_stride, live=False)
        self.source_frames = int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT))
        self._next: int | None = 0  # the source frame number a plain read() returns; None: unknown

    def read(self, source_index: int) -> np.ndarray:
        """Source frame ``source_index`` (before ``vid_stride``), BGR uint8 ``[H, W, 3]``."""
        image = self._try_read(source_index)
        if image is not None:
            return image
        if not self._url or source_index >= self.source_frames:
            self._next = None
            raise FrameReadError(f"video ended at frame {source_index} of {self.source_frames}: {self.name}")
        return self._reconnect(source_index)

    def close(self) -> None:
        self._capture.release()

    def _try_read(self, source_index: int) -> np.ndarray | None:
        ahead = source_index - self._next if self._next is not None else -1
        if 0 < ahead <= GRAB_FORWARD_MAX_FRAMES:
            for _ in range(ahead):
                if not self._capture.grab():
                    self._next = None
                    return None
        elif ahead != 0:
            self._capture.set(cv2.CAP_PROP_POS_FRAMES, source_index)
        ok, image = self._capture.read()
        if not ok or image is None:
            self._next = None
            return None
        self._next = source_index + 1
        return image

    def _reopen_url(self, what: str) -> cv2.VideoCapture:
        for attempt in range(1, self.options.reconnect_attempts + 1):
            time.sleep(self.options.backoff_s(attempt))
            capture = self._opener(self.location, self.options)
            if capture.isOpened():
                return capture
            capture.release()
        raise StreamError(self.name, f"{what}; gave up after {self.options.reconnect_attempts} reconnects "
                          f"({self.options.tried()})", self.options.reconnect_attempts + 1, self.item)

    def _reconnect(self, source_index: int) -> np.ndarray:
        for attempt in range(1, self.options.reconnect_attempts + 1):
            self._capture.release()
            time.sleep(self.options.backoff_s(attempt))
            self._capture = self._opener(self.location, self.options)
            if self._capture.isOpened():
                self._next = 0
                image = self._try_read(source_index)
                if image is not None:
                    return image
        raise StreamError(self.name, f"no frame {source_index} of {self.source_frames}; gave up after "
                          f"{self.options.reconnect_attempts} reconnects ({self.options.tried()})",
                          self.options.reconnect_attempts + 1, self.item)


@dataclass(frozen=True)
class StreamStats:
    """What happened to the frames of one live stream, so none is lost from the accounting.

    ``grabbed - kept`` frames were skipped by ``vid_stride``; every kept frame is delivered,
    dropped (overwritten by a newer one before the consumer asked) or pending:
    ``kept == delivered + dropped + pending``.
    """

    name: str
    item: int
    grabbed: int
    kept: int
    delivered: int
    dropped: int
    pending: int
    reconnects: int
    error: str


class LiveStream:
    """A live stream read by a grabber thread that keeps only the newest frame; close when done.

    The thread opens the stream, grabs every frame, decodes every ``vid_stride``-th and keeps
    it, overwriting (and counting as dropped) a kept frame the consumer has not taken yet. When
    the stream fails it is reopened after a backoff; after ``reconnect_attempts`` reopens in a
    row without a frame, or a camera that never opens, the stream is done and :meth:`next`
    raises :class:`StreamError` (frames kept before that are still delivered first).
    """

    def __init__(self, location: str, name: str, vid_stride: int, options: StreamOptions, item: int = -1,
                 opener: Callable[[str, StreamOptions], cv2.VideoCapture] = open_capture) -> None:
        self.location, self.name, self.item = location, name, item
        self._stride, self._options, self._opener = vid_stride, options, opener
        self._lock = threading.Condition()
        self._newest: tuple[int, np.ndarray] | None = None
        self._info: VideoInfo | None = None
        self._error: StreamError | None = None
        self._stop = threading.Event()
        self._grabbed = self._kept = self._delivered = self._dropped = self._reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"grab {name}", daemon=True)
        self._thread.start()

    def next(self) -> tuple[int, np.ndarray, VideoInfo]:
        """The newest frame not delivered yet as ``(source_index, image, info)``, waiting for
        one if needed; raises :class:`StreamError` once the stream is given up."""
        deadline = time.monotonic() + self._options.give_up_s
        with self._lock:
            while self._newest is None and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._error = StreamError(self.name, f"no frame for {self._options.give_up_s:.1f} s although "
                                              f"every capture call should have timed out by then "
                                              f"({self._options.tried(not is_camera(self.location))})", self._reconnects + 1, self.item)
                    self._stop.set()
                    break
                self._lock.wait(remaining)
            if self._newest is None:
                raise self._error
            (source_index, image), self._newest = self._newest, None
            self._delivered += 1
            return source_index, image, self._info

    def stats(self) -> StreamStats:
        with self._lock:
            return StreamStats(self.name, self.item, self._grabbed, self._kept, self._delivered, self._dropped,
                               int(self._newest is not None), self._reconnects,
                               str(self._error) if self._error else "")

    def stop(self) -> None:
        """Ask the grabber to stop, without waiting (see :meth:`close`)."""
        self._stop.set()

    def close(self) -> None:
        """Stop the grabber and wait for it; it releases the capture when its current call
        returns (for a URL, within the read or open timeout)."""
        self._stop.set()
        self._thread.join(max(self._options.read_timeout_ms, self._options.open_timeout_ms) / 1000 + GIVE_UP_MARGIN_S)

    def _run(self) -> None:
        try:
            self._grab_with_reconnects()
        except Exception as error:  # a capture that raises (cv2.error): the consumer must hear of it
            self._give_up(f"the grabber failed: {error!r}", self._reconnects + 1)

    def _grab_with_reconnects(self) -> None:
        reconnects_in_row = 0  # reconnects since the last kept frame
        ever_opened = False
        while not self._stop.is_set():
            capture = self._opener(self.location, self._options)
            opened = capture.isOpened()
            ever_opened |= opened
            got_frame = opened and self._grab_until_failure(capture)
            capture.release()
            if got_frame:
                reconnects_in_row = 0
            if self._stop.is_set():
                return
            if reconnects_in_row >= self._options.reconnect_attempts:
                what = "stopped sending frames" if ever_opened else "never opened"
                self._give_up(f"{what}; gave up after {reconnects_in_row} reconnects without a frame "
                              f"({self._options.tried(not is_camera(self.location))})", reconnects_in_row + 1)
                return
            reconnects_in_row += 1
            with self._lock:
                self._reconnects += 1
            self._stop.wait(self._options.backoff_s(reconnects_in_row))

    def _grab_until_failure(self, capture: cv2.VideoCapture) -> bool:
        """Grab until the capture fails or the stream is closed; True if a frame was kept."""
        kept_any = False
        info = capture_info(capture, self._stride, live=True)
        while not self._stop.is_set():
            if not capture.grab():
                return kept_any
            with self._lock:
                source_index = self._grabbed
                self._grabbed += 1
            if source_index % self._stride:
                continue
            ok, image = capture.retrieve()
            if not ok or image is None:
                return kept_any
            kept_any = True
            with self._lock:
                self._dropped += self._newest is not None
                self._newest, self._info = (source_index, image), info
                self._kept += 1
                self._lock.notify_all()
        return kept_any

    def _give_up(self, reason: str, attempts: int) -> None:
        with self._lock:
            self._error = StreamError(self.name, reason, attempts, self.item)
            self._lock.notify_all()
