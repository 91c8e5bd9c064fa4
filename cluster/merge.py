"""The nodes' traces in one: a process group per node, a thread per process of each run. (The
annotated files and detections came while the runs went: cluster/inbox.py.)"""

from __future__ import annotations

import json

TIDS_PER_PROCESS = 100  # a run's process p, thread t -> thread p * 100 + t of its node's group


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
