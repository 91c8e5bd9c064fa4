"""The collector's journal, so that a collector that died can be restarted and go on.

The collector writes detections.json and predictions.json through, record by record, into
partial files (analysis.atomic.JsonListFile). After a frame's records, it appends one line to
the journal: the frame's ledger row and how many records it wrote to each list; a failed frame
and a worker's summary get a line too. A restarted collector reads the journal back up to its
last whole line, keeps the frames whose records the partial files hold whole, cuts those files
(and the journal) just after them, and goes on appending: a frame is in the ledger and in the
lists once, or in neither (then it counts as unseen, and a copy sent again is taken).

What the collector held only in memory is rebuilt otherwise: the runner gives the restarted one
the peer-gone notices it missed and the workers that already exited (:class:`Resume`), and each
postprocess worker sends its last results again (workers.postprocess.SentResults).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass

from supervisor.salvage import PARTIAL_LIST, whole_records_with_ends

JOURNAL_NAME = ".collector-journal.partial"  # in the run folder, next to the lists it vouches for
LISTS = ("detections.json", "predictions.json")
LEDGER_KEYS = ("id", "name", "t", "batch", "image_saved", "cold", "workers")  # what workers.ledger keeps a frame by
FAILURE_KEYS = ("id", "name", "stage", "worker", "reason")


@dataclass(frozen=True)
class Resume:
    """What the runner tells a restarted collector: the peer-gone notices of the run so far (the
    collector's own death among them, for the report's restarts) and the workers that already
    exited, whose summaries it waits for only if its predecessor had them."""

    notices: tuple[dict, ...] = ()
    exited: tuple[str, ...] = ()


@dataclass
class Reloaded:
    """What a predecessor wrote durably: the journal's entries the lists vouch for, the bytes
    they fill, and per list the partial file to go on with (path, records kept, their end)."""

    entries: list[dict]
    journal_end: int
    lists: dict[str, tuple[str, int, int] | None]


class Journal:
    """The writer's side: one line per entry, written through to the OS (a kill loses at most
    the line being written, which the reader leaves out). A write error stops the journal, with
    one line in the log: the run goes on, a restart then resumes from what was journaled."""

    def __init__(self, run_dir: str, log: logging.Logger, resume_end: int | None = None):
        from analysis.report import json_text  # what the lists are written with: the same plain JSON
        self.path = os.path.join(run_dir, JOURNAL_NAME)
        self.log, self._encode = log, json_text
        self._file = None
        try:
            if resume_end is not None:
                os.truncate(self.path, resume_end)
            self._file = open(self.path, "a" if resume_end is not None else "w", encoding="ascii")
        except OSError as exc:
            self._stop(exc)

    def frame(self, result: dict, lists: tuple[int, int]) -> None:
        row = {k: result.get(k) for k in LEDGER_KEYS}
        self._write({"frame": {**row, "detections": len(result["detections"])}, "lists": list(lists)})

    def failed(self, failure: dict) -> None:
        self._write({"failed": {k: failure[k] for k in FAILURE_KEYS}})

    def stats(self, stats: dict) -> None:
        self._write({"stats": stats})

    def _write(self, entry: dict) -> None:
        if self._file is None:
            return
        try:
            self._file.write(self._encode(entry) + "\n")
            self._file.flush()
        except (ValueError, TypeError) as exc:  # not plain JSON: that entry is left out
            self.log.warning("collector journal: an entry was left out (%s)", exc)
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        self.log.error("collector journal %s: %s; a restarted collector would resume from before this", self.path,
                       exc.strerror or exc)
        self._close_file()

    def close(self) -> None:
        """The run folder is written (or given up): the journal is of no more use."""
        self._close_file()
        _unlink(self.path)

    def _close_file(self) -> None:
        file, self._file = self._file, None
        with contextlib.suppress(OSError):  # a tail that cannot be flushed is a line a reload leaves out
            if file is not None:
                file.close()


def remove_journal(run_dir: str) -> None:
    """No collector will go on with the run (the runner salvaged its lists): the journal goes."""
    _unlink(os.path.join(run_dir, JOURNAL_NAME))


def reload(run_dir: str) -> Reloaded:
    """The entries of the journal in ``run_dir`` whose records its lists' partial files hold whole."""
    journal = _read_bytes(os.path.join(run_dir, JOURNAL_NAME))
    lists = {name: _newest_partial(run_dir, name) for name in LISTS}
    ends = {name: [end for _, end in whole_records_with_ends(data)] for name, (_, data) in lists.items()}
    kept, counts, journal_end = [], [0, 0], 0
    for entry, entry_end in _journal_lines(journal):
        wrote = entry.get("lists") or [0, 0]
        if any(counts[i] + wrote[i] > len(ends[name]) for i, name in enumerate(LISTS)):
            break  # its records are not all in the files: the frame counts as unseen
        counts = [counts[i] + wrote[i] for i in range(len(LISTS))]
        kept.append(entry)
        journal_end = entry_end
    resumed = {}
    for i, name in enumerate(LISTS):
        path, data = lists[name]
        resumed[name] = (path, counts[i], ends[name][counts[i] - 1] if counts[i] else 1) if data else None
    return Reloaded(kept, journal_end, resumed)


def _journal_lines(data: bytes) -> list[tuple[dict, int]]:
    """(entry, byte offset past its line) of each whole line, up to the first that is not."""
    entries, start = [], 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return entries  # the line being written when the collector died
        try:
            entry = json.loads(data[start:end])
        except ValueError:
            return entries
        if not isinstance(entry, dict):
            return entries
        entries.append((entry, end + 1))
        start = end + 1


def _newest_partial(run_dir: str, name: str) -> tuple[str | None, bytes]:
    """The partial file of list ``name`` a dead collector left (the newest, others removed), and
    its bytes; (None, b"") when there is none or it does not even hold the opening "["."""
    found = sorted((e for e in os.scandir(run_dir) if (m := PARTIAL_LIST.match(e.name)) and m.group(1) == name),
                   key=lambda e: e.stat().st_mtime)
    for older in found[:-1]:
        _unlink(older.path)
    if not found:
        return None, b""
    data = _read_bytes(found[-1].path)
    if not data.startswith(b"["):
        _unlink(found[-1].path)
        return None, b""
    return found[-1].path, data


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
