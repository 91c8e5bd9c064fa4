"""The nodes' outputs as they come, on the driver: each chunk's file pieces written into the
merged run folder under their global names at once, its delivered frames noted on their run, its
detection records appended to a file on disk. The driver holds one chunk at a time, however many
images the run saves. (The node's side is cluster/outbox.py.)

A chunk that comes again (the driver was interrupted while writing it, and asks again with the
last one it acknowledged) is written again harmlessly: pieces go to their offsets, and the files
it finished already are passed over; a frame's records are one line, the first line of a frame
counts. The rest of a video that another run wrote first is ``name.part2.ext`` (3, ...).

With the results in a store (``store_root``) the nodes write their files there themselves and
the chunks carry none. The rest of a video that an aborted runner left is written by the next
runner under the video's own name: the part the aborted runner copied there is set aside first
(:meth:`Inbox.video_continued`) and the parts are named as above at the end.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from analysis.atomic import write_bytes_atomic
from cluster.outbox import LAST_OUTPUTS, OUTPUT_DIRS
from inputs.object_store import is_store_url
from workers.store import Store, run_root, store_errors, why
from yolo.coco import coco_results

SPILL_NAME = ".detections.spill.jsonl"

log = logging.getLogger("cluster")


@dataclass
class Received:
    """What came from one runner: its delivered frames (global id -> failure, or None when
    processed), the last chunk written and the files it finished, its files' partial copies."""

    delivered: dict[int, dict | None] = field(default_factory=dict)
    seq: int = 0
    finished_in_seq: set[str] = field(default_factory=set)
    partial: dict[str, str] = field(default_factory=dict)  # relative path -> its partial file here


class Inbox:
    """Writes what the nodes send into ``run_dir`` (the merged run folder)."""

    def __init__(self, run_dir: str, store_root: str = ""):
        self.run_dir = run_dir
        self.store_root = store_root
        self.set_aside: dict[str, list[str]] = {}  # a store's video -> its earlier parts, set aside in order
        self.spill_path = os.path.join(run_dir, SPILL_NAME)
        self.videos: set[str] = set()  # whole videos written, by their name here
        self.streamed_bytes = 0  # file bytes received from the nodes (none when they write to a store)

    def receive(self, received: Received, label: str, chunk: dict) -> None:
        """Write ``chunk`` (cluster.outbox.Outbox.take's) from the runner ``label``."""
        again = chunk["seq"] == received.seq
        if not again:
            received.seq, received.finished_in_seq = chunk["seq"], set()
        for relative, offset, data, last in chunk["pieces"]:
            if again and relative in received.finished_in_seq:
                continue
            partial = received.partial.get(relative)
            if partial is None:
                folder, name = os.path.split(os.path.join(self.run_dir, relative))
                os.makedirs(folder, exist_ok=True)
                partial = received.partial[relative] = os.path.join(folder, f".{name}.{label}.partial")
            self.streamed_bytes += len(data)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                os.pwrite(fd, data, offset)
            finally:
                os.close(fd)
            if last:
                self._place(relative, received.partial.pop(relative))
                received.finished_in_seq.add(relative)
        by_frame: dict[int, list] = {}
        for record in chunk["records"]:
            by_frame.setdefault(record["frame"], []).append(record)
        if by_frame:
            with open(self.spill_path, "a", encoding="utf-8") as spill:
                spill.write("".join(json.dumps({"frame": f, "records": r}) + "\n" for f, r in by_frame.items()))
        for global_id, failure in chunk["frames"]:
            received.delivered[int(global_id)] = failure

    def _place(self, relative: str, partial: str) -> None:
        top = relative.split("/")[0]
        if top in LAST_OUTPUTS:
            relative = unused_name(relative, self.videos)
            self.videos.add(relative)
        os.replace(partial, os.path.join(self.run_dir, relative))

    @classmethod
    def of_run(cls, run_dir: str, results: str) -> Inbox:
        """The inbox of the run folder ``run_dir``; with ``results`` in a store, its outputs are
        under ``RESULTS/<run_dir's name>`` there."""
        return cls(run_dir, run_root(results, run_dir) if is_store_url(results) else "")

    def video_continued(self, name: str) -> None:
        """A runner aborted in the video ``name`` (the source's name), whose rest runs again: in a
        store, the part it copied (``videos/<stem>.mp4``) is set aside before the rest is written
        there. (A folder gets the rest as a file of its own.)"""
        if not self.store_root:
            return
        relative = f"videos/{os.path.splitext(name)[0]}.mp4"
        parts = self.set_aside.setdefault(relative, [])
        hidden = f"videos/.{os.path.basename(relative)}.part{len(parts) + 1}"
        try:
            Store(self.store_root).move(relative, hidden)
            parts.append(hidden)
        except FileNotFoundError:
            pass  # it saved no frame of it
        except store_errors() as exc:
            log.error("could not set aside %s before its rest is written: %s", relative, why(exc))

    def _name_video_parts(self) -> None:
        """Each set-aside video: its first part under its own name, the next ``.part2``, ...,
        the last one written last."""
        store = Store(self.store_root)
        for relative, parts in self.set_aside.items():
            names = [relative] + [f"{os.path.splitext(relative)[0]}.part{n}.mp4" for n in range(2, len(parts) + 2)]
            try:
                if store.exists(relative):
                    store.move(relative, names[len(parts)])
                for hidden, name in zip(parts, names):
                    store.move(hidden, name)
            except store_errors() as exc:
                log.error("could not name the parts of %s: %s", relative, why(exc))

    def abandon(self, received: Received) -> None:
        """A runner lost mid-file: its partial copies go (its units run again elsewhere)."""
        for partial in received.partial.values():
            try:
                os.remove(partial)
            except FileNotFoundError:
                pass
        received.partial.clear()

    def write_lists(self, class_names) -> dict:
        """detections.json and predictions.json from the records received, in frame order; the
        spill file goes. Returns what was written."""
        by_frame: dict[int, list] = {}
        try:
            with open(self.spill_path, encoding="utf-8") as spill:
                for line in spill:
                    entry = json.loads(line)
                    by_frame.setdefault(entry["frame"], entry["records"])
        except FileNotFoundError:
            pass
        records = [r for frame in sorted(by_frame) for r in by_frame[frame]]
        if self.store_root:
            self._name_video_parts()
        write_bytes_atomic(os.path.join(self.run_dir, "detections.json"), json.dumps(records, indent=1).encode())
        predictions = coco_results(records, class_names)
        write_bytes_atomic(os.path.join(self.run_dir, "predictions.json"), json.dumps(predictions).encode())
        try:
            os.remove(self.spill_path)
        except FileNotFoundError:
            pass
        files = {top: sum(len([n for n in names if not n.startswith(".")])
                          for _root, _dirs, names in os.walk(os.path.join(self.run_dir, top))) for top in OUTPUT_DIRS}
        return {"detections": len(records), "predictions": len(predictions), "files": files,
                "streamed_bytes": self.streamed_bytes}


def unused_name(relative: str, written: set[str]) -> str:
    """``relative``, or ``name.part2.ext`` (3, ...) when another run wrote it: the rest of a video
    that a node left unfinished is an annotated video of its own on the node that ran it."""
    stem, ext = os.path.splitext(relative)
    part = 1
    while relative in written:
        part += 1
        relative = f"{stem}.part{part}{ext}"
    return relative
