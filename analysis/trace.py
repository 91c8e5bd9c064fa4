"""trace.json in the Chrome trace-event format (Perfetto, chrome://tracing): a process track per
worker process, a span per frame per stage on the process that did it, the inference processes'
forwards on thread 9 and their module spans on thread 10 + depth, and a frames-completed counter
on the collector. Timestamps in microseconds since the run's start."""

from __future__ import annotations

import bisect
import math

from analysis.run_data import RunData
from topology.stages import done_time, frame_roles, trace_spans

FRAME_TID = 0
FORWARD_TID = 9
MODULE_TID_BASE = 10  # module spans at depth d go on thread 10 + d


def process_label(worker: dict) -> str:
    """The worker's name, with its incarnation when it was restarted (``infer-1#2``)."""
    incarnation = worker.get("incarnation", 0)
    return f"{worker['name']}#{incarnation}" if incarnation else worker["name"]


class PidFinder:
    """The pid that did a frame's stage: with restarts one name has several processes, each from
    its restart time on."""

    def __init__(self, run: RunData):
        restarted_at = {(r["name"], r["incarnation"]): r["t_s"] for r in run.restarts}
        self._by_name: dict[str, tuple[list[float], list[int]]] = {}
        for w in sorted(run.workers, key=lambda w: w.get("incarnation", 0)):
            starts, pids = self._by_name.setdefault(w["name"], ([], []))
            starts.append(-math.inf if not w.get("incarnation") else
                          restarted_at.get((w["name"], w["incarnation"]), -math.inf))
            pids.append(w["pid"])

    def __call__(self, name: str | None, t_s: float) -> int | None:
        if name not in self._by_name:
            return None
        starts, pids = self._by_name[name]
        return pids[max(bisect.bisect_right(starts, t_s) - 1, 0)]


def traced_frames(run: RunData) -> list[dict]:
    """The frames whose spans go into the trace: the first ``trace_max_frames`` completed (a
    trace of a long run would be tens of MB that no viewer opens comfortably)."""
    limit = run.config.get("trace_max_frames")
    done = done_time()
    frames = sorted(run.frames, key=lambda f: f["t"][done])
    return frames if not limit else frames[:limit]


def trace_events(run: RunData) -> dict:
    def us(t_s: float) -> float:
        return round((t_s - run.started_s) * 1e6, 1)

    pid_of = PidFinder(run)
    ordered = sorted(run.workers, key=lambda w: (_role_order(w["role"]), w["name"], w.get("incarnation", 0)))
    events = [_metadata("process_name", w["pid"], 0, process_label(w)) for w in ordered]
    events += [_metadata("process_sort_index", w["pid"], 0, None, sort_index=i) for i, w in enumerate(ordered)]
    events += [_metadata("thread_name", w["pid"], FRAME_TID, "frames") for w in ordered]
    spans = trace_spans()
    for f in traced_frames(run):
        for role, label, t0, t1 in spans:
            pid = pid_of(f.get("workers", {}).get(role), f["t"][t0])
            if pid is None:
                continue
            name = f"{label} batch={f.get('batch', 1)}" if role == "infer" else label
            events.append({"ph": "X", "name": name, "cat": role, "pid": pid, "tid": FRAME_TID,
                           "ts": us(f["t"][t0]), "dur": round((f["t"][t1] - f["t"][t0]) * 1e6, 1),
                           "args": {"frame": f["id"], "name": f["name"], "cold": f.get("cold", False)}})
    tracks = sorted({(s["pid"], s["depth"]) for s in run.module_spans})
    events += [_metadata("thread_name", pid, _module_tid(depth), "forward" if depth < 0 else f"modules depth {depth}")
               for pid, depth in tracks]
    events += [{"ph": "X", "name": s["name"], "cat": "module", "pid": s["pid"], "tid": _module_tid(s["depth"]),
                "ts": us(s["start_s"]), "dur": round(s["dur_ms"] * 1e3, 1)} for s in run.module_spans]
    events += _completed_counter(run, us)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _metadata(kind: str, pid: int, tid: int, name: str | None, **args) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name} if name is not None else args}


def _module_tid(depth: int) -> int:
    return FORWARD_TID if depth < 0 else MODULE_TID_BASE + depth


def _role_order(role: str) -> int:
    return frame_roles().index(role) if role in frame_roles() else len(frame_roles())


def _completed_counter(run: RunData, us) -> list[dict]:
    collector = next((w for w in run.workers if w["role"] == "collector"), None)
    if collector is None:
        return []
    done = done_time()
    ends = [f["t"][done] for f in traced_frames(run)]
    return [{"ph": "C", "name": "frames completed", "pid": collector["pid"], "tid": FRAME_TID, "ts": us(t),
             "args": {"frames": i}} for i, t in enumerate(ends, start=1)]
