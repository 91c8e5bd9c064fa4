"""The collector's ledger of frame ids: every frame a run started ends up processed, failed with a
reason, or (when the run was stopped) cancelled, and the report's ``frames in`` equals their sum.

A frame reported twice (sent again after a worker died) counts once; an id the plan cannot have
is dropped. At the end, :func:`account_missing` names, for every frame that did not complete,
who held it (from the senders' in-flight ledgers) or that it never started.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from topology.stages import frame_roles, frame_times, sink_role, source_role

UNSEEN, PROCESSED, FAILED = 0, 1, 2
OPEN_ID_SLACK = 1 << 20  # an open-ended plan's ids grow one by one: a jump past this is not a frame of the run


class ProcessedFrames:
    """One row per processed frame, kept in typed arrays (about 90 bytes a frame, where a dict
    per frame took about 1 KB) so that a long run's collector stays flat; ``dicts()`` rebuilds the
    report's frame dicts at the end. A frame's name is the plan's and is only stored when it is not."""

    def __init__(self, plan):
        self.plan = plan
        self.roles, self.time_keys = frame_roles(), frame_times()  # the stage table's, once per run
        self.ids = array("q")
        self.times = array("d")
        self.batch = array("I")
        self.detections = array("I")
        self.flags = array("B")  # bit 0: image saved, bit 1: cold forward
        self.worker_sets = array("I")
        self._worker_set_index: dict[tuple, int] = {}
        self._names: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, result: dict) -> None:
        frame_id, t = result["id"], result["t"]
        workers = result.get("workers") or {}
        names = tuple(workers.get(role) for role in self.roles)
        self.ids.append(frame_id)
        self.times.extend([t.get(k, 0.0) for k in self.time_keys])  # numbers (checked on the wire): the array makes them doubles
        self.batch.append(int(result["batch"]))
        found = result["detections"]  # the records, or their count (a row a restarted collector reloads)
        self.detections.append(found if isinstance(found, int) else len(found))
        self.flags.append(bool(result["image_saved"]) | bool(result["cold"]) << 1)
        self.worker_sets.append(self._worker_set_index.setdefault(names, len(self._worker_set_index)))
        if frame_id >= self.plan.planned or self.plan.ref(frame_id).name != result["name"]:
            self._names[frame_id] = result["name"]

    def dicts(self) -> list[dict]:
        """The frames as dicts (see ``analysis.run_data.RunData.frames``), by id."""
        worker_sets = list(self._worker_set_index)
        width = len(self.time_keys)
        rows = sorted(range(len(self.ids)), key=self.ids.__getitem__)
        frames = []
        for row in rows:
            frame_id = self.ids[row]
            workers = dict(zip(self.roles, worker_sets[self.worker_sets[row]]))
            name = self._names.get(frame_id) or self.plan.ref(frame_id).name
            frames.append({"id": frame_id, "name": name, "workers": workers,
                           "t": dict(zip(self.time_keys, self.times[row * width:(row + 1) * width])),
                           "batch": self.batch[row], "detections": self.detections[row],
                           "image_saved": bool(self.flags[row] & 1), "cold": bool(self.flags[row] & 2)})
        return frames


class Ledger:
    def __init__(self, plan):
        self.plan = plan
        self.processed = ProcessedFrames(plan)
        self.failed: dict[int, dict] = {}
        self.cancelled: dict[int, dict] = {}
        self.duplicates = 0
        self.out_of_plan = 0
        self.frames_in: int | None = plan.total  # known now for a finite plan; counted at the end otherwise
        self._state = bytearray(plan.planned)  # UNSEEN, PROCESSED or FAILED by frame id

    def add_result(self, result: dict) -> bool:
        if not self._is_new(result["id"]):
            return False
        self.processed.add(result)
        self._state[result["id"]] = PROCESSED
        return True

    def add_failure(self, failure: dict) -> bool:
        if not self._is_new(failure["id"]):
            return False
        self.failed[failure["id"]] = {k: failure[k] for k in ("id", "name", "stage", "worker", "reason")} | {
            "kind": "failed"}
        self._state[failure["id"]] = FAILED
        return True

    def _is_new(self, frame_id: int) -> bool:
        if frame_id < 0 or frame_id >= self._grow_to(frame_id):
            self.out_of_plan += 1
            return False
        if self._state[frame_id] != UNSEEN:
            self.duplicates += 1
            return False
        return True

    def _grow_to(self, frame_id: int) -> int:
        """The number of ids this run can have, grown to hold ``frame_id`` when the plan is open-ended."""
        state = self._state
        if self.plan.open_ended and len(state) <= frame_id < len(state) + OPEN_ID_SLACK:
            state.extend(bytes(max(frame_id + 1 - len(state), len(state) // 2, 1024)))
        return len(state) if self.plan.open_ended else self.plan.total

    def has(self, frame_id: int) -> bool:
        """Whether ``frame_id`` was processed or failed."""
        return 0 <= frame_id < len(self._state) and self._state[frame_id] != UNSEEN

    def reported_ids(self) -> set[int]:
        return {i for i, state in enumerate(self._state) if state != UNSEEN}

    def done(self) -> int:
        return len(self.processed) + len(self.failed)

    def lose(self, frame_id: int, name: str, stage: str, worker: str | None, reason: str) -> None:
        self.failed[frame_id] = {"id": frame_id, "name": name, "stage": stage, "worker": worker, "reason": reason,
                                 "kind": "lost"}

    def cancel(self, frame_id: int, name: str) -> None:
        self.cancelled[frame_id] = {"id": frame_id, "name": name}

    def frames(self) -> list[dict]:
        return self.processed.dicts()


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
        """A worker's death, or the collector's (a restarted collector is told of its own, for
        the report); a notice heard twice (given at start, then broadcast) counts once."""
        name = notice["name"]
        if name not in self.names and name != sink_role() or any(
                r["name"] == name and r["incarnation"] == notice["incarnation"] for r in self.restarts):
            return
        self.restarts.append({k: notice.get(k) for k in ("name", "incarnation", "signal", "exit_code", "reason",
                                                         "t_s", "final")})
        if name == sink_role():
            return
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
    readers = sorted(n for n in expected.names if n.startswith(f"{source_role()}-"))
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
    reported = ledger.reported_ids()
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
