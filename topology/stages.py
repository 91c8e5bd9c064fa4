"""The stage table: every kind of pipeline process, in the order a frame passes through them.

It is the one place that knows the stages. The supervisor starts processes from it (module, torch
or not, how many, on which device), the endpoints and the peer names every stage connects to are
made from it, a frame's slot is given back by the last stage that reads it (:func:`release_by`),
the collector's ledger and journal keep one worker name and the timestamps of each stage it
lists, and the reports, the trace and the sweep make one row per stage from it.

Frames flow one way through the *frame stages* (a pool of processes each) in the table's order:
each takes frames from the one before it over a credit link, and the last one sends its results
to the *sink*, the collector. A new stage is one :func:`register_stage` call (from a plugin
module, see topology.plugins) plus the module whose ``run(args)`` its processes run; the table is
read through functions, never copied at import, so a stage registered later is seen everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

RUNNER_ENDPOINTS = ("control", "progress", "health")  # bound by the runner itself

# What a stage reads of a frame's shared-memory slot: the letterboxed pixels, the original when the
# frame's annotated image is saved, or the original of a saved video frame (drawn in order).
LETTERBOXED, ORIGINAL, VIDEO_ORIGINAL = "letterboxed", "original", "video original"


@dataclass(frozen=True)
class StageKind:
    role: str  # "pre": the prefix of its processes' names (pre-0, pre-1, ...)
    title: str  # "preprocess": how reports name it
    module: str  # the module whose run(args) a process of this kind runs
    uses_torch: bool  # forked from the fork server that imported torch once, instead of spawned fresh
    count: str | int = 1  # how many processes: a RunConfig field's name, or a fixed number
    pool: bool = True  # a pool of frame workers (pre-0, pre-1, ...); False: the one sink, named by its role
    binds: tuple[str, ...] = ("",)  # the sockets each process binds, as suffixes of its name ("" = its name)
    times: tuple[str, ...] = ()  # the timestamps its processes put on a frame, in order (default role_start, role_end)
    span: tuple[str, str] | None = None  # its own part of a frame's latency (default: first to last of times)
    does: str = ""  # what its span of a frame is called in the trace (default: its title)
    reads: tuple[str, ...] = ()  # what it reads of a frame's slot (LETTERBOXED, ORIGINAL, VIDEO_ORIGINAL)
    on_device: bool = False  # runs on the run's devices, with --infer-threads torch threads
    restarts_resend: bool = True  # a restarted process's senders send again what it held

    def names(self, count: int) -> list[str]:
        """Its processes' names: ``pre-0`` ... for a pool, the role itself for the sink."""
        return [f"{self.role}-{i}" for i in range(count)] if self.pool else [self.role]

    @property
    def frame_times(self) -> tuple[str, ...]:
        return self.times or (f"{self.role}_start", f"{self.role}_end")

    @property
    def latency_span(self) -> tuple[str, str]:
        return self.span or (self.frame_times[0], self.frame_times[-1])

    def count_in(self, cfg) -> int:
        return getattr(cfg, self.count) if isinstance(self.count, str) else self.count


_STAGES: list[StageKind] = [
    StageKind("pre", "preprocess", "workers.preprocess", uses_torch=False, count="pre_workers",
              binds=("", "-returns"),  # frames out; shared-memory slots handed back
              times=("read_start", "read_end", "pre_end"), does="read+letterbox"),
    StageKind("infer", "inference", "workers.inference", uses_torch=True, count="infer_workers",
              times=("infer_recv", "infer_start", "infer_end"), span=("infer_start", "infer_end"),
              reads=(LETTERBOXED,), on_device=True, does="infer"),
    StageKind("post", "postprocess", "workers.postprocess", uses_torch=True, count="post_workers",
              times=("post_start", "post_end"), reads=(ORIGINAL,), does="nms+draw+save"),
    StageKind("collector", "collector", "collector.collector", uses_torch=False, pool=False,
              reads=(VIDEO_ORIGINAL,)),
]


def register_stage(kind: StageKind, after: str) -> None:
    """Put a frame stage into the flow right after the stage ``after`` (idempotent: a plugin
    imported twice registers once). Its processes get frames from ``after``'s and send them on
    to the next stage, or, last of all, their results to the collector."""
    if not kind.pool:
        raise ValueError(f"expected a pool stage (the collector is the one sink), got {kind.role!r}")
    if any(k.role == kind.role for k in _STAGES):
        if kind_of(kind.role) == kind:
            return
        raise ValueError(f"stage {kind.role!r} is registered already")
    if after not in frame_roles():
        raise ValueError(f"expected a frame stage to put {kind.role!r} after, one of {frame_roles()}, got {after!r}")
    _STAGES.insert([k.role for k in _STAGES].index(after) + 1, kind)
    release_by.cache_clear()


def stages() -> tuple[StageKind, ...]:
    return tuple(_STAGES)


def kind_of(role: str) -> StageKind:
    return next(k for k in _STAGES if k.role == role)


def frame_roles() -> tuple[str, ...]:
    """The stages that work on frames (a pool each), in the order a frame passes them."""
    return tuple(k.role for k in _STAGES if k.pool)


def sink_role() -> str:
    return next(k.role for k in _STAGES if not k.pool)


def source_role() -> str:
    """The first frame stage: its workers read the source, each a share of it."""
    return frame_roles()[0]


def last_frame_role() -> str:
    return frame_roles()[-1]


def producer_of(role: str) -> str | None:
    """The stage ``role`` takes frames (the sink: results) from; None for the source stage."""
    roles = frame_roles()
    if role == sink_role():
        return roles[-1]
    index = roles.index(role)
    return roles[index - 1] if index else None


def next_role(role: str) -> str | None:
    """The frame stage after ``role``; None for the last one, which sends to the collector."""
    roles = frame_roles()
    index = roles.index(role)
    return roles[index + 1] if index + 1 < len(roles) else None


def title(role: str) -> str:
    """How reports name a role ("other": the processes that are no stage's worker); an unknown
    role (a run recorded with a plugin stage, read without it) by its own name."""
    if role == "other":
        return "runner and collector"
    return next((k.title for k in _STAGES if k.role == role), role)


def frame_times() -> tuple[str, ...]:
    """Every timestamp a processed frame carries, stage by stage (the ledger's columns)."""
    return tuple(t for k in _STAGES if k.pool for t in k.frame_times)


def done_time() -> str:
    """The timestamp a frame is done at: the last frame stage's end (a frame's latency ends there)."""
    return frame_times()[-1]


def trace_spans() -> list[tuple[str, str, str, str]]:
    """(role, what the span is called, start, end) of each frame stage's span of a frame."""
    return [(k.role, k.does or k.title, *k.latency_span) for k in _STAGES if k.pool]


def latency_intervals() -> dict[str, tuple[str, str]]:
    """Each stage's part of a frame's latency and the queue before the next stage, in order:
    ``{"pre": (read_start, pre_end), "queue_pre_infer": (pre_end, infer_start), ...}``."""
    intervals: dict[str, tuple[str, str]] = {}
    kinds = [k for k in _STAGES if k.pool]
    for kind, following in zip(kinds, kinds[1:] + [None]):
        intervals[kind.role] = kind.latency_span
        if following is not None:
            intervals[f"queue_{kind.role}_{following.role}"] = (kind.latency_span[1], following.latency_span[0])
    return intervals


@functools.cache
def release_by(keep_image: bool, video: bool) -> str:
    """The stage that gives a frame's slot back: the last one that reads it (asked per frame:
    kept until the table changes)."""
    def reads(kind: StageKind) -> bool:
        return (LETTERBOXED in kind.reads or (keep_image and not video and ORIGINAL in kind.reads)
                or (keep_image and video and VIDEO_ORIGINAL in kind.reads))
    return [k.role for k in _STAGES if reads(k)][-1]


def role_of(name: str) -> str:
    """``infer-1`` -> ``infer``; the sink's name is its role."""
    return name if name == sink_role() else name.rsplit("-", 1)[0]


def index_of(name: str) -> int:
    """``infer-1`` -> 1; 0 for the sink."""
    return 0 if name == sink_role() else int(name.rsplit("-", 1)[1])


def stage_counts(cfg) -> dict[str, int]:
    """How many processes of each kind a (resolved) run configuration asks for."""
    return {kind.role: kind.count_in(cfg) for kind in _STAGES}


def process_names(counts: dict[str, int], role: str) -> list[str]:
    return kind_of(role).names(counts[role])


def worker_names(counts: dict[str, int]) -> list[str]:
    """Every process of the frame stages, in the order a frame passes them."""
    return [name for role in frame_roles() for name in process_names(counts, role)]


def consumers_of(counts: dict[str, int], role: str) -> list[str]:
    """The processes that take frames from ``role``'s processes (the collector's for the last stage)."""
    following = next_role(role) or sink_role()
    return process_names(counts, following)


def endpoint_names(counts: dict[str, int]) -> list[str]:
    """What each bound socket is called (an ipc socket file's name), stages first, then the runner's."""
    names = [name + suffix for kind in _STAGES for suffix in kind.binds for name in kind.names(counts[kind.role])]
    return names + list(RUNNER_ENDPOINTS)
