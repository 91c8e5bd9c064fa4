"""A file another process appends lines to, read a little at a time: the collector's journal and
its detections list, on a cluster node, while the run goes on."""

from __future__ import annotations

import os
from typing import Callable


class GrowingFile:
    """The whole lines appended to a file since the last look. A file that shrank or was
    replaced (a restarted collector cuts its files back and goes on) is read again from the
    start, and :meth:`lines` says so."""

    def __init__(self, path: Callable[[], str | None]):
        self.path = path  # a callable: a list's partial file has its writer's pid in its name
        self.offset = 0
        self.partial = b""
        self.identity: tuple[str, int] | None = None

    def lines(self) -> tuple[list[bytes], bool]:
        """(new whole lines, whether the file was read again from its start)."""
        path = self.path()
        if path is None:
            return [], False
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                again = self.identity not in (None, (path, stat.st_ino)) or stat.st_size < self.offset
                if again:
                    self.offset, self.partial = 0, b""
                self.identity = (path, stat.st_ino)
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return [], False  # not made yet, or removed at the end
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return lines, again
