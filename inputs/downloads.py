"""Video URLs from servers that do not answer Range requests (``python -m http.server``).

FFmpeg seeks inside an MP4 (its index is often at the end of the file), and over http a seek
is a Range request; a server that ignores it sends the file from the start again and every
read fails. Such a video is therefore downloaded whole into a private temporary folder first,
as Ultralytics' detect.py downloads a video URL, and read from there. A server that answers
Range requests (206) is read as it streams, and so is anything without a length (a live
MJPEG stream). Downloads happen only where a caller passes a folder (``StreamOptions.download_dir``);
the folder's owner removes it (:class:`DownloadFolder`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

CHUNK_BYTES = 1 << 20
FREE_SPACE_MARGIN_BYTES = 256 << 20  # left free on the temporary folder's disk after a download

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangeProbe:
    """What a ``Range: bytes=0-0`` request told of a URL."""

    ranges: bool  # 206 Partial Content: the server can seek
    length: int | None  # Content-Length of a whole-file answer
    content_type: str

    @property
    def must_download(self) -> bool:
        """A finite file (its length known, not a multipart stream) that cannot be read by seeking."""
        return not self.ranges and self.length is not None and not self.content_type.startswith("multipart/")


def probe_ranges(url: str, timeout_s: float) -> RangeProbe | None:
    """Ask for the first byte of ``url``; None when the request fails (FFmpeg then tries the URL
    itself and says what is wrong)."""
    import http.client  # here, not at the top: every run imports this module, few fetch anything
    import urllib.request
    request = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            return RangeProbe(response.status == 206, int(length) if length and length.isdigit() else None,
                              response.headers.get("Content-Type", "").lower())
    except (OSError, ValueError, http.client.HTTPException):
        return None


def download(url: str, folder: str, length: int, timeout_s: float) -> str:
    """``url`` saved whole in ``folder`` (made 0700 if needed) under a name from the URL; a URL
    downloaded before into the same folder is not fetched again. Raises OSError naming what
    failed: a short or broken transfer, or too little free space for ``length`` bytes."""
    import http.client
    import urllib.request
    from urllib.parse import urlsplit
    os.makedirs(folder, mode=0o700, exist_ok=True)
    suffix = os.path.splitext(urlsplit(url).path)[1][:8]
    path = os.path.join(folder, hashlib.sha256(url.encode()).hexdigest()[:16] + suffix)
    if os.path.isfile(path):
        return path
    free = shutil.disk_usage(folder).free
    if length + FREE_SPACE_MARGIN_BYTES > free:
        raise OSError(f"{length / 1e6:.0f} MB does not fit in {folder} ({free / 1e6:.0f} MB free; set TMPDIR "
                      "to a larger disk)")
    log.info("%s: the server does not answer Range requests, which reading a video as it streams needs; "
             "downloading it (%.1f MB) to a temporary file first", url, length / 1e6)
    started = time.perf_counter()
    partial = path + ".part"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(partial, "wb") as f:
            shutil.copyfileobj(response, f, CHUNK_BYTES)
        if os.path.getsize(partial) != length:
            raise OSError(f"received {os.path.getsize(partial)} of {length} bytes")
        os.replace(partial, path)
    except (OSError, http.client.HTTPException) as exc:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise OSError(f"download failed: {exc}") from None
    log.info("%s: downloaded in %.1f s", url, time.perf_counter() - started)
    return path


class DownloadFolder:
    """A temporary folder's path for downloads, made only when something is downloaded and
    removed on exit: ``with DownloadFolder() as folder: plan_frames(..., StreamOptions(download_dir=folder))``."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"yolo-pipeline-downloads-{os.getpid()}")

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
