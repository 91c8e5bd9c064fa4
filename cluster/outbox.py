"""What of a node's outputs goes to the driver next, while its runner runs: the node's side of
streamed outputs (the driver's is cluster/inbox.py).

The runner writes into its run folder as any run does: postprocess saves a frame's annotated
image, labels and crops before it sends the frame on, the collector writes the frame's
detection records through to its partial list file and then journals the frame, and writes
annotated videos in frame order, closing each at its end. So a file is whole once no frame that
may still write it is left: a frame's files all start, below ``images/``, ``labels/`` or
``crops/<class>/``, with its unit's name less the extension (``dir/x.png`` -> ``dir/x.jpg``,
``dir/x.txt``, ``dir/x2.jpg``; ``clip.mp4`` -> ``clip.mp4_000017.jpg``, ``clip_17.txt``).
A file is held back while a unit fed to the node and not yet journaled whole has a name that
is a beginning of its path (cautious: ``a`` holds ``ab.jpg`` too); videos wait for the runner's
end. Once the runner has exited every file is whole.

Each :meth:`Outbox.take` gives a chunk of at most ``max_bytes`` of file bytes (a large file
goes in pieces over several chunks) and the frames **delivered**: units whose every frame is
journaled (processed or failed), whose detection records were read, and of which no file is
left to send; with their journal entries and records, under global ids. A file's bytes are
removed from the node once taken; the caller keeps the chunk until the driver acknowledges it.
A node lost mid-run has thus sent whole units, and the driver runs the rest again.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass

from analysis.atomic import PARTIAL_LIST
from cluster.growing import GrowingFile
from collector.journal import JOURNAL_NAME

OUTPUT_DIRS = ("images", "labels", "crops", "videos")
LAST_OUTPUTS = ("videos",)  # written until the runner ends
MAX_FRAMES_PER_CHUNK = 2000  # delivered frames in one chunk (with their records)


@dataclass
class FedUnit:
    """A unit fed to the node: its name's stem, its frames' local and global ids."""

    stem: str
    local: list[int]
    global_ids: list[int]


def output_rest(relative: str) -> str:
    """The part of an output's path that starts with its frame's stem: below its top folder
    (and a crop's class folder)."""
    parts = relative.split("/")
    return "/".join(parts[2:] if parts[0] == "crops" else parts[1:])


class Outbox:
    """The node's view of one run folder: units fed, frames journaled, records read, files left."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.units: list[FedUnit] = []  # fed, not delivered, in feed order
        self.confirmed: dict[int, dict | None] = {}  # local id -> its failure, or None: processed
        self.expected: dict[int, int] = {}  # local id -> detection records its journal line counts
        self.records: dict[int, list] = {}  # local id -> detection records read
        self.delivered: set[int] = set()  # local ids
        self.sending: tuple[str, int] | None = None  # a file part sent: (path, bytes sent)
        self.final = False
        self.journal = GrowingFile(lambda: os.path.join(run_dir, JOURNAL_NAME))
        self.detections = GrowingFile(self._detections_partial)
        self.tail_record: bytes | None = None  # the list's last record, read before its line ended

    def fed(self, name: str, local: list[int], global_ids: list[int]) -> None:
        self.units.append(FedUnit(os.path.splitext(name)[0], local, global_ids))

    def read_journal(self) -> list[int]:
        """Local ids newly journaled (processed or failed)."""
        lines, _again = self.journal.lines()
        new = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "f" in entry:
                local, failure, self.expected[int(entry["f"][0])] = int(entry["f"][0]), None, int(entry["f"][5])
            elif "failed" in entry:
                local, failure = int(entry["failed"]["id"]), entry["failed"]
            else:
                continue
            if local not in self.confirmed and local not in self.delivered:
                new.append(local)
            if local not in self.delivered:
                self.confirmed[local] = failure
        return new

    def read_records(self) -> None:
        """Detection records written since the last look (the last one even before its newline:
        the list writes its separator only with the next record)."""
        lines, again = self.detections.lines()
        if again:
            self.records, self.tail_record = {}, None
        for line in lines:
            body = line.strip().removesuffix(b",")
            if body == self.tail_record:
                self.tail_record = None
                continue
            self._add_record(body)
        tail = self.detections.partial.strip()
        if tail and tail != self.tail_record and self._add_record(tail):
            self.tail_record = tail

    def _add_record(self, body: bytes) -> bool:
        try:
            record = json.loads(body)
        except ValueError:
            return False  # "[", "]", or a record being written
        if isinstance(record, dict) and int(record.get("frame", -1)) not in self.delivered:
            self.records.setdefault(int(record["frame"]), []).append(record)
        return isinstance(record, dict)

    def _detections_partial(self) -> str | None:
        try:
            names = [n for n in os.listdir(self.run_dir) if PARTIAL_LIST.match(n) and n.startswith(".detections.")]
        except OSError:
            return None
        return os.path.join(self.run_dir, max(names)) if names else None

    def finished(self, report: dict | None) -> None:
        """The runner exited: what its report accounts for and its final detections list stand
        for the journal (removed at the end), and every file is whole."""
        self.final = True
        frames = (report or {}).get("frames") or {}
        for first, last in frames.get("processed_ids", []):
            for local in range(first, last + 1):
                self.confirmed.setdefault(local, None)
        for failure in frames.get("failures", []):
            self.confirmed.setdefault(int(failure["id"]), failure)
        self.expected, self.records = {}, {}
        try:
            with open(os.path.join(self.run_dir, "detections.json"), "rb") as f:
                for line in f:
                    self._add_record(line.strip().removesuffix(b","))
        except OSError:
            pass  # no list: no records

    def take(self, max_bytes: int) -> dict:
        """The next chunk: ``pieces`` [(path, offset, bytes, last)], ``frames`` [(global id,
        failure or None)], ``records`` (detection records, global ``frame``), ``done`` (the
        runner has exited and nothing is left)."""
        if not self.final:
            self.read_journal()
            self.read_records()
        left = self._files_left()
        ready = [path for path in left if not self._held(path)]
        pieces, budget = [], max_bytes
        if self.sending is not None and self.sending[0] in ready:
            ready.remove(self.sending[0])
            ready.insert(0, self.sending[0])
        for path in ready:
            if budget <= 0:
                break
            piece = self._piece(path, budget)
            pieces.append(piece)
            budget -= len(piece[2])
        rests = sorted(output_rest(p) for p in self._files_left())
        frames, records = self._deliver(rests)
        return {"pieces": pieces, "frames": frames, "records": records,
                "done": self.final and not rests and len(frames) < MAX_FRAMES_PER_CHUNK}

    def _files_left(self) -> list[str]:
        found = []
        for top in OUTPUT_DIRS:
            for root, _dirs, names in os.walk(os.path.join(self.run_dir, top)):
                found += [os.path.relpath(os.path.join(root, n), self.run_dir) for n in names if not n.startswith(".")]
        return sorted(found)

    def _held(self, path: str) -> bool:
        if self.final:
            return False
        if path.split("/")[0] in LAST_OUTPUTS:
            return True
        rest = output_rest(path)
        return any(rest.startswith(unit.stem) for unit in self.units
                   if not all(local in self.confirmed for local in unit.local))

    def _piece(self, path: str, budget: int) -> tuple[str, int, bytes, bool]:
        offset = self.sending[1] if self.sending is not None and self.sending[0] == path else 0
        full = os.path.join(self.run_dir, path)
        with open(full, "rb") as f:
            f.seek(offset)
            data = f.read(budget)
            last = f.tell() >= os.fstat(f.fileno()).st_size
        if last:
            os.remove(full)
            self.sending = None
        else:
            self.sending = (path, offset + len(data))
        return path, offset, data, last

    def _deliver(self, rests: list[str]) -> tuple[list, list]:
        frames, records, kept = [], [], []
        for unit in self.units:
            if len(frames) >= MAX_FRAMES_PER_CHUNK or not self._whole(unit, rests):
                kept.append(unit)
                continue
            for local, global_id in zip(unit.local, unit.global_ids):
                frames.append((global_id, self.confirmed.pop(local)))
                records += [dict(r, frame=global_id) for r in self.records.pop(local, [])]
                self.expected.pop(local, None)
                self.delivered.add(local)
        self.units = kept
        return frames, records

    def _whole(self, unit: FedUnit, rests: list[str]) -> bool:
        """Every frame journaled with its records read, and no file of it left."""
        if any(local not in self.confirmed or len(self.records.get(local, ())) < self.expected.get(local, 0)
               for local in unit.local):
            return False
        at = bisect.bisect_left(rests, unit.stem)
        return not (at < len(rests) and rests[at].startswith(unit.stem))
