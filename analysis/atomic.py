"""Files written whole or not at all: the bytes go to a temporary file in the same folder, are
flushed to disk, and only then renamed over the target (``os.replace``, atomic on POSIX). A full
disk or any other error leaves the target as it was (absent, or its previous content) and no
temporary file behind."""

from __future__ import annotations

import json
import os
import re
import secrets

NEW_FILE_MODE = 0o666  # less the umask, as open() would give


def write_bytes_atomic(path: str, data: bytes) -> None:
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # tmpfs and ext4 may accept the write and fail on flush
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


class JsonListFile:
    """A JSON list written one record at a time, so a long run never holds its records in
    memory; like :func:`write_bytes_atomic`, the target appears only once :meth:`finish` has
    written it whole. A record that is not plain JSON is skipped and counted, a write error
    (disk full) stops the file and is kept in ``error``."""

    def __init__(self, path: str, encode, resume: tuple[str, int, int] | None = None):
        """``resume``: (a dead writer's partial file, its records to keep, the bytes they end at):
        that file is cut there and appended to (a restarted collector goes on with its files)."""
        self.path, self.encode = path, encode
        self.records = self.skipped = 0
        self.error: str | None = None
        folder, name = os.path.split(os.path.abspath(path))
        self._temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
        self._file = None
        if resume is not None:
            self._temporary, self.records = resume[0], resume[1]
            self._guard(lambda: self._reopen(resume[2]))
        else:
            self._guard(self._open)

    def _open(self) -> None:
        self._file = open(self._temporary, "x", encoding="utf-8")
        self._file.write("[")

    def _reopen(self, end: int) -> None:
        os.truncate(self._temporary, end)  # a record cut by the writer's death, or one nobody vouches for
        self._file = open(self._temporary, "a", encoding="utf-8")

    def extend(self, records) -> int:
        """Append ``records``; returns how many were written (those not plain JSON are skipped)."""
        if self._file is None:
            return 0
        lines = []
        for record in records:
            try:
                lines.append(self.encode(record))
            except (ValueError, TypeError):
                self.skipped += 1
        if lines:
            separator = "," if self.records else ""
            self.records += len(lines)
            self._guard(lambda: self._write_now(separator + "\n" + ",\n".join(lines)))
        return len(lines)

    def extend_text(self, pieces: list[tuple[str, int]]) -> list[int]:
        """Append records already written as JSON text: ``(lines of a JSON list, how many)`` per
        frame, all in one write; returns, per piece, how many records went in (0 once stopped)."""
        if self._file is None:
            return [0] * len(pieces)
        text = ",\n".join(lines for lines, count in pieces if count)
        written = sum(count for _, count in pieces)
        if written:
            separator = "," if self.records else ""
            self.records += written
            self._guard(lambda: self._write_now(separator + "\n" + text))
        return [count if self._file is not None else 0 for _, count in pieces]

    def _write_now(self, text: str) -> None:
        """Written through to the OS (no fsync): a writer killed mid-run leaves every whole record in
        the partial file for the runner to make valid (supervisor.salvage)."""
        self._file.write(text)
        self._file.flush()

    def finish(self) -> bool:
        """Close and rename into place; False (and ``error`` set) when the file could not be written."""
        if self._file is None:
            return False

        def close_and_rename():
            self._file.write("\n]\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._temporary, self.path)
        self._guard(close_and_rename)
        self._file = None
        return self.error is None

    def abandon(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # the buffered tail could not be flushed: the file is removed anyway
        _remove(self._temporary)

    def _guard(self, write) -> None:
        try:
            write()
        except OSError as exc:
            self.error = f"{exc.strerror or exc} ({exc.__class__.__name__})"
            self.abandon()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# A JsonListFile's partial file, which a dead writer leaves (supervisor.salvage, collector.journal).
PARTIAL_LIST = re.compile(r"^\.(detections\.json|predictions\.json)\.\d+\.[0-9a-f]+\.partial$")


def whole_records(text: str) -> list:
    """The records of a JSON list file cut short: every line that parses, up to the first that does not."""
    return [record for record, _ in whole_records_with_ends(text.encode("utf-8", "surrogateescape"))]


def whole_records_with_ends(data: bytes) -> list[tuple[object, int]]:
    """Each whole record of a JSON list file cut short, with the byte offset just past it (its
    comma left out): where a writer that goes on appending cuts the file (collector.journal)."""
    found = []
    lines = data.split(b"\n")
    start = len(lines[0]) + 1  # the first line is "["
    for line in lines[1:]:
        body = line.strip().removesuffix(b",")
        if body == b"]":
            break
        try:
            found.append((json.loads(body), start + len(line.rstrip().removesuffix(b","))))
        except ValueError:  # the record being written when the writer died
            break
        start += len(line) + 1
    return found
