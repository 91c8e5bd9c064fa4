"""The measured window of a run and its steady state.

Which frames count: those with id >= warmup that are not ``cold`` (a cold frame's forward was the
first of its input shape in its inference process: slow one-off oneDNN/cuDNN set-up). The window
opens when the start-up transient is over: at the last completion among the warm-up frames and
the frames of each inference process's first forward, when that forward was cold. A cold frame
later in the run (a new input shape, a restarted process) is left out of the counts but does not
move the window. The window closes at the last completion.

Steady state: the window is cut into ``THROUGHPUT_WINDOW_S`` slices, aligned to its end (the
leftover at the start, nearest the warm-up, is dropped); the run is ``stable`` when the fps of
the last ``STABLE_WINDOWS`` slices are within ``STABILITY_TOLERANCE`` of each other (max / min,
as Triton's perf_analyzer judges its measurements with its stability percentage)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from analysis.stats import fps
from topology.stages import done_time

THROUGHPUT_WINDOW_S = 2.0
STABLE_WINDOWS = 3
STABILITY_TOLERANCE = 0.10  # the last windows' max fps / min fps at most 1.10


@dataclass(frozen=True)
class MeasuredWindow:
    """[start_s, end_s] on the frames' clock; ``measured`` frames counted for fps and latency
    completed inside it, out of ``completed`` frames in all."""

    start_s: float
    end_s: float
    measured: int
    completed: int

    @property
    def seconds(self) -> float:
        return max(self.end_s - self.start_s, 0.0)

    @property
    def fps(self) -> float | None:
        return fps(self.measured, self.start_s, self.end_s)

    def holds(self, t_s: float) -> bool:
        return self.start_s < t_s <= self.end_s


def is_measured(frame: dict, warmup: int) -> bool:
    """Counted in fps and latency: past the warm-up ids and not a cold forward."""
    return frame["id"] >= warmup and not frame.get("cold", False)


def start_up_frames(frames: Sequence[dict], warmup: int) -> list[dict]:
    """The warm-up frames, and the frames of each inference process's first forward when cold."""
    first_forward: dict[str | None, float] = {}
    for f in frames:
        worker = f.get("workers", {}).get("infer")
        first_forward[worker] = min(first_forward.get(worker, math.inf), f["t"]["infer_start"])
    return [f for f in frames if f["id"] < warmup or
            (f.get("cold", False) and f["t"]["infer_start"] == first_forward[f.get("workers", {}).get("infer")])]


def measured_window(frames: Sequence[dict], warmup: int, started_s: float) -> MeasuredWindow:
    """The window (see the module's docstring); ``started_s`` opens it when there is no start-up
    frame. Frames carry ``id``, ``t["infer_start"]``, the last stage's end (``t["post_end"]``) and may carry ``cold``."""
    if not frames:
        return MeasuredWindow(started_s, started_s, 0, 0)
    done = done_time()
    start = max((f["t"][done] for f in start_up_frames(frames, warmup)), default=started_s)
    end = max(f["t"][done] for f in frames)
    inside = [f for f in frames if start < f["t"][done] <= end]
    return MeasuredWindow(start, end, sum(1 for f in inside if is_measured(f, warmup)), len(inside))


def throughput_windows(ends_s: Sequence[float], window: MeasuredWindow,
                       width_s: float = THROUGHPUT_WINDOW_S) -> list[dict]:
    """fps in each whole ``width_s`` slice of ``window``, the slices aligned to its end; a frame
    completing at t belongs to the slice (lo, hi] holding t. ``ends_s``: the measured frames'
    completion times."""
    if width_s <= 0:
        raise ValueError(f"throughput window: expected a width > 0 s, got {width_s}")
    count = int(math.floor(window.seconds / width_s + 1e-9))
    ends = np.sort(np.asarray(ends_s, dtype=np.float64))
    slices = []
    for k in range(count, 0, -1):
        hi = window.end_s - (k - 1) * width_s
        lo = hi - width_s
        frames = int(np.searchsorted(ends, hi, side="right") - np.searchsorted(ends, lo, side="right"))
        slices.append({"start_s": lo, "end_s": hi, "frames": frames, "fps": frames / width_s})
    return slices


def stability(slices: Sequence[dict], window: MeasuredWindow, frames: int, warmup: int) -> dict:
    """{"stable", "reason", "tolerance", "spread"}: whether the last STABLE_WINDOWS slices' fps
    agree within STABILITY_TOLERANCE; ``reason`` says why not (None when stable). ``frames``
    (processed) and ``warmup`` only word the reason for a run without measured frames."""
    result = {"stable": False, "reason": None, "tolerance": STABILITY_TOLERANCE, "spread": None,
              "windows_needed": STABLE_WINDOWS, "slice_s": THROUGHPUT_WINDOW_S}
    if window.measured == 0:
        result["reason"] = (f"no measured frames: {frames} frames processed, warm-up {warmup}, "
                            "and cold forwards are excluded")
        return result
    if len(slices) < STABLE_WINDOWS:
        result["reason"] = (f"too short: the measured window of {window.seconds:.1f} s holds {len(slices)} whole "
                            f"{THROUGHPUT_WINDOW_S:g} s windows; {STABLE_WINDOWS} are needed to judge stability")
        return result
    last = [s["fps"] for s in slices[-STABLE_WINDOWS:]]
    if min(last) == 0:
        result["reason"] = f"a window among the last {STABLE_WINDOWS} completed no frame"
        return result
    spread = max(last) / min(last) - 1
    result["spread"] = spread
    result["stable"] = spread <= STABILITY_TOLERANCE + 1e-9  # 11 / 10 - 1 is 0.1000...09 in floats
    if not result["stable"]:
        result["reason"] = (f"the last {STABLE_WINDOWS} windows ran at {min(last):.1f} to {max(last):.1f} fps, "
                            f"{100 * spread:.0f} % apart (stable: within {100 * STABILITY_TOLERANCE:.0f} %)")
    return result
