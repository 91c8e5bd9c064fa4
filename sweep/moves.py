"""The moves of the tuning sweep (see sweep.search): from the best settings so far and the
analysis of its latest trial, the changes worth a trial, best first."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from analysis.machine import Machine
from backends.registry import DEFAULT_BACKEND, sweep_alternatives
from settings.config import flag_of
from sweep.measurement import Measurement
from topology.stages import frame_roles, title

IDLE_UTILISATION = 0.50  # a stage busy less than this is idle enough to lose a worker
CORES_SATURATED = 0.90  # as analysis.bottleneck: from here more processes only time-slice the cores
MAX_BATCH_CPU = 16
MAX_BATCH_CUDA = 64
MAX_INFER_WORKERS_PER_GPU = 4

SWEPT = ("pre_workers", "infer_workers", "post_workers", "infer_threads", "batch_size", "half", "backend", "data_path")
SHORT_NAMES = {"pre_workers": "pre", "infer_workers": "infer", "post_workers": "post", "infer_threads": "threads",
               "batch_size": "batch", "half": "half", "backend": "backend", "data_path": "data path"}


@dataclass(frozen=True, order=True)
class Settings:
    """The values one trial runs with; the rest of the configuration is the same in every trial."""

    pre_workers: int
    infer_workers: int
    post_workers: int
    infer_threads: int
    batch_size: int
    half: bool = False  # fp16 on CUDA, bf16 on a CPU that computes it natively
    backend: str = DEFAULT_BACKEND  # or another of backends.registry
    data_path: str = "auto"  # host or device; auto: the device's default (device on CUDA)

    @classmethod
    def of(cls, cfg) -> Settings:
        """From a resolved RunConfig (automatic counts already filled in)."""
        return cls(**{name: getattr(cfg, name) for name in SWEPT})

    def as_dict(self) -> dict[str, int | bool | str]:
        return dataclasses.asdict(self)

    def flags(self) -> list[str]:
        return [token for name in SWEPT if name not in ("half", "data_path")
                for token in (flag_of(name), str(getattr(self, name)))] \
            + ([flag_of("data_path"), self.data_path] if self.data_path != "auto" else []) \
            + ([flag_of("half")] if self.half else [])  # last: a bare switch

    def label(self) -> str:
        """"2/2x1/2 b1": pre / infer workers x threads / post, batch size; " openvino" on a backend
        other than the default; " half" with --half; " device path" with --data-path device."""
        return (f"{self.pre_workers}/{self.infer_workers}x{self.infer_threads}/{self.post_workers} "
                f"b{self.batch_size}" + ("" if self.backend == DEFAULT_BACKEND else f" {self.backend}")
                + (" half" if self.half else "") + (" device path" if self.data_path == "device" else ""))

    def change_from(self, other: Settings) -> str:
        """What differs from ``other``: "batch 1->2, pre 2->1", "+half"; "" when nothing does."""
        def one(n: str) -> str:
            if n == "half":
                return "+half" if self.half else "-half"
            return f"{SHORT_NAMES[n]} {getattr(other, n)}->{getattr(self, n)}"
        return ", ".join(one(n) for n in SWEPT if getattr(self, n) != getattr(other, n))


@dataclass(frozen=True)
class Move:
    """One step from the incumbent: ``key`` is (setting, +1 grow / -1 shrink)."""

    key: tuple[str, int]
    settings: Settings
    reason: str


def _stage_name(role: str) -> str:
    return title(role)


def _util(m: Measurement, role: str) -> float:
    return m.utilisation.get(role, 0.0)


def _move(s: Settings, name: str, direction: int, reason: str) -> Move:
    value = getattr(s, name)
    new = value * 2 if name == "batch_size" and direction > 0 else \
        max(1, value // 2) if name == "batch_size" else value + direction
    return Move((name, direction), dataclasses.replace(s, **{name: new}), reason)


def _grow_limits(s: Settings, name: str, machine: Machine) -> bool:
    """Whether growing ``name`` stays within the machine: no more inference threads than cores on
    CPU, at most two processes per core for pre/post, bounded batches and GPU processes."""
    if name in ("pre_workers", "post_workers"):
        return getattr(s, name) + 1 <= 2 * machine.cores
    if name == "infer_workers":
        if machine.on_cuda:
            return s.infer_workers + 1 <= MAX_INFER_WORKERS_PER_GPU * machine.gpus
        return (s.infer_workers + 1) * s.infer_threads <= machine.cores
    if name == "infer_threads":
        return s.infer_workers * (s.infer_threads + 1) <= machine.cores
    if name == "batch_size":
        return s.batch_size * 2 <= (MAX_BATCH_CUDA if machine.on_cuda else MAX_BATCH_CPU)
    raise ValueError(f"sweep: expected one of {SWEPT}, got {name!r}")


def _grow(s: Settings, name: str, machine: Machine, reason: str) -> Move | None:
    return _move(s, name, +1, reason) if _grow_limits(s, name, machine) else None


def _shrink(s: Settings, name: str, reason: str) -> Move | None:
    return _move(s, name, -1, reason) if getattr(s, name) > 1 else None


def _half(s: Settings, machine: Machine, why: str) -> Move | None:
    """--half where it is native: fp16 on a GPU, bf16 on a CPU that has it (never emulated)."""
    if s.half or not (machine.on_cuda or machine.bf16):
        return None
    what = "fp16 forwards" if machine.on_cuda else "bf16 forwards, native on this CPU"
    return Move(("half", +1), dataclasses.replace(s, half=True),
                f"{why}: {what}, less inference time per frame (detections change slightly)")


def _backends(s: Settings, machine: Machine, ready: Collection[str], why: str) -> list[Move | None]:
    """--backend NAME from the default backend, for each backend the sweep tries (its spec's
    ``sweep`` says why) that runs on this device type and is ``ready`` here (installed, and
    what it prepares once, such as OpenVINO's converted model, already there)."""
    if s.backend != DEFAULT_BACKEND:
        return []
    return [Move(("backend", +1), dataclasses.replace(s, backend=spec.name), f"{why}: {spec.sweep}")
            for spec in sweep_alternatives("cuda" if machine.on_cuda else "cpu") if spec.name in ready]


def _other_data_path(s: Settings, machine: Machine, why: str) -> Move | None:
    """On a GPU, the other data path (on a CPU the device path only adds work: never tried)."""
    if not machine.on_cuda:
        return None
    to_device = s.data_path == "host"
    reason = ("the GPU decodes, letterboxes, draws and encodes: far less CPU per frame" if to_device else
              "the host's cores decode and encode: less work queued on the GPU")
    return Move(("data_path", +1 if to_device else -1),
                dataclasses.replace(s, data_path="device" if to_device else "host"), f"{why}: {reason}")


def _worker_field(role: str) -> str:
    return f"{role}_workers"


def saturated_moves(s: Settings, m: Measurement, machine: Machine, backends: Collection[str] = ()
                    ) -> list[Move | None]:
    """The cores are the limit: less CPU per frame, never more processes or threads."""
    moves: list[Move | None] = []
    for role in frame_roles():
        count = s.infer_workers * s.infer_threads if role == "infer" and not machine.on_cuda else getattr(
            s, _worker_field(role))
        if count > machine.cores:
            moves.append(_shrink(s, _worker_field(role), f"cores saturated and {count} {_stage_name(role)} "
                                                         f"processes/threads on {machine.cores} cores"))
    if s.data_path == "host":
        moves.append(_other_data_path(s, machine, "cores saturated"))
    moves += _backends(s, machine, backends, "cores saturated")
    moves.append(_half(s, machine, "cores saturated"))
    moves.append(_grow(s, "batch_size", machine, "cores saturated: fewer forwards and messages per frame"))
    idle = sorted((r for r in frame_roles() if r != m.bottleneck and _util(m, r) < IDLE_UTILISATION), key=lambda r: _util(m, r))
    for role in idle:
        moves.append(_shrink(s, _worker_field(role), f"cores saturated and {_stage_name(role)} busy only "
                                                     f"{100 * _util(m, role):.0f} %: one process fewer to share them"))
    if not machine.on_cuda and s.infer_workers > 1 and (s.infer_workers - 1) * (s.infer_threads + 1) <= min(
            s.infer_workers * s.infer_threads, machine.cores):
        trade = dataclasses.replace(s, infer_workers=s.infer_workers - 1, infer_threads=s.infer_threads + 1)
        moves.append(Move(("infer_threads", +1), trade, "cores saturated: one inference process fewer, "
                                                        "one torch thread more each (same threads in all)"))
    return moves


def stage_moves(s: Settings, m: Measurement, machine: Machine, backends: Collection[str] = ()
                ) -> list[Move | None]:
    """One stage is the limit and cores are to spare: grow that stage."""
    role = m.bottleneck
    why = f"{_stage_name(role)} busy {100 * _util(m, role):.0f} % with cores to spare"
    if role != "infer":
        return [_other_data_path(s, machine, why) if s.data_path == "host" else None,
                _grow(s, _worker_field(role), machine, why)]
    if machine.on_cuda:
        return [_grow(s, "batch_size", machine, why + ": fuller GPU forwards"), _half(s, machine, why),
                _grow(s, "infer_workers", machine, why),
                _other_data_path(s, machine, why) if s.data_path != "host" else None]
    return [_grow(s, "infer_workers", machine, why), *_backends(s, machine, backends, why), _half(s, machine, why),
            _grow(s, "infer_threads", machine, why),
            _grow(s, "batch_size", machine, why + ": fewer forwards per frame")]


def flow_moves(s: Settings, m: Measurement, machine: Machine) -> list[Move | None]:
    """No stage is busy: more in flight from the busiest stage, or batches that fill sooner."""
    moves = [_shrink(s, "batch_size", "no stage busy: a smaller batch fills sooner")] if s.batch_size > 1 else []
    if m.bottleneck:
        moves.append(_grow(s, _worker_field(m.bottleneck), machine,
                           f"no stage busy; {_stage_name(m.bottleneck)} the busiest "
                           f"({100 * _util(m, m.bottleneck):.0f} %)"))
    return moves


def propose(incumbent: Settings, analysis: Measurement, machine: Machine,
            repeat: tuple[str, int] | None = None, backends: Collection[str] = ()) -> list[Move]:
    """The moves worth a trial from ``incumbent``, best first, as its latest trial's analysis
    (``analysis``) names them; a move with key ``repeat`` (the last one that paid) goes first
    when the analysis still names it. ``backends``: the backends other than the default that a
    trial may use here (see ``backends.registry.ready_for_sweep``)."""
    saturated = analysis.limit == "cores" or (analysis.cpu_saturation or 0.0) >= CORES_SATURATED
    if analysis.bottleneck is None or analysis.limit in ("unmeasured", "source"):  # nothing here to move
        return []
    if saturated:
        moves = saturated_moves(incumbent, analysis, machine, backends)
    elif analysis.limit == "stage":
        moves = stage_moves(incumbent, analysis, machine, backends)
    else:
        moves = flow_moves(incumbent, analysis, machine)
    unique: dict[Settings, Move] = {}
    for move in moves:
        if move is not None and move.settings != incumbent and move.settings not in unique:
            unique[move.settings] = move
    ordered = list(unique.values())
    return sorted(ordered, key=lambda mv: mv.key != repeat)  # stable: the analysis's order otherwise


