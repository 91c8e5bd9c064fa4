"""Per-module timing: ``TimedModule``, a crawler that instruments a built model in place, a
``@timed`` decorator for plain functions; the pure aggregation into per-module statistics
lives in ``yolo.module_stats`` (no torch) and is re-exported here.

Every timed call is recorded with its nesting depth, so the time not covered by any outermost
timed call (residual adds, concatenations, other non-module work) becomes its own row and the
outermost rows plus that residual add up to the whole forward.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn

from yolo.module_stats import RESIDUAL_NAME, ModuleStats, aggregate, forward_stats

__all__ = ["RESIDUAL_NAME", "ModuleStats", "aggregate", "forward_stats", "TIMING_MODES", "ModuleInfo", "Recorder",
           "TimedModule", "timed", "select_modules", "Instrumentation", "instrument", "default_timing_mode"]

TIMING_MODES = ("cpu", "cuda-sync", "cuda-events")
EXTERNAL_MODES = ("openvino-counters",)  # forwards timed by an engine's own counters (``add_forward``)
MAX_SHAPES_PER_MODULE = 8

_active_recorder: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar(
    "yolo_active_recorder", default=None)


def default_timing_mode(device: torch.device | str) -> str:
    return "cuda-events" if torch.device(device).type == "cuda" else "cpu"


@dataclass
class ModuleInfo:
    name: str
    type: str
    params: int
    outermost: bool = True  # False once the name has been seen inside another timed call
    in_forward: bool = True  # False for functions timed outside any model forward


def _shape_of(args: Sequence[Any]) -> str:
    if not args:
        return "()"
    x = args[0]
    if isinstance(x, torch.Tensor):
        return "x".join(map(str, x.shape))
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_shape_of((t,)) for t in x) + "]"
    return type(x).__name__


class Recorder:
    """Collects the times of timed calls, forward by forward.

    Modes: ``cpu`` (perf_counter), ``cuda-sync`` (synchronise around each call: exact, slow),
    ``cuda-events`` (events around each call, read once per forward). The first
    ``warmup_forwards`` forwards, and any run while ``measuring`` is False, are discarded.
    """

    def __init__(self, mode: str = "cpu", warmup_forwards: int = 0, keep_span_forwards: int = 0):
        if mode not in TIMING_MODES + EXTERNAL_MODES:
            raise ValueError(f"timing mode: expected one of {TIMING_MODES + EXTERNAL_MODES}, got {mode!r}")
        if mode.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"timing mode {mode!r} needs CUDA, which is not available")
        if warmup_forwards < 0:
            raise ValueError(f"warmup_forwards: expected >= 0, got {warmup_forwards}")
        self.mode = mode
        self.warmup_forwards = warmup_forwards
        self.keep_span_forwards = keep_span_forwards
        self.measuring = True
        self.infos: dict[str, ModuleInfo] = {}
        self.times_ms: dict[str, list[float]] = {}
        self.shapes: dict[str, dict[str, int]] = {}
        self.forward_ms: list[float] = []
        self.residual_ms: list[float] = []  # per forward: time outside every outermost timed call
        self.spans: list[tuple[str, float, float, int]] = []  # (name, start_s, dur_ms, depth)
        self._forwards_seen = 0
        self._kept_forwards = 0  # forwards measured so far (the first keep_span_forwards keep their spans)
        self._depth = 0
        self._in_forward = False
        self._pending: list[tuple[str, Any, Any, int]] = []  # this forward's calls, not yet read
        self._forward_start: Any = None
        self._forward_wall_s = 0.0
        self._context_token = None
        self._events: list[Any] = []
        self._note_structure = True  # outside forwards, and in the first forward of each input shape
        self._input_shapes: set[str] = set()
        # The clock, chosen once: it runs twice per timed call.
        self._now: Callable[[], Any] = {"cpu": time.perf_counter, "cuda-sync": self._synced_now,
                                         "cuda-events": self._event_now}.get(mode, time.perf_counter)

    # -- registration -----------------------------------------------------------------------
    def register(self, name: str, type_name: str, params: int) -> None:
        self.infos.setdefault(name, ModuleInfo(name, type_name, params))

    # -- the clock ---------------------------------------------------------------------------
    @staticmethod
    def _synced_now() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    def _event_now(self) -> Any:
        event = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _elapsed_ms(self, start: Any, end: Any) -> float:
        if self.mode == "cuda-events":
            return start.elapsed_time(end)
        return (end - start) * 1e3

    # -- calls -------------------------------------------------------------------------------
    # The hot path: keep start/stop to a clock read and an append; shapes and nesting are noted
    # only in forwards whose input shape is new (they are fixed by the input shape).
    def start(self, name: str, args: Sequence[Any] = ()) -> tuple[str, Any, int]:
        if self._note_structure or not self._in_forward:
            self._note_shape(name, args)
        depth = self._depth
        self._depth = depth + 1
        return name, self._now(), depth

    def stop(self, token: tuple[str, Any, int]) -> None:
        name, start, depth = token
        end = self._now()
        self._depth -= 1
        if self._in_forward:
            self._pending.append((name, start, end, depth))
            return
        info = self.infos[name]
        if depth > 0:
            info.outermost = False
        info.in_forward = False
        if self.measuring:
            if self.mode == "cuda-events":
                end.synchronize()
            self.times_ms.setdefault(name, []).append(self._elapsed_ms(start, end))
            if self.mode == "cuda-events":
                self._events.extend((start, end))

    def _note_shape(self, name: str, args: Sequence[Any]) -> None:
        if name not in self.infos:
            self.register(name, "function", 0)
        shapes = self.shapes.setdefault(name, {})
        if len(shapes) < MAX_SHAPES_PER_MODULE:
            key = _shape_of(args)
            shapes[key] = shapes.get(key, 0) + 1

    # -- forwards ----------------------------------------------------------------------------
    def begin_forward(self, args: Sequence[Any] = ()) -> None:
        shape = _shape_of(args)
        self._note_structure = shape not in self._input_shapes
        self._input_shapes.add(shape)
        self._in_forward = True
        self._pending = []
        self._forward_wall_s = time.perf_counter()
        self._forward_start = self._now()
        self._context_token = _active_recorder.set(self)

    def end_forward(self) -> None:
        end = self._now()
        if self._context_token is not None:
            _active_recorder.reset(self._context_token)
            self._context_token = None
        self._in_forward = False
        self._depth = 0
        self._forwards_seen += 1
        if self._note_structure:
            for name, _, _, depth in self._pending:
                if depth > 0:
                    self.infos[name].outermost = False
            self._note_structure = False
        if self.mode == "cuda-events":
            end.synchronize()  # the one wait per forward
        keep = self.measuring and self._forwards_seen > self.warmup_forwards
        if keep:
            self.forward_ms.append(self._elapsed_ms(self._forward_start, end))
            self._kept_forwards += 1
            keep_spans = self._kept_forwards <= self.keep_span_forwards
            covered = 0.0
            for name, start, stop, depth in self._pending:
                ms = self._elapsed_ms(start, stop)
                self.times_ms.setdefault(name, []).append(ms)
                if depth == 0:
                    covered += ms
                if keep_spans:
                    offset_ms = self._elapsed_ms(self._forward_start, start)
                    self.spans.append((name, self._forward_wall_s + offset_ms / 1e3, ms, depth))
            self.residual_ms.append(max(self.forward_ms[-1] - covered, 0.0))
            if keep_spans:
                self.spans.append(("forward", self._forward_wall_s, self.forward_ms[-1], -1))
        if self.mode == "cuda-events":
            self._events.extend(e for _, s, t, _ in self._pending for e in (s, t))
            self._events.extend((self._forward_start, end))
        self._pending = []

    def add_forward(self, forward_ms: float, times: dict[str, float], started_s: float) -> None:
        """A forward timed by another clock (an inference engine's own counters): its whole time
        and each registered name's; the residual is what no outermost name covers. Spans of the
        first kept forwards hold the forward alone (such counters give no start times)."""
        self._forwards_seen += 1
        if not (self.measuring and self._forwards_seen > self.warmup_forwards):
            return
        self.forward_ms.append(forward_ms)
        covered = 0.0
        for name, ms in times.items():
            self.times_ms.setdefault(name, []).append(ms)
            if self.infos[name].outermost:
                covered += ms
        self.residual_ms.append(max(forward_ms - covered, 0.0))
        self._kept_forwards += 1
        if self._kept_forwards <= self.keep_span_forwards:
            self.spans.append(("forward", started_s, forward_ms, -1))

    @contextlib.contextmanager
    def activate(self) -> Iterator["Recorder"]:
        """Time ``@timed`` functions called outside a model forward (e.g. NMS) into this recorder."""
        token = _active_recorder.set(self)
        try:
            yield self
        finally:
            _active_recorder.reset(token)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        previous, self.measuring = self.measuring, False
        try:
            yield
        finally:
            self.measuring = previous

    def take_times(self) -> tuple[dict[str, list[float]], list[float], list[float]]:
        """(per-name times, forward times, residual times) recorded since the last call, and
        forget them: a long-running caller folds them into compact summaries."""
        taken = (self.times_ms, self.forward_ms, self.residual_ms)
        self.times_ms, self.forward_ms, self.residual_ms = {}, [], []
        return taken

    def reset(self) -> None:
        self.times_ms.clear()
        self.shapes.clear()
        self.forward_ms.clear()
        self.residual_ms.clear()
        self.spans.clear()

    # -- results -----------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """Plain data (lists and arrays) that another process can merge with ``aggregate``."""
        return {
            "mode": self.mode,
            "forward_ms": np.asarray(self.forward_ms, dtype=np.float64),
            "residual_ms": np.asarray(self.residual_ms, dtype=np.float64),
            "modules": [
                {**asdict(info),
                 "shapes": self.shapes.get(name, {}),
                 "times_ms": np.asarray(self.times_ms.get(name, ()), dtype=np.float64)}
                for name, info in self.infos.items()
            ],
        }

    def summary(self) -> list[ModuleStats]:
        return aggregate([self.export()])


# -- modules -----------------------------------------------------------------------------------
class TimedModule(nn.Module):
    """Wraps any module; each call is recorded under the module's qualified name."""

    def __init__(self, module: nn.Module, name: str, recorder: Recorder):
        super().__init__()
        self.module = module
        self.qualified_name = name
        self.recorder = recorder
        recorder.register(name, type(module).__name__, sum(p.numel() for p in module.parameters()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        token = self.recorder.start(self.qualified_name, args)
        try:
            return self.module(*args, **kwargs)
        finally:
            self.recorder.stop(token)

    # Containers that their owner iterates or indexes (instead of calling) keep working.
    def __iter__(self):
        return iter(self.module)

    def __len__(self) -> int:
        return len(self.module)

    def __getitem__(self, index):
        return self.module[index]


def timed(name: str) -> Callable[[Callable], Callable]:
    """Decorator: time a plain function under ``name`` whenever a recorder is active (inside an
    instrumented forward, or ``Recorder.activate()``); otherwise it costs one context lookup."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            recorder = _active_recorder.get()
            if recorder is None:
                return fn(*args, **kwargs)
            token = recorder.start(name, args)
            try:
                return fn(*args, **kwargs)
            finally:
                recorder.stop(token)

        return wrapper

    return decorate


# -- the crawler -------------------------------------------------------------------------------
_NEVER_CALLED = (nn.ModuleList, nn.ModuleDict)


def _module_depth(name: str) -> int:
    return name.count(".") + 1


def select_modules(model: nn.Module, *, types: Sequence[type] | None = None, depth: int | None = None,
                   leaves: bool = False) -> list[str]:
    """Qualified names of the modules to time: those of ``types``, at ``depth`` in the hierarchy
    (``model.4`` is depth 2), or leaves; a module matching any criterion is selected."""
    if types is None and depth is None and not leaves:
        raise ValueError("expected at least one of types, depth or leaves to select modules, got none")
    if depth is not None and depth < 1:
        raise ValueError(f"depth: expected >= 1, got {depth}")
    chosen = []
    for name, module in model.named_modules():
        if not name or isinstance(module, _NEVER_CALLED):
            continue
        if isinstance(module, TimedModule):
            raise RuntimeError(f"model is already instrumented (found TimedModule at {name!r}); remove it first")
        is_leaf = next(module.children(), None) is None
        if (types is not None and isinstance(module, tuple(types))) or \
                (depth is not None and _module_depth(name) == depth) or (leaves and is_leaf):
            chosen.append(name)
    return chosen


class Instrumentation:
    """The handle ``instrument`` returns: the recorder, and ``remove()`` to restore the model."""

    def __init__(self, model: nn.Module, recorder: Recorder):
        self.model = model
        self.recorder = recorder
        self._wrapped: list[tuple[nn.Module, str, nn.Module]] = []
        self._hooks: list[Any] = []

    def remove(self) -> nn.Module:
        for parent, attr, original in reversed(self._wrapped):
            setattr(parent, attr, original)
        for hook in self._hooks:
            hook.remove()
        self._wrapped.clear()
        self._hooks.clear()
        return self.model


def instrument(model: nn.Module, *, types: Sequence[type] | None = None, depth: int | None = None,
               leaves: bool = False, names: Sequence[str] | None = None, mode: str | None = None,
               warmup_forwards: int = 0, keep_span_forwards: int = 0) -> Instrumentation:
    """Wrap the selected submodules of ``model`` in ``TimedModule`` in place and time every
    forward of ``model``. Select by ``types``, ``depth``, ``leaves`` or explicit ``names``."""
    if mode is None:
        first = next(model.parameters(), None)
        mode = default_timing_mode(first.device if first is not None else "cpu")
    recorder = Recorder(mode, warmup_forwards, keep_span_forwards)
    chosen = list(names) if names is not None else select_modules(model, types=types, depth=depth, leaves=leaves)
    modules = dict(model.named_modules())
    wrapped = next((n for n, m in modules.items() if isinstance(m, TimedModule)), None)
    if wrapped is not None:
        raise RuntimeError(f"model is already instrumented (found TimedModule at {wrapped!r}); remove it first")
    missing = [n for n in chosen if n not in modules]
    if missing:
        raise ValueError(f"expected module names of the model, got unknown {missing[0]!r}")
    handle = Instrumentation(model, recorder)
    # Resolve every (parent, attribute) on the untouched tree first, so nesting does not matter.
    targets = []
    for name in chosen:
        parent_name, _, attr = name.rpartition(".")
        targets.append((modules[parent_name], attr, modules[name], name))
    for parent, attr, module, name in targets:
        setattr(parent, attr, TimedModule(module, name, recorder))
        handle._wrapped.append((parent, attr, module))
    handle._hooks.append(model.register_forward_pre_hook(lambda m, a: recorder.begin_forward(a)))
    handle._hooks.append(model.register_forward_hook(lambda m, a, o: recorder.end_forward(), always_call=True))
    return handle
