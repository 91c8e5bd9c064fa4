"""Per worker and per stage figures from the workers' own summaries: wall and CPU ms per frame,
how their time split between frame work, waiting for input and blocked on output, and the
stage's capacity (the fps its workers could reach on their own)."""

from __future__ import annotations

from analysis.samples import as_samples, pooled
from analysis.stats import ratio, utilisation


WORKER_FIELDS = ("name", "incarnation", "pid", "device", "threads", "precision", "frames", "batches", "wall_s",
                 "busy_s", "busy_cpu_s", "cpu_s", "wait_in_s", "blocked_out_s", "bytes_in", "bytes_out",
                 "messages_in", "messages_out", "link", "torch_loaded", "slots",
                 "inline_arrays", "cold_forwards", "cold_forward_s", "backend", "device_usage")


def runs_in_parallel(worker: dict) -> bool:
    """More than one thread does a frame's work: its CPU time (every thread's) exceeds its time."""
    threads = worker.get("threads") or {}
    return any((threads.get(kind) or 1) > 1 for kind in ("torch", "opencv"))


def worker_report(w: dict, usage: dict | None = None) -> dict:
    """One process's row: its counters, wall and CPU ms per frame, utilisation by wall and by
    CPU, sub-stage times, and (from the resource samples, ``usage``) its memory and CPU %."""
    frames = w.get("frames", 0)
    busy_cpu_s = w.get("busy_cpu_s")
    usage = usage or {}
    row = {**{k: w.get(k) for k in WORKER_FIELDS}, "incarnation": w.get("incarnation", 0),
            "batches": w.get("batches", 0),
            "ms_per_frame": as_samples(w.get("frame_ms")).summary(),
            "cpu_ms_per_frame": as_samples(w.get("frame_cpu_ms")).summary(),
            "busy_cpu_ms_per_frame": ratio(None if busy_cpu_s is None else 1e3 * busy_cpu_s, frames),
            "utilisation": utilisation(w["busy_s"], w["wall_s"]),
            "cpu_utilisation": None if busy_cpu_s is None else utilisation(busy_cpu_s, w["wall_s"]),
            "process_cpu_utilisation": None if w.get("cpu_s") is None else utilisation(w["cpu_s"], w["wall_s"]),
            "substages_ms": {k: as_samples(v).summary() for k, v in (w.get("substages_ms") or {}).items()},
            "dropped_messages": dict(w.get("dropped_messages") or {}),
            "peak_rss_bytes": usage.get("peak_rss_bytes"), "peak_pss_bytes": usage.get("peak_pss_bytes"),
            "cpu_percent_mean": usage.get("cpu_percent_mean")}
    row["cpu_ms_mean"] = cpu_ms_mean(row)
    return row


def stage_report(members: list[dict], usage: dict[str, dict]) -> dict:
    """The workers of one role together (every incarnation of a restarted worker included;
    ``workers`` counts distinct names). Utilisations are sums over sums; ms per frame pools
    every worker's samples. ``capacity`` is what ``stage_capacity`` finds."""
    wall = sum(w["wall_s"] for w in members)
    busy = sum(w["busy_s"] for w in members)
    busy_cpu = _sum_known(w.get("busy_cpu_s") for w in members)  # None from workers that send no CPU time
    frames = sum(w.get("frames", 0) for w in members)
    wall_ms = pooled(w.get("frame_ms") for w in members)
    cpu_ms = pooled(w.get("frame_cpu_ms") for w in members)
    substages = {}
    for w in members:
        for name, series in (w.get("substages_ms") or {}).items():
            substages.setdefault(name, []).append(series)
    report = {"workers": len({w["name"] for w in members}), "processes": len(members), "frames": frames,
              "busy_s": busy, "busy_cpu_s": busy_cpu, "cpu_s": sum(w.get("cpu_s") or 0.0 for w in members),
              "wall_s": wall, "wait_in_s": sum(w["wait_in_s"] for w in members),
              "blocked_out_s": sum(w["blocked_out_s"] for w in members),
              "cold_forwards": sum(w.get("cold_forwards") or 0 for w in members),
              "cold_forward_s": sum(w.get("cold_forward_s") or 0.0 for w in members),
              "ms_per_frame": wall_ms.summary(), "cpu_ms_per_frame": cpu_ms.summary(),
              "busy_cpu_ms_per_frame": ratio(1e3 * busy_cpu, frames) if busy_cpu else None,
              "utilisation": utilisation(busy, wall),
              "cpu_utilisation": None if busy_cpu is None else utilisation(busy_cpu, wall),
              "wait_fraction": utilisation(sum(w["wait_in_s"] for w in members), wall),
              "blocked_fraction": utilisation(sum(w["blocked_out_s"] for w in members), wall),
              "substages_ms": {name: pooled(series).summary() for name, series in substages.items()},
              "substages_total_ms": {name: pooled(series).sum for name, series in substages.items()},
              "peak_pss_bytes": _sum_known(usage.get(w["name"], {}).get("peak_pss_bytes") for w in members),
              "per_worker": [worker_report(w, usage.get(w["name"])) for w in members]}
    report["cpu_ms_mean"] = cpu_ms_mean(report)
    report["capacity"] = stage_capacity(members, report)
    return report


def cpu_ms_mean(row: dict) -> float | None:
    """Mean CPU ms per frame of a worker or stage row: from the per-frame CPU samples, else from
    its busy CPU time over its frames; None without CPU time."""
    return row["cpu_ms_per_frame"]["mean"] if row["cpu_ms_per_frame"]["count"] else row["busy_cpu_ms_per_frame"]


def stage_capacity(members: list[dict], stage: dict) -> dict:
    """{"fps", "ms_per_frame", "basis"}: workers x 1000 / ms per frame. The ms are CPU ms where
    one thread does a CPU worker's work (what a core costs it, measured under this run's load),
    wall ms on a device or where several threads share the work (their CPU ms add up to more
    than the frame takes), and wall ms where no CPU time was sent. No frames: fps None."""
    on_device = any(str(w.get("device") or "cpu").startswith("cuda") for w in members)
    cpu_ms = stage["cpu_ms_mean"]
    if on_device or any(runs_in_parallel(w) for w in members) or not cpu_ms:
        basis, ms = "wall", stage["ms_per_frame"]["mean"] if stage["ms_per_frame"]["count"] else \
            ratio(1e3 * stage["busy_s"], stage["frames"])
    else:
        basis, ms = "cpu", cpu_ms
    return {"fps": ratio(1e3 * stage["workers"], ms), "ms_per_frame": ms, "basis": basis}


def _sum_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def device_usage(workers: list[dict]) -> list[dict]:
    """Per GPU, from its inference workers' own figures: ``busy``, the share of the run its
    measured batches took (launch to results on the host, summed over the workers on it: an upper
    bound of the device's busy time), and the peak device memory of the busiest worker and of
    them all. Empty on a CPU."""
    by_device: dict[str, list[dict]] = {}
    for w in workers:
        usage = w.get("device_usage")
        if usage:
            by_device.setdefault(usage["device"], []).append({**usage, "wall_s": w.get("wall_s") or 0.0})
    out = []
    for device, used in sorted(by_device.items()):
        wall = max(u["wall_s"] for u in used)
        out.append({"device": device, "workers": len(used),
                    "busy": min(1.0, sum(u["busy_s"] for u in used) / wall) if wall else None,
                    "memory_peak_bytes": sum(u["memory_peak_bytes"] for u in used),
                    "memory_reserved_peak_bytes": sum(u["memory_reserved_peak_bytes"] for u in used),
                    "memory_total_bytes": used[0]["memory_total_bytes"]})
    return out
