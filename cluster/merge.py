"""The chunks' outputs in one run folder: frame ids and names made global, annotated files
renamed and copied, one detections.json and predictions.json, one trace with a process group
per node. Only chunks that came back are here; a chunk of a dead node was run again elsewhere.
"""

from __future__ import annotations

import bisect
import json
import os

from analysis.atomic import write_bytes_atomic
from cluster.chunks import Chunk, local_name
from cluster.node import RETURNED_DIRS
from yolo.coco import coco_results


TIDS_PER_PROCESS = 100  # a chunk's process p, thread t -> thread p * 100 + t of its node's group


class ChunkNames:
    """A chunk's local frame ids and names -> the merged run's."""

    def __init__(self, chunk: Chunk):
        self.chunk = chunk
        self.starts = [u.first_id - chunk.first_id for u in chunk.units]
        prefixes = chunk.name_map()
        self.prefixes = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))  # longest first

    def frame_id(self, local_id: int) -> int:
        return self.chunk.first_id + local_id

    def name(self, local_id: int, local: str) -> str:
        unit = self.chunk.units[max(bisect.bisect_right(self.starts, local_id) - 1, 0)]
        if self.chunk.synthetic:
            return unit.name
        mine = local_name(unit.location)
        return unit.name + local[len(mine):] if local.startswith(mine) else unit.name

    def path(self, relative: str) -> str:
        """A file of the chunk's folder (``images/<name>``, ``crops/<class>/<stem>2.jpg``) at its
        place in the merged folder: the longest local stem it starts with becomes the global one."""
        parts = relative.split("/")
        keep = 2 if parts[0] == "crops" and len(parts) > 2 else 1
        head, rest = "/".join(parts[:keep]), "/".join(parts[keep:])
        for local, merged in self.prefixes:
            if rest.startswith(local):
                return f"{head}/{merged}{rest[len(local):]}"
        return relative


def merged_detections(runs) -> list[dict]:
    """Every chunk's detections with global frame ids and names, in frame order."""
    records = []
    for run in runs:
        names = ChunkNames(run.chunk)
        for record in json.loads(run.result["files"].get("detections.json", b"[]") or b"[]"):
            record = dict(record, frame=names.frame_id(record["frame"]), node=run.node.label)
            record["image"] = names.name(record["frame"] - run.chunk.first_id, record["image"])
            records.append(record)
    return sorted(records, key=lambda r: r["frame"])


def write_outputs(run_dir: str, runs, class_names) -> dict:
    """detections.json, predictions.json and the annotated files; returns what was written."""
    detections = merged_detections(runs)
    without_node = [{k: v for k, v in r.items() if k != "node"} for r in detections]
    write_bytes_atomic(os.path.join(run_dir, "detections.json"), json.dumps(without_node, indent=1).encode())
    predictions = coco_results(without_node, class_names)
    write_bytes_atomic(os.path.join(run_dir, "predictions.json"), json.dumps(predictions).encode())
    copied = {top: 0 for top in RETURNED_DIRS}
    for run in runs:
        names = ChunkNames(run.chunk)
        for relative, data in run.result["files"].items():
            top = relative.split("/")[0]
            if top in copied:
                target = os.path.join(run_dir, names.path(relative))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                write_bytes_atomic(target, data)
                copied[top] += 1
    return {"detections": len(detections), "predictions": len(predictions), "files": copied}


def merged_trace(runs, nodes, origin_unix: float) -> dict:
    """One Chrome trace: a process group (pid) per node, a thread per process of each chunk,
    times in microseconds since ``origin_unix`` (the earliest chunk's start)."""
    events = [{"ph": "M", "name": "process_name", "pid": n.index + 1, "tid": 0,
               "args": {"name": f"{n.label} {n.host}"}} for n in nodes]
    for run in runs:
        raw = run.result["files"].get("trace.json")
        report = chunk_report(run)
        if not raw or not report:
            continue
        throughput = report["throughput"]
        shift_us = (throughput["window_start_unix"] - throughput["window_start_s"] - origin_unix) * 1e6
        for event in json.loads(raw).get("traceEvents", []):
            events.append(_moved(event, run, shift_us))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _moved(event: dict, run, shift_us: float) -> dict:
    """An event of a chunk's trace on its node's process group; its process becomes a thread."""
    moved = dict(event, pid=run.node.index + 1, tid=event.get("pid", 0) * TIDS_PER_PROCESS + event.get("tid", 0))
    if event.get("ph") == "M":
        if event.get("name") == "process_name":
            moved["name"], moved["args"] = "thread_name", {"name": f"chunk {run.chunk.index} {event['args']['name']}"}
        elif event.get("name") == "process_sort_index":
            moved["name"] = "thread_sort_index"
    if "ts" in event:
        moved["ts"] = event["ts"] + shift_us
    return moved


def chunk_report(run) -> dict | None:
    raw = run.result["files"].get("report.json") if run.result else None
    return json.loads(raw) if raw else None
