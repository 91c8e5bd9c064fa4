"""The nodes' outputs in one run folder: frame ids made global, annotated files copied, one
detections.json and predictions.json, one trace with a process group per node. Only runs that
came back are here; the units of a node that died were run again elsewhere.

Names need no mapping: a feed's frames carry the driver's names (inputs/feed.py), so every
node's files are already named as the merged run names them.
"""

from __future__ import annotations

import json
import os

from analysis.atomic import write_bytes_atomic
from cluster.node import RETURNED_DIRS
from yolo.coco import coco_results

TIDS_PER_PROCESS = 100  # a run's process p, thread t -> thread p * 100 + t of its node's group


def merged_detections(runs) -> list[dict]:
    """Every run's detections with global frame ids, in frame order."""
    records = []
    for run in runs:
        for record in json.loads(run.result["files"].get("detections.json", b"[]") or b"[]"):
            records.append(dict(record, frame=run.global_id(record["frame"]), node=run.node.label))
    return sorted(records, key=lambda r: r["frame"])


def write_outputs(run_dir: str, runs, class_names) -> dict:
    """detections.json, predictions.json and the annotated files; returns what was written."""
    detections = merged_detections(runs)
    without_node = [{k: v for k, v in r.items() if k != "node"} for r in detections]
    write_bytes_atomic(os.path.join(run_dir, "detections.json"), json.dumps(without_node, indent=1).encode())
    predictions = coco_results(without_node, class_names)
    write_bytes_atomic(os.path.join(run_dir, "predictions.json"), json.dumps(predictions).encode())
    copied = {top: 0 for top in RETURNED_DIRS}
    written: set[str] = set()
    for run in runs:
        for relative, data in run.result["files"].items():
            top = relative.split("/")[0]
            if top in copied:
                relative = unused_name(relative, written)
                target = os.path.join(run_dir, relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                write_bytes_atomic(target, data)
                written.add(relative)
                copied[top] += 1
    return {"detections": len(detections), "predictions": len(predictions), "files": copied}


def unused_name(relative: str, written: set[str]) -> str:
    """``relative``, or ``name.part2.ext`` (3, ...) when another run wrote it: the rest of a video
    that a node left unfinished is an annotated video of its own on the node that ran it."""
    stem, ext = os.path.splitext(relative)
    part = 1
    while relative in written:
        part += 1
        relative = f"{stem}.part{part}{ext}"
    return relative


def merged_trace(runs, nodes, origin_unix: float) -> dict:
    """One Chrome trace: a process group (pid) per node, a thread per process of each run,
    times in microseconds since ``origin_unix`` (the earliest run's start)."""
    events = [{"ph": "M", "name": "process_name", "pid": n.index + 1, "tid": 0,
               "args": {"name": f"{n.label} {n.host}"}} for n in nodes]
    for run in runs:
        raw = run.result["files"].get("trace.json")
        report = run_report(run)
        if not raw or not report:
            continue
        throughput = report["throughput"]
        shift_us = (throughput["window_start_unix"] - throughput["window_start_s"] - origin_unix) * 1e6
        for event in json.loads(raw).get("traceEvents", []):
            events.append(_moved(event, run, shift_us))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _moved(event: dict, run, shift_us: float) -> dict:
    """An event of a run's trace on its node's process group; its process becomes a thread."""
    moved = dict(event, pid=run.node.index + 1, tid=event.get("pid", 0) * TIDS_PER_PROCESS + event.get("tid", 0))
    if event.get("ph") == "M":
        if event.get("name") == "process_name":
            moved["name"], moved["args"] = "thread_name", {"name": f"run {run.index} {event['args']['name']}"}
        elif event.get("name") == "process_sort_index":
            moved["name"] = "thread_sort_index"
    if "ts" in event:
        moved["ts"] = event["ts"] + shift_us
    return moved


def run_report(run) -> dict | None:
    raw = run.result["files"].get("report.json") if run.result else None
    return json.loads(raw) if raw else None
