"""Small media files and local servers for the source tests: grey-level videos, an http
server that serves, cuts or stalls files, and an MJPEG live stream."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

VIDEO_SIZE = (64, 48)  # (w, h)
GREY_STEP = 20  # frame i of a test video is a flat grey of level GREY_STEP * i


def tiny_image(value: int, shape=(6, 8)) -> np.ndarray:
    return np.full((*shape, 3), value, dtype=np.uint8)


def write_video(path: Path, frames: int, fps: float = 10.0) -> Path:
    """A video whose frame i is a flat grey of level ``GREY_STEP * i`` (told apart after lossy
    coding); MJPG for .avi, mp4v otherwise. Skips the test when OpenCV cannot write it."""
    fourcc = cv2.VideoWriter_fourcc(*("MJPG" if path.suffix == ".avi" else "mp4v"))
    writer = cv2.VideoWriter(str(path), fourcc, fps, VIDEO_SIZE)
    if not writer.isOpened():
        pytest.skip(f"no OpenCV video writer for {path.suffix} on this machine")
    for i in range(frames):
        writer.write(np.full((VIDEO_SIZE[1], VIDEO_SIZE[0], 3), (GREY_STEP * i) % 256, dtype=np.uint8))
    writer.release()
    return path


def grey_level(image: np.ndarray) -> int:
    return int(round(float(image.mean()) / GREY_STEP))


class FakeLive:
    """A capture standing in for a camera: grab() succeeds ``frames`` times, then fails (after
    ``hold`` is set, if given: a camera that stalls); retrieve() gives a flat image of level
    ``grab count - 1``."""

    def __init__(self, frames: int, opens: bool = True, hold: threading.Event | None = None) -> None:
        self.frames, self.opens, self.hold = frames, opens, hold
        self.grabs = 0

    def isOpened(self) -> bool:
        return self.opens

    def grab(self) -> bool:
        if self.grabs >= self.frames:
            if self.hold is not None:
                self.hold.wait()
            return False
        self.grabs += 1
        return True

    def retrieve(self):
        return True, np.full((4, 4, 3), (self.grabs - 1) % 256, np.uint8)

    def get(self, prop: int) -> float:
        return {cv2.CAP_PROP_FPS: 30.0, cv2.CAP_PROP_FRAME_WIDTH: 4, cv2.CAP_PROP_FRAME_HEIGHT: 4}.get(prop, 0.0)

    def release(self) -> None:
        pass


def _jpeg(level: int) -> bytes:
    ok, encoded = cv2.imencode(".jpg", np.full((VIDEO_SIZE[1], VIDEO_SIZE[0], 3), level % 256, np.uint8))
    assert ok
    return encoded.tobytes()


class MediaServer:
    """An http server on 127.0.0.1 in a thread.

    ``/files/<name>`` serves ``files[name]`` whole (as ``python -m http.server`` does, ignoring
    Range requests), ``/ranged/<name>`` answers Range requests (206), ``/cut/<name>`` sends half and closes,
    ``/stall/<name>`` sends half and then nothing for ``stall_s``; ``/live.mjpg`` is an endless
    MJPEG stream at ``live_fps``, and ``/live-ends.mjpg`` sends ``short_frames`` frames to its
    first ``short_requests`` requests and 404 to the others (a camera that goes away).
    ``connections[path]`` counts the requests per path.
    """

    def __init__(self, files: dict[str, bytes] | None = None, live_fps: float = 100.0, stall_s: float = 5.0,
                 short_frames: int = 5, short_requests: int = 1) -> None:
        self.files = dict(files or {})
        self.live_fps, self.stall_s = live_fps, stall_s
        self.short_frames, self.short_requests = short_frames, short_requests
        self.connections: dict[str, int] = {}
        self._stopping = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.connections[self.path] = server.connections.get(self.path, 0) + 1
                try:
                    server.respond(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}{path}"

    def respond(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        mode, _, name = handler.path.strip("/").partition("/")
        if handler.path == "/live.mjpg":
            self._send_mjpeg(handler, None)
        elif handler.path == "/live-ends.mjpg" and self.connections[handler.path] <= self.short_requests:
            self._send_mjpeg(handler, self.short_frames)
        elif mode == "ranged" and name in self.files:
            self._send_range(handler, self.files[name])
        elif mode in ("files", "cut", "stall") and name in self.files:
            data = self.files[name]
            handler.send_response(200)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data if mode == "files" else data[:len(data) // 2])
            handler.wfile.flush()
            if mode == "stall":
                self._stopping.wait(self.stall_s)
        else:
            handler.send_error(404)

    @staticmethod
    def _send_range(handler: http.server.BaseHTTPRequestHandler, data: bytes) -> None:
        """``Range: bytes=a-b`` or ``bytes=a-`` answered with 206 and that part; none: the whole."""
        wanted = handler.headers.get("Range", "")
        first, last = 0, len(data) - 1
        if wanted.startswith("bytes="):
            start, _, end = wanted[len("bytes="):].partition("-")
            first, last = int(start or 0), min(int(end) if end else len(data) - 1, len(data) - 1)
        handler.send_response(206 if wanted else 200)
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Type", "video/mp4")
        handler.send_header("Content-Length", str(last - first + 1))
        if wanted:
            handler.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        handler.end_headers()
        handler.wfile.write(data[first:last + 1])

    def _send_mjpeg(self, handler: http.server.BaseHTTPRequestHandler, frames: int | None) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        handler.end_headers()
        i = 0
        while (frames is None or i < frames) and not self._stopping.is_set():
            jpeg = _jpeg(GREY_STEP * i)
            handler.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                                + jpeg + b"\r\n")
            handler.wfile.flush()
            i += 1
            time.sleep(1 / self.live_fps)
