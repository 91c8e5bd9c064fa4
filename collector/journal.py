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
postprocess worker sends its last results again (workers.onward.SentResults).
"""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass

from analysis.atomic import PARTIAL_LIST, whole_records_with_ends
from topology.stages import frame_roles, frame_times

JOURNAL_NAME = ".collector-journal.partial"  # in the run folder, next to the lists it vouches for
LISTS = ("detections.json", "predictions.json")
FAILURE_KEYS = ("id", "name", "stage", "worker", "reason")
PACKED_KEY = "base64"  # a summary's packed Samples values (bytes) in a JSON line: {"base64": "..."}
BATCH_LINES = 32  # lines written together at most: a death loses at most these, and postprocess sends them again


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
    """The writer's side: one line per entry, written to the OS in batches (a kill loses the lines
    not written yet, and cuts at most the one being written, which the reader leaves out). A
    write error stops the journal, with one line in the log: the run goes on, and a restart
    resumes from what was journaled."""

    def __init__(self, run_dir: str, log: logging.Logger, resume_end: int | None = None):
        from analysis.report import json_text  # for a summary that holds NaN: what the lists are written with
        self.path = os.path.join(run_dir, JOURNAL_NAME)
        self.log, self._plain_json = log, json_text
        self._roles, self._time_keys = frame_roles(), frame_times()  # the stage table's, once per run
        self._fd: int | None = None
        self._pending: list[str] = []  # lines not written yet (at most BATCH_LINES)
        try:
            if resume_end is not None:
                os.truncate(self.path, resume_end)
            fresh = os.O_TRUNC if resume_end is None else 0
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | fresh, 0o644)
        except OSError as exc:
            self._stop(exc)

    def frame(self, result: dict, lists: tuple[int, int]) -> None:
        """Formatted by hand, not by json.dumps of a dict: this runs for every frame of the run."""
        if self._fd is None:
            return
        t, workers = result["t"], result.get("workers") or {}
        times = ",".join(repr(float(t.get(k, 0.0))) for k in self._time_keys)
        names = json.dumps([result["name"]] + [workers.get(role) for role in self._roles])
        self._pending.append(f'{{"f":[{result["id"]},{int(result["batch"])},{int(bool(result["image_saved"]))},'
                             f'{int(bool(result["cold"]))},{_count(result["detections"])},{lists[0]},{lists[1]},'
                             f'[{times}],{names}]}}')
        if len(self._pending) >= BATCH_LINES:
            self.flush()

    def failed(self, failure: dict) -> None:
        self._write({"failed": {k: failure[k] for k in FAILURE_KEYS}})

    def stats(self, stats: dict) -> None:
        self._write({"stats": stats})

    def _write(self, entry: dict) -> None:
        if self._fd is None:
            return
        entry = _with_bytes_as_text(entry)
        try:
            try:
                self._pending.append(json.dumps(entry, allow_nan=False))
            except ValueError:
                self._pending.append(self._plain_json(entry))
        except (ValueError, TypeError) as exc:  # not plain JSON: that entry is left out
            self.log.warning("collector journal: an entry was left out (%s)", exc)
        if len(self._pending) >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        """The lines kept so far, in one os.write: after the records they vouch for, which the
        lists wrote through already. The collector calls it after each batch of messages it read:
        one system call a batch, not a frame (every frame goes through the collector)."""
        lines, self._pending = self._pending, []
        if self._fd is None or not lines:
            return
        try:
            os.write(self._fd, ("\n".join(lines) + "\n").encode("ascii"))
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        self.log.error("collector journal %s: %s; a restarted collector would resume from before this", self.path,
                       exc.strerror or exc)
        self._close_file()

    def close(self) -> None:
        """The run folder is written (or given up): the journal is of no more use."""
        self._pending = []
        self._close_file()
        _unlink(self.path)

    def _close_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

def _count(detections) -> int:
    """How many detections a result holds: its records, or (a Done item) their count."""
    return detections if isinstance(detections, int) else len(detections)


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
        wrote = entry["f"][5:7] if "f" in entry else [0, 0]
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


def frame_row(line: list) -> dict:
    """A frame's row, as collector.ledger.Ledger.add_result takes it, from its journal line
    ``[id, batch, image_saved, cold, detections, records in each list..., [times], [name, worker of
    each frame stage...]]``, times and workers in the stage table's order."""
    (frame_id, batch, saved, cold, found), times, (name, *workers) = line[:5], line[7], line[8]
    return {"id": frame_id, "name": name, "t": dict(zip(frame_times(), times)), "batch": batch,
            "image_saved": bool(saved), "cold": bool(cold), "workers": dict(zip(frame_roles(), workers)),
            "detections": found}


def _with_bytes_as_text(value):
    """``value`` with a worker summary's packed values (analysis.samples.pack_values) as base64 text."""
    if isinstance(value, dict):
        return {k: _with_bytes_as_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_with_bytes_as_text(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {PACKED_KEY: base64.b64encode(value).decode("ascii")}
    return value


def _bytes_from_json(obj: dict):
    if len(obj) == 1 and isinstance(obj.get(PACKED_KEY), str):
        return base64.b64decode(obj[PACKED_KEY])
    return obj


def _journal_lines(data: bytes) -> list[tuple[dict, int]]:
    """(entry, byte offset past its line) of each whole line, up to the first that is not."""
    entries, start = [], 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return entries  # the line being written when the collector died
        try:
            entry = json.loads(data[start:end], object_hook=_bytes_from_json)
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
