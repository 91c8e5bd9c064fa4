"""What every process of the run used, from the collector's samples: ``{process name: {"pid",
"role", "samples": [[t_s, cpu_s, rss_bytes, pss_bytes], ...]}}``, t_s on the frames' clock, cpu_s
the process's cumulative user + system CPU (all threads), pss_bytes None where unreadable.

A drop of cpu_s between two samples of one name means a new process took that name (a restart):
its CPU counts from zero on top of what the old one used. Between samples CPU is interpolated
linearly; before a process's first sample it is taken as that sample's value, after its last
as the last (an exited process uses no more)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

T, CPU, RSS, PSS = range(4)  # columns of a sample


def cumulative_cpu(samples: Sequence[Sequence]) -> tuple[np.ndarray, np.ndarray]:
    """(t_s, cpu_s) with restarts unwrapped, so cpu_s never decreases."""
    if not samples:
        return np.zeros(0), np.zeros(0)
    t = np.array([s[T] for s in samples], dtype=np.float64)
    cpu = np.array([s[CPU] for s in samples], dtype=np.float64)
    drops = np.diff(cpu, prepend=cpu[0]) < 0
    offsets = np.cumsum(np.where(drops, np.roll(cpu, 1), 0.0))
    return t, cpu + offsets


def cpu_between(samples: Sequence[Sequence], start_s: float, end_s: float) -> float:
    """CPU seconds the process used in [start_s, end_s], its cumulative CPU interpolated at both ends."""
    t, cpu = cumulative_cpu(samples)
    if t.size == 0 or end_s <= start_s:
        return 0.0
    at_start, at_end = np.interp([start_s, end_s], t, cpu)
    return float(at_end - at_start)


def _column(samples: Sequence[Sequence], column: int) -> np.ndarray:
    return np.array([s[column] for s in samples if s[column] is not None], dtype=np.float64)


def _peak(samples: np.ndarray, high_water: int | None) -> int | None:
    """The largest sample, or the kernel's high-water mark the process reported, if larger."""
    peaks = ([int(samples.max())] if samples.size else []) + ([int(high_water)] if high_water else [])
    return max(peaks) if peaks else None


def process_usage(entry: dict, start_s: float, end_s: float) -> dict:
    """One process: peak RSS (sampled, or its own high-water mark if larger) and mean RSS, peak
    and mean PSS, mean CPU % over its sampled life, and the CPU seconds it used in the window
    [start_s, end_s]."""
    samples = entry.get("samples", [])
    rss, pss = _column(samples, RSS), _column(samples, PSS)
    t, cpu = cumulative_cpu(samples)
    life_s = float(t[-1] - t[0]) if t.size > 1 else 0.0
    return {"pid": entry.get("pid"), "role": entry.get("role"), "samples": len(samples),
            "peak_rss_bytes": _peak(rss, entry.get("peak_rss_bytes")),
            "mean_rss_bytes": float(rss.mean()) if rss.size else None,
            "peak_pss_bytes": int(pss.max()) if pss.size else None,
            "mean_pss_bytes": float(pss.mean()) if pss.size else None,
            "cpu_percent_mean": 100 * float(cpu[-1] - cpu[0]) / life_s if life_s > 0 else None,
            "window_cpu_s": cpu_between(samples, start_s, end_s)}


def peak_pss_total(resources: dict) -> int | None:
    """The peak over time of the sum of every process's PSS: each process's PSS interpolated at
    every sample time of the run, 0 outside its own sampled life. None without any PSS."""
    series = []
    for entry in resources.values():
        points = [(s[T], s[PSS]) for s in entry.get("samples", []) if s[PSS] is not None]
        if points:
            series.append(np.array(points, dtype=np.float64))
    if not series:
        return None
    times = np.unique(np.concatenate([s[:, 0] for s in series]))
    total = sum(np.interp(times, s[:, 0], s[:, 1], left=0.0, right=0.0) for s in series)
    return int(total.max())


def resource_report(resources: dict, start_s: float, end_s: float, cores: int | None,
                    machine_cpu: Sequence[Sequence[float]] = ()) -> dict:
    """Per process usage, the run's peak total PSS, and the CPU every process used in the window
    with the share of the cores it had that is (``saturation``: 1 = every core it could use busy).

    On a shared machine other jobs use some of the cores: ``other_load_cores`` is the machine's
    busy time in the window that no process of the run used, divided by the window, and
    ``cores`` is what was left to the run (never less than what it used)."""
    processes = {name: process_usage(entry, start_s, end_s) for name, entry in sorted(resources.items())}
    window_cpu_s = sum(p["window_cpu_s"] for p in processes.values())
    window_s = end_s - start_s
    other_load = None
    available = cores
    if cores and window_s > 0 and len(machine_cpu) > 1 and processes:
        machine_s = cpu_between([[t, busy, None, None] for t, busy in machine_cpu], start_s, end_s)
        other_load = max(0.0, machine_s - window_cpu_s) / window_s
        available = max(cores - other_load, window_cpu_s / window_s)
    saturation = window_cpu_s / (available * window_s) if processes and available and window_s > 0 else None
    return {"processes": processes, "peak_pss_total_bytes": peak_pss_total(resources),
            "window_cpu_s": window_cpu_s if processes else None, "saturation": saturation, "cores": available,
            "machine_cores": cores, "other_load_cores": other_load}
