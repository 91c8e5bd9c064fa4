"""The collector's ledger of frame ids: every frame a run started ends up processed, failed with a
reason, or (when the run was stopped) cancelled, and the report's ``frames in`` equals their sum.

A frame reported twice (sent again after a worker died) counts once; an id the plan cannot have
is dropped. At the end, :func:`account_missing` names, for every frame that did not complete,
who held it (from the senders' in-flight ledgers) or that it never started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FRAME_TIMES = ("read_start", "read_end", "pre_end", "infer_recv", "infer_start", "infer_end", "post_start", "post_end")


class Ledger:
    def __init__(self, plan):
        self.plan = plan
        self.processed: dict[int, tuple] = {}  # id -> compact record (see _compact)
        self.failed: dict[int, dict] = {}
        self.cancelled: dict[int, dict] = {}
        self.duplicates = 0
        self.out_of_plan = 0
        self.frames_in: int | None = plan.total  # known now for a finite plan; counted at the end otherwise

    def add_result(self, result: dict) -> bool:
        if not self._is_new(result["id"]):
            return False
        self.processed[result["id"]] = _compact(result)
        return True

    def add_failure(self, failure: dict) -> bool:
        if not self._is_new(failure["id"]):
            return False
        self.failed[failure["id"]] = {k: failure[k] for k in ("id", "name", "stage", "worker", "reason")} | {
            "kind": "failed"}
        return True

    def _is_new(self, frame_id: int) -> bool:
        if frame_id < 0 or (not self.plan.open_ended and frame_id >= self.plan.total):
            self.out_of_plan += 1
            return False
        if frame_id in self.processed or frame_id in self.failed:
            self.duplicates += 1
            return False
        return True

    def done(self) -> int:
        return len(self.processed) + len(self.failed)

    def lose(self, frame_id: int, name: str, stage: str, worker: str | None, reason: str) -> None:
        self.failed[frame_id] = {"id": frame_id, "name": name, "stage": stage, "worker": worker, "reason": reason,
                                 "kind": "lost"}

    def cancel(self, frame_id: int, name: str) -> None:
        self.cancelled[frame_id] = {"id": frame_id, "name": name}

    def frames(self) -> list[dict]:
        return [_frame_dict(i, self.processed[i]) for i in sorted(self.processed)]


def _compact(result: dict) -> tuple:
    t = result["t"]
    workers = result.get("workers") or {}
    return (result["name"], workers.get("pre"), workers.get("infer"), workers.get("post"),
            tuple(float(t.get(k, 0.0)) for k in FRAME_TIMES), int(result["batch"]), len(result["detections"]),
            bool(result["image_saved"]), bool(result["cold"]))


def _frame_dict(frame_id: int, record: tuple) -> dict:
    name, pre, infer, post, times, batch, detections, saved, cold = record
    return {"id": frame_id, "name": name, "workers": {"pre": pre, "infer": infer, "post": post},
            "t": dict(zip(FRAME_TIMES, times)), "batch": batch, "detections": detections, "image_saved": saved,
            "cold": cold}


@dataclass
class Expected:
    """Which workers' summaries the collector still waits for: one per name, from its latest
    incarnation; a worker gone for good (no restart) is no longer waited for."""

    names: list[str]
    stats: dict[str, dict] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    abandoned: set[str] = field(default_factory=set)
    restarts: list[dict] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)  # last known share position of a dead reader

    def add_stats(self, stats: dict) -> None:
        name = stats["name"]
        if name in self.names and stats["incarnation"] >= self.latest.get(name, 0):
            self.stats[name] = stats

    def gone(self, notice: dict) -> None:
        name = notice["name"]
        if name not in self.names:
            return
        self.restarts.append({k: notice.get(k) for k in ("name", "incarnation", "signal", "exit_code", "reason",
                                                         "t_s", "final")})
        if isinstance(notice.get("position"), int):
            self.positions[name] = notice["position"]
        if notice["final"]:
            self.abandoned.add(name)
        else:
            self.latest[name] = max(self.latest.get(name, 0), notice["incarnation"] + 1)

    def waiting_for(self) -> list[str]:
        return [n for n in self.names if n not in self.stats and n not in self.abandoned]


def started_ids(plan, expected: Expected) -> set[int] | None:
    """The ids the preprocess workers started (read, or failed to read), from their final share
    positions; None when a worker's position is unknown."""
    readers = sorted(n for n in expected.names if n.startswith("pre-"))
    started: set[int] = set()
    for name in readers:
        stats = expected.stats.get(name)
        position = stats.get("position") if stats else expected.positions.get(name)
        if position is None:
            return None
        worker = int(name.split("-")[1])
        ids = plan.worker_ids(worker, len(readers))
        started.update(ids[:position])
        if plan.open_ended:
            started.update(plan.open_stream_id(worker, len(readers), k) for k in range(position - len(ids)))
    return started


def account_missing(ledger: Ledger, expected: Expected, stop_reason: str | None, cancel_unread: bool) -> None:
    """Name, for every frame that did not complete, who held it or that it never started; and
    settle ``frames_in``: the plan's frames, or (open-ended plan, or a run ended by --duration)
    the frames started."""
    plan = ledger.plan
    started = started_ids(plan, expected)
    reported = set(ledger.processed) | set(ledger.failed)
    if started is None:
        started = reported | (set(range(plan.total)) if not plan.open_ended else set())
    started |= reported
    if plan.open_ended or not cancel_unread:
        ledger.frames_in = len(started)
    else:
        ledger.frames_in = plan.total
        for frame_id in sorted(set(range(plan.total)) - started):
            if stop_reason:
                ledger.cancel(frame_id, plan.ref(frame_id).name)
            else:  # no stop, yet never read: a reader that gave up its share
                started.add(frame_id)
    holders = _holders(expected)
    for frame_id in sorted(started - reported):
        name = plan.ref(frame_id).name if frame_id < plan.planned else f"frame {frame_id}"
        why = stop_reason or "no reason given"
        if frame_id in holders:
            worker = holders[frame_id].rpartition(".")[0]
            ledger.lose(frame_id, name, worker.split("-")[0], worker, f"lost: held by {holders[frame_id]} when the "
                                                                      f"run ended ({why})")
        else:
            ledger.lose(frame_id, name, "unknown", None, f"lost: in flight when the run ended ({why})")


def _holders(expected: Expected) -> dict[int, str]:
    holders: dict[int, str] = {}
    for stats in expected.stats.values():
        for identity, ids in (stats.get("held_by") or {}).items():
            holders.update({i: identity for i in ids})
        holders.update({i: f"{stats['name']}.{stats['incarnation']}" for i in stats.get("held") or ()})
    return holders
