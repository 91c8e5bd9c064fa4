"""The run folder: report.json, report.md, modules.csv, trace.json, detections.json and the plots,
from what the collector gathered (``RunData``); and the one JSON summary object a script reads.

Every file is written whole or not at all (``analysis.atomic``); a file that cannot be written
(a full disk) is reported in the returned summary and the others are still tried, so the
summary can be printed whatever happened to the files. report.md links the plots that could be
drawn; on a full disk a link may point at a plot that could not be written."""

from __future__ import annotations

import csv
import io
import logging
import os
import time
from typing import Any, Callable

from analysis.atomic import write_bytes_atomic
from analysis.jsontext import json_safe, json_text  # noqa: F401 (the report's JSON, re-exported)
from analysis.bottleneck import diagnose, too_little_to_judge
from analysis.machine import Machine
from analysis.markdown import markdown
from analysis.printable import printable
from analysis.plots import render_plots
from analysis.resources import resource_report
from analysis.run_data import RunData
from analysis.samples import summarise_ms
from analysis.stages import device_usage, stage_report
from topology.stages import done_time, frame_roles, latency_intervals
from analysis.stats import ratio
from analysis.trace import process_label, trace_events
from analysis.windows import is_measured, measured_window, stability, throughput_windows
from backends.registry import DEFAULT_BACKEND, recorded_backend

__all__ = ["RunData", "build_report", "write_run_folder", "json_summary", "json_safe", "modules_csv"]

log = logging.getLogger(__name__)

LISTED_CANCELLED = 100  # cancelled frames named in report.json; every id is in cancelled_ids
MODULES_CSV_HEADER = ("name", "type", "params", "input_shape", "calls", "total_ms", "mean_ms", "p50_ms", "p95_ms",
                      "share", "outermost")


def write_run_folder(run_dir: str, run: RunData, shown_as: str = "") -> dict:
    """Write every report into ``run_dir`` (which exists) and return the summary (whose
    ``run_dir`` is ``shown_as`` where given: the URL the folder is uploaded to), with
    ``files``: {"written": [names], "failed": {name: error}}. The most useful files go first, so
    a nearly full disk keeps them: report.json, report.md, detections.json, modules.csv, the
    plots, and trace.json (the largest) last."""
    report = build_report(run)
    summary = report["summary"]
    summary["run_dir"] = shown_as or run_dir
    plots = render_plots(run, report)
    report["plots"] = list(plots)
    written: list[str] = []
    failed: dict[str, str] = {}
    files: list[tuple[str, Callable[[], bytes]]] = [
        ("report.json", lambda: json_text(report, indent=1).encode()),
        ("report.md", lambda: printable(markdown(report)).encode()),
        *((("detections.json", lambda: json_text(run.detections, indent=1).encode()),) if run.detections is not None
          else ()),
        *((("predictions.json", lambda: json_text(run.predictions).encode()),) if run.predictions is not None
          else ()),
        ("modules.csv", lambda: modules_csv(run.module_rows).encode()),
        *((name, lambda data=data: data) for name, data in plots.items()),
        ("trace.json", lambda: json_text(trace_events(run)).encode())]
    for name, render in files:
        try:
            write_bytes_atomic(os.path.join(run_dir, name), render())
            written.append(name)
        except OSError as exc:
            failed[name] = f"{exc.strerror or exc} ({exc.__class__.__name__})"
    if failed:
        log.error("could not write %s in %s: %s", ", ".join(failed), run_dir, next(iter(failed.values())))
    summary["files"] = {"written": written, "failed": failed}
    return summary


def json_summary(summary: dict, **extra: Any) -> dict:
    """The one JSON object a script or CI reads (``runner.py --json`` prints it on stdout): the
    summary (fps, latency, CPU per frame, bound, efficiency, bottleneck, hint, stability, frame
    counts, run folder, files written) plus ``extra`` fields such as the exit status."""
    return json_safe({**summary, **extra})


def machine_of(run: RunData) -> dict:
    """run.machine, completed from the environment and configuration where it is missing."""
    return Machine.from_dict(run.machine, cores=run.environment.get("cpu_cores"),
                             device=str(run.config.get("device") or "cpu")).as_dict()


def build_report(run: RunData) -> dict:
    """report.json's content, summary included."""
    for frame in run.frames:
        _check_timestamps(frame)
    machine = machine_of(run)
    window = measured_window(run.frames, run.warmup, run.started_s)
    measured = [f for f in run.frames if is_measured(f, run.warmup)]
    usage = resource_report(run.resources, window.start_s, window.end_s, machine["cores"], run.machine_cpu)
    stages = {role: stage_report([w for w in run.workers if w["role"] == role], usage["processes"])
              for role in frame_roles()}
    throughput = throughput_report(run, window)
    cpu = cpu_report(usage, stages, window, usage["cores"], throughput["fps"])
    cpu.update(machine_cores=machine["cores"], other_load_cores=usage["other_load_cores"])
    report = {
        "run_id": run.run_id, "config": run.config, "environment": run.environment, "machine": machine,
        "stop": {"reason": run.stop.get("reason", run.config.get("stopped")), "signal": run.stop.get("signal")},
        "outputs": {"images_saved": run.outputs.get("images_saved", sum(1 for f in run.frames if f.get("image_saved"))),
                    "image_error": run.outputs.get("image_error")},
        "frames": frames_report(run, len(measured)),
        "throughput": throughput,
        "latency_ms": interval_ms(measured, "read_start", done_time()),
        "frame_latency_ms": frame_latencies_ms(measured),
        "stage_latency_ms": {name: interval_ms(measured, t0, t1) for name, (t0, t1) in latency_intervals().items()},
        "stages": stages, "cpu": cpu, "inference": inference_of(stages, run.config, run.environment),
        "bottleneck": diagnose(stages, cpu, run.config, machine, measured=throughput["fps"] is not None,
                               live_source=bool(run.sources.get("streams")),
                               too_little=too_little_to_judge(throughput["measured_frames"], throughput["window_s"],
                                                              throughput["fps"])),
        "resources": usage, "restarts": [{**r, "at_s": r["t_s"] - run.started_s} for r in run.restarts],
        "dropped_messages": {process_label(w): w["dropped_messages"] for w in run.workers
                             if any((w.get("dropped_messages") or {}).values())},
        "sources": {"streams": run.sources.get("streams", []), "stream_errors": run.sources.get("stream_errors", []),
                    "dropped_at_source": run.sources.get("dropped_at_source", 0),
                    "videos": run.sources.get("videos", []), "skipped": run.sources.get("skipped", []),
                    "skipped_files": run.sources.get("skipped_files", 0)},
        "links": link_report(run.links), "forward": run.forward, "modules": run.module_rows,
    }
    report["bottleneck"]["efficiency"] = ratio(throughput["fps"], report["bottleneck"]["bound_fps"])
    report["summary"] = summary_of(report)
    return report


def _check_timestamps(frame: dict) -> None:
    used = sorted({key for span in latency_intervals().values() for key in span})
    missing = [k for k in used if k not in frame.get("t", {})]
    if missing:
        raise ValueError(f"report: expected frame {frame.get('id')} to carry timestamps {used}, "
                         f"got none for {missing}")


def interval_ms(frames: list[dict], start: str, end: str) -> dict:
    """summarise_ms of t[end] - t[start] over ``frames``, in milliseconds."""
    return summarise_ms([(f["t"][end] - f["t"][start]) * 1e3 for f in frames])


def frame_latencies_ms(measured: list[dict]) -> list[float]:
    """Each measured frame's latency (read to postprocess done, ms) in id order: runs merged
    later (a cluster's nodes) take percentiles over these, never averages of percentiles."""
    ordered = sorted(measured, key=lambda f: f["id"])
    done = done_time()
    return [round((f["t"][done] - f["t"]["read_start"]) * 1e3, 3) for f in ordered]


def wall_clock(start_s: float, end_s: float) -> dict:
    """[start_s, end_s] on this host's wall clock (Unix seconds), so windows of runs on other
    hosts can be lined up; frames are timed on the monotonic clock, converted here."""
    offset = time.time() - time.perf_counter()
    return {"window_start_unix": start_s + offset, "window_end_unix": end_s + offset}


def frames_report(run: RunData, measured: int) -> dict:
    lost = [x for x in run.failed if x.get("kind") == "lost"]
    return {"in": run.frames_in, "processed": len(run.frames), "failed": len(run.failed) - len(lost),
            "lost": len(lost), "cancelled": len(run.cancelled), "warmup": run.warmup,
            "cold": sum(1 for f in run.frames if f.get("cold")), "measured": measured,
            "accounted": run.frames_in == len(run.frames) + len(run.failed) + len(run.cancelled),
            "duplicates_dropped": run.duplicates,
            "failures": run.failed, "cancelled_frames": run.cancelled[:LISTED_CANCELLED],
            "cancelled_ids": id_ranges(c["id"] for c in run.cancelled),
            "processed_ids": id_ranges(f["id"] for f in run.frames)}  # what a cluster's merge maps back


def id_ranges(ids) -> list[list[int]]:
    """Sorted ids as inclusive ``[first, last]`` runs of consecutive ids (a stop cancels thousands)."""
    ranges: list[list[int]] = []
    for frame_id in sorted(ids):
        if ranges and frame_id == ranges[-1][1] + 1:
            ranges[-1][1] = frame_id
        else:
            ranges.append([frame_id, frame_id])
    return ranges


def throughput_report(run: RunData, window) -> dict:
    """fps over the measured window, fps per THROUGHPUT_WINDOW_S slice, and stability; times
    relative to the first frame read."""
    done = done_time()
    ends = [f["t"][done] for f in run.frames if is_measured(f, run.warmup) and window.holds(f["t"][done])]
    slices = throughput_windows(ends, window)
    return {"wall_s": run.finished_s - run.started_s, "window_start_s": window.start_s - run.started_s,
            "window_s": window.seconds, "measured_frames": window.measured, "completed_frames": window.completed,
            "fps": window.fps, **wall_clock(window.start_s, window.end_s),
            "windows": [{**s, "start_s": s["start_s"] - run.started_s, "end_s": s["end_s"] - run.started_s}
                        for s in slices],
            **stability(slices, window, len(run.frames), run.warmup)}


def cpu_report(usage: dict, stages: dict, window, cores: int | None, fps: float | None) -> dict:
    """CPU ms the pipeline spends per frame completed in the window, in all and by role, and the
    cores' saturation. From the resource samples (every process, every thread, idle polling
    included) when there are some; else from the stages' own busy CPU (runner, collector and
    idle time not counted: an underestimate); without any CPU time, no CPU per frame and the
    saturation estimated from busy wall time."""
    processes = usage["processes"]
    if processes and window.completed:
        by_role: dict[str, float] = {}
        for p in processes.values():
            role = p["role"] if p["role"] in frame_roles() else "other"
            by_role[role] = by_role.get(role, 0.0) + 1e3 * p["window_cpu_s"] / window.completed
        return {"cpu_ms_per_frame": 1e3 * usage["window_cpu_s"] / window.completed, "by_role": by_role,
                "window_cpu_s": usage["window_cpu_s"], "saturation": usage["saturation"], "cores": cores,
                "source": "resource samples of every process"}
    by_role = {role: stages[role]["cpu_ms_mean"] for role in frame_roles() if stages[role]["frames"]}
    total = sum(by_role.values()) if by_role and None not in by_role.values() else None
    if total:
        return {"cpu_ms_per_frame": total, "by_role": by_role, "window_cpu_s": None, "cores": cores,
                "saturation": ratio(fps * total, 1e3 * cores) if fps and cores else None,
                "source": "stages' busy CPU (no resource samples: runner, collector and idle CPU not counted)"}
    # No CPU time at all: the stages' busy wall time bounds the cores' use from above (a process
    # waiting for a core still counts as busy), so "saturated" here errs towards less work per
    # frame, never towards more processes.
    busy_cores = sum(w["utilisation"] for role in frame_roles() for w in stages[role]["per_worker"])
    return {"cpu_ms_per_frame": None, "by_role": {}, "window_cpu_s": None, "cores": cores,
            "saturation": ratio(busy_cores, cores) if busy_cores else None,
            "source": "none: no resource samples and no CPU time from the workers; saturation from busy wall time"}


def inference_of(stages: dict, config: dict, environment: dict) -> dict:
    """{"precision", "backend", "data_path"}: what the inference workers ran (as they reported it;
    else what the configuration asked, for a run that stopped before they reported), and where
    the frames' pixels lived (host, or device: decoded to encoded by the inference workers)."""
    data_path = config.get("data_path") or "host"
    devices_used = device_usage(stages["infer"]["per_worker"])
    if config.get("preset") == "none" and not config.get("weights"):
        return {"precision": "none", "backend": "none (--preset none: no model)", "data_path": data_path,
                "devices": devices_used}
    devices = ",".join(config.get("devices") or [str(config.get("device") or "cpu")])
    reported = sorted({w.get("precision") for w in stages["infer"]["per_worker"]} - {None})
    if reported:
        precision = "/".join(reported)
    elif config.get("half"):
        precision = "fp16" if devices.startswith("cuda") else "bf16"
    else:
        precision = "fp32"
    bf16 = "bf16" in reported or (not reported and precision == "bf16")
    spec = recorded_backend(config.get("backend") or DEFAULT_BACKEND)
    return {"precision": precision, "backend": spec.label(environment, devices, autocast=bf16), "data_path": data_path,
            "devices": devices_used}


def link_report(links: dict) -> dict:
    return {name: {"frames": link["frames"], "bytes": link["bytes"],
                   "bytes_per_frame": link["bytes"] / link["frames"] if link["frames"] else 0.0}
            for name, link in links.items()}


def summary_of(report: dict) -> dict:
    """Everything the terminal summary and ``--json`` print, with no need of report.json."""
    stages, latency, th, fr = report["stages"], report["latency_ms"], report["throughput"], report["frames"]
    neck, cpu = report["bottleneck"], report["cpu"]
    return {"run_id": report["run_id"], "frames_in": fr["in"], "processed": fr["processed"], "failed": fr["failed"],
            "lost": fr["lost"], "cancelled": fr["cancelled"], "warmup": fr["warmup"], "accounted": fr["accounted"],
            "measured_frames": th["measured_frames"], "fps": th["fps"], "window_s": th["window_s"],
            "wall_s": th["wall_s"], "stable": th["stable"], "stable_reason": th["reason"],
            "latency_p50_ms": latency["p50"] if latency["count"] else None,
            "latency_p95_ms": latency["p95"] if latency["count"] else None,
            "latency_p99_ms": latency["p99"] if latency["count"] else None,
            "cpu_ms_per_frame": cpu["cpu_ms_per_frame"], "cpu_saturation": cpu["saturation"], "cores": cpu["cores"],
            "machine_cores": cpu["machine_cores"], "other_load_cores": cpu["other_load_cores"],
            "bound_fps": neck["bound_fps"], "bound_kind": neck["bound_kind"], "efficiency": neck["efficiency"],
            "bottleneck": neck["stage"], "limit": neck["limit"], "hint": neck["hint"],
            "peak_pss_total_bytes": report["resources"]["peak_pss_total_bytes"],
            "precision": report["inference"]["precision"], "backend": report["inference"]["backend"],
            "data_path": report["inference"].get("data_path", "host"),
            "restarts": len(report["restarts"]), "stop_reason": report["stop"]["reason"],
            "stop_signal": report["stop"]["signal"], "images_saved": report["outputs"]["images_saved"],
            "videos_saved": [v["video"] for v in report["sources"]["videos"]],
            "video_frames_saved": sum(v["frames"] for v in report["sources"]["videos"]),
            "stream_errors": report["sources"]["stream_errors"],
            "dropped_at_source": report["sources"]["dropped_at_source"],
            "skipped_files": report["sources"]["skipped_files"],
            "image_error": report["outputs"]["image_error"],
            "stages": {role: {"workers": s["workers"],
                              "ms_per_frame": s["ms_per_frame"]["mean"] if s["ms_per_frame"]["count"] else None,
                              "cpu_ms_per_frame": s["cpu_ms_mean"],
                              "utilisation": s["utilisation"], "cpu_utilisation": s["cpu_utilisation"],
                              "capacity_fps": s["capacity"]["fps"], "peak_pss_bytes": s["peak_pss_bytes"]}
                       for role, s in stages.items()}}


def modules_csv(rows: list[dict]) -> str:
    """One line per module row, in the given order; times with 4 decimals, share empty when None."""
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(MODULES_CSV_HEADER)
    for r in rows:
        out.writerow([r["name"], r["type"], r["params"], r["input_shapes"], r["calls"],
                      *(f"{r[k]:.4f}" for k in ("total_ms", "mean_ms", "p50_ms", "p95_ms")),
                      "" if r["share"] is None else f"{r['share']:.4f}", r["outermost"]])
    return text.getvalue()

