"""The stage table: every kind of pipeline process, in the order a frame passes through them.

The supervisor starts processes from it (module, torch or not, how many), the endpoints and the
peer names every stage connects to are made from it, and the report orders its rows by it. A new
stage is one entry here plus its module in workers/.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNNER_ENDPOINTS = ("control", "progress", "health")  # bound by the runner itself


@dataclass(frozen=True)
class StageKind:
    role: str  # "pre": the prefix of its processes' names (pre-0, pre-1, ...)
    title: str  # "preprocess": how reports name it
    module: str  # the module whose run(args) a process of this kind runs
    uses_torch: bool  # forked from the fork server that imported torch once, instead of spawned fresh
    count_field: str | None  # the config field that says how many; None: exactly one, named by its role
    binds: tuple[str, ...] = ("",)  # the sockets each process binds, as suffixes of its name ("" = its name)
    takes_from: str | None = None  # the role whose processes it takes frames from (connects to their sockets)

    def names(self, count: int) -> list[str]:
        """Its processes' names: ``pre-0`` ... for a pool, the role itself for a single process."""
        return [f"{self.role}-{i}" for i in range(count)] if self.count_field else [self.role]


STAGES = (
    StageKind("pre", "preprocess", "workers.preprocess", uses_torch=False, count_field="pre_workers",
              binds=("", "-returns")),  # frames out; shared-memory slots handed back
    StageKind("infer", "inference", "workers.inference", uses_torch=True, count_field="infer_workers",
              takes_from="pre"),
    StageKind("post", "postprocess", "workers.postprocess", uses_torch=True, count_field="post_workers", binds=(),
              takes_from="infer"),
    StageKind("collector", "collector", "collector.collector", uses_torch=False, count_field=None, takes_from="post"),
)
KINDS = {kind.role: kind for kind in STAGES}
ROLES = tuple(kind.role for kind in STAGES if kind.count_field)  # the stages that work on frames, in order
ROLE_NAMES = {**{kind.role: kind.title for kind in STAGES}, "other": "runner and collector"}


def role_of(name: str) -> str:
    """``infer-1`` -> ``infer``; a single process's name is its role."""
    return name if name in KINDS else name.rsplit("-", 1)[0]


def index_of(name: str) -> int:
    """``infer-1`` -> 1; 0 for a single process."""
    return 0 if name in KINDS else int(name.rsplit("-", 1)[1])


def stage_counts(cfg) -> dict[str, int]:
    """How many processes of each kind a (resolved) run configuration asks for."""
    return {kind.role: getattr(cfg, kind.count_field) if kind.count_field else 1 for kind in STAGES}


def process_names(counts: dict[str, int], role: str) -> list[str]:
    return KINDS[role].names(counts[role])


def worker_names(counts: dict[str, int]) -> list[str]:
    """Every process of the pools (pre, infer, post), in the order a frame passes them."""
    return [name for role in ROLES for name in process_names(counts, role)]


def consumers_of(counts: dict[str, int], role: str) -> list[str]:
    """The processes that take frames from ``role``'s processes."""
    return [name for kind in STAGES if kind.takes_from == role for name in kind.names(counts[kind.role])]


def endpoint_names(counts: dict[str, int]) -> list[str]:
    """What each bound socket is called (an ipc socket file's name), stages first, then the runner's."""
    names = [name + suffix for kind in STAGES for suffix in kind.binds for name in kind.names(counts[kind.role])]
    return names + list(RUNNER_ENDPOINTS)
