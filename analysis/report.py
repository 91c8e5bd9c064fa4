"""The run folder: report.json, report.md, modules.csv, trace.json, detections.json and plots.png,
from what the collector gathered (``RunData``). Everything but the plots is plain Python; the
plots use matplotlib's Agg backend, chosen inside ``write_plots``."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from analysis.stats import fps, measured_window, summarise_ms, utilisation
from yolo.module_stats import RESIDUAL_NAME

log = logging.getLogger(__name__)

ROLES = ("pre", "infer", "post")
ROLE_NAMES = {"pre": "preprocess", "infer": "inference", "post": "postprocess"}
HINTS = {"pre": "add --pre-workers (decode + letterbox is the limit)",
         "infer": "try --batch-size, --half on CUDA, or more --infer-workers",
         "post": "add --post-workers, or save fewer images (--save-images N)"}
FRAME_TIMESTAMPS = ("read_start", "pre_end", "infer_start", "infer_end", "post_start", "post_end")  # the ones used
STAGE_INTERVALS = {"pre": ("read_start", "pre_end"), "queue_pre_infer": ("pre_end", "infer_start"),
                   "infer": ("infer_start", "infer_end"), "queue_infer_post": ("infer_end", "post_start"),
                   "post": ("post_start", "post_end")}
TRACE_SPANS = (("pre", "read+letterbox", "read_start", "pre_end"), ("infer", "infer", "infer_start", "infer_end"),
               ("post", "nms+draw+save", "post_start", "post_end"))
MODULES_CSV_HEADER = ("name", "type", "params", "input_shape", "calls", "total_ms", "mean_ms", "p50_ms", "p95_ms",
                      "share", "outermost")
TOP_MODULES = 15
LISTED_FAILURES = 20
FRAME_TID = 0
FORWARD_TID = 9
MODULE_TID_BASE = 10  # module spans at depth d go on thread 10 + d


@dataclass
class RunData:
    """What the collector gathered; times are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC,
    shared by every process of the run on Linux). See ``workers/collector.py`` for the shapes."""

    run_id: str
    config: dict
    environment: dict
    frames_in: int
    warmup: int
    started_s: float
    finished_s: float
    frames: list[dict]
    failed: list[dict]
    detections: list[dict]
    workers: list[dict]
    links: dict
    module_rows: list[dict]
    forward: dict
    module_spans: list[dict]
    log_file: str = "run.log"


def write_run_folder(run_dir: str, run: RunData) -> dict:
    """Write every report into ``run_dir`` (which exists) and return the summary dict."""
    report = build_report(run)
    report["summary"]["run_dir"] = run_dir
    _write_json(os.path.join(run_dir, "report.json"), report, indent=1)
    _write_json(os.path.join(run_dir, "detections.json"), run.detections, indent=1)
    write_modules_csv(os.path.join(run_dir, "modules.csv"), run.module_rows)
    _write_json(os.path.join(run_dir, "trace.json"), trace_events(run))
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write(markdown(report))
    write_plots(os.path.join(run_dir, "plots.png"), run, report)
    return report["summary"]


def json_safe(value: Any) -> Any:
    """Plain JSON data: numpy scalars to int/float, tuples to lists, NaN and infinities to None."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item") and not isinstance(value, float):  # numpy scalar
        return json_safe(value.item())
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    raise ValueError(f"report: expected JSON-able data, got {type(value).__name__} {value!r}")


def _write_json(path: str, data: Any, indent: int | None = None) -> None:
    with open(path, "w") as f:
        json.dump(json_safe(data), f, indent=indent, allow_nan=False)


def build_report(run: RunData) -> dict:
    """report.json's content, summary included."""
    for frame in run.frames:
        _check_timestamps(frame)
    measured = [f for f in run.frames if f["id"] >= run.warmup]
    start, end, count = measured_window(run.frames, run.warmup, run.started_s)
    stages = {role: stage_report([w for w in run.workers if w["role"] == role]) for role in ROLES}
    throughput = {"wall_s": run.finished_s - run.started_s, "window_s": max(end - start, 0.0),
                  "measured_frames": count, "fps": fps(count, start, end)}
    latency = interval_ms(measured, "read_start", "post_end")
    report = {
        "run_id": run.run_id, "config": run.config, "environment": run.environment,
        "frames": {"in": run.frames_in, "processed": len(run.frames), "failed": len(run.failed),
                   "warmup": run.warmup, "accounted": run.frames_in == len(run.frames) + len(run.failed),
                   "failures": run.failed},
        "throughput": throughput, "latency_ms": latency,
        "stage_latency_ms": {name: interval_ms(measured, t0, t1) for name, (t0, t1) in STAGE_INTERVALS.items()},
        "stages": stages, "links": link_report(run.links), "forward": run.forward, "modules": run.module_rows,
    }
    report["summary"] = summary_of(report)
    return report


def _check_timestamps(frame: dict) -> None:
    missing = [k for k in FRAME_TIMESTAMPS if k not in frame.get("t", {})]
    if missing:
        raise ValueError(f"report: expected frame {frame.get('id')} to carry timestamps {list(FRAME_TIMESTAMPS)}, "
                         f"got none for {missing}")


def interval_ms(frames: list[dict], start: str, end: str) -> dict:
    """summarise_ms of t[end] - t[start] over ``frames``, in milliseconds."""
    return summarise_ms([(f["t"][end] - f["t"][start]) * 1e3 for f in frames])


def worker_report(w: dict) -> dict:
    """One process's row: its counters, ms per frame and per substage, and utilisation."""
    return {**{k: w.get(k) for k in ("name", "pid", "device", "threads", "frames")},
            "batches": w.get("batches", 0), "busy_s": w["busy_s"], "cpu_s": w.get("cpu_s"),
            "ms_per_frame": summarise_ms(w["frame_ms"]), "wait_in_s": w["wait_in_s"],
            "blocked_out_s": w["blocked_out_s"], "wall_s": w["wall_s"],
            "utilisation": utilisation(w["busy_s"], w["wall_s"]),
            "substages_ms": {k: summarise_ms(v) for k, v in w.get("substages_ms", {}).items()}}


def stage_report(members: list[dict]) -> dict:
    """The workers of one role together; utilisation is busy over wall, both summed."""
    busy = sum(w["busy_s"] for w in members)
    return {"workers": len(members), "frames": sum(w["frames"] for w in members), "busy_s": busy,
            "cpu_s": sum(w.get("cpu_s") or 0.0 for w in members),
            "ms_per_frame": summarise_ms([ms for w in members for ms in w["frame_ms"]]),
            "wait_in_s": sum(w["wait_in_s"] for w in members),
            "blocked_out_s": sum(w["blocked_out_s"] for w in members),
            "utilisation": utilisation(busy, sum(w["wall_s"] for w in members)),
            "per_worker": [worker_report(w) for w in members]}


def link_report(links: dict) -> dict:
    return {name: {"frames": link["frames"], "bytes": link["bytes"],
                   "bytes_per_frame": link["bytes"] / link["frames"] if link["frames"] else 0.0}
            for name, link in links.items()}


def busiest_role(stages: dict) -> str:
    """The role with the highest utilisation (the first of ROLES on a tie)."""
    return max(ROLES, key=lambda role: stages[role]["utilisation"])


def summary_of(report: dict) -> dict:
    stages, latency, throughput = report["stages"], report["latency_ms"], report["throughput"]
    return {"run_id": report["run_id"], "frames_in": report["frames"]["in"],
            "processed": report["frames"]["processed"], "failed": report["frames"]["failed"],
            "fps": throughput["fps"], "latency_p50_ms": latency["p50"], "latency_p95_ms": latency["p95"],
            "latency_p99_ms": latency["p99"], "wall_s": throughput["wall_s"], "bottleneck": busiest_role(stages),
            "per_role_ms_per_frame": {r: stages[r]["ms_per_frame"]["mean"] for r in ROLES},
            "per_role_utilisation": {r: stages[r]["utilisation"] for r in ROLES}}


def write_modules_csv(path: str, rows: list[dict]) -> None:
    """One line per module row, in the given order; times with 4 decimals, share empty when None."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(MODULES_CSV_HEADER)
        for r in rows:
            out.writerow([r["name"], r["type"], r["params"], r["input_shapes"], r["calls"],
                          *(f"{r[k]:.4f}" for k in ("total_ms", "mean_ms", "p50_ms", "p95_ms")),
                          "" if r["share"] is None else f"{r['share']:.4f}", r["outermost"]])


def trace_events(run: RunData) -> dict:
    """Chrome trace-event format (Perfetto, chrome://tracing): a process track per worker, a span
    per frame per stage on the worker that did it, the inference processes' forwards on thread 9
    and their module spans on thread 10 + depth, and a frames-completed counter on the collector.
    Timestamps in microseconds since ``run.started_s``."""
    def us(t_s: float) -> float:
        return round((t_s - run.started_s) * 1e6, 1)

    pids = {w["name"]: w["pid"] for w in run.workers}
    events = [_metadata("process_name", pid, 0, name) for name, pid in pids.items()]
    events += [_metadata("process_sort_index", w["pid"], 0, None, sort_index=i) for i, w in
               enumerate(sorted(run.workers, key=lambda w: (_role_order(w["role"]), w["name"])))]
    events += [_metadata("thread_name", pid, FRAME_TID, "frames") for pid in pids.values()]
    for f in run.frames:
        for role, label, t0, t1 in TRACE_SPANS:
            worker = f["workers"].get(role)
            if worker not in pids:
                continue
            name = f"{label} batch={f['batch']}" if role == "infer" else label
            events.append({"ph": "X", "name": name, "cat": role, "pid": pids[worker], "tid": FRAME_TID,
                           "ts": us(f["t"][t0]), "dur": round((f["t"][t1] - f["t"][t0]) * 1e6, 1),
                           "args": {"frame": f["id"], "name": f["name"]}})
    tracks = sorted({(s["pid"], s["depth"]) for s in run.module_spans})
    events += [_metadata("thread_name", pid, _module_tid(depth), "forward" if depth < 0 else f"modules depth {depth}")
               for pid, depth in tracks]
    events += [{"ph": "X", "name": s["name"], "cat": "module", "pid": s["pid"], "tid": _module_tid(s["depth"]),
                "ts": us(s["start_s"]), "dur": round(s["dur_ms"] * 1e3, 1)} for s in run.module_spans]
    events += _completed_counter(run, us)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _metadata(kind: str, pid: int, tid: int, name: str | None, **args) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name} if name is not None else args}


def _module_tid(depth: int) -> int:
    return FORWARD_TID if depth < 0 else MODULE_TID_BASE + depth


def _role_order(role: str) -> int:
    return ROLES.index(role) if role in ROLES else len(ROLES)


def _completed_counter(run: RunData, us) -> list[dict]:
    collector = next((w for w in run.workers if w["role"] == "collector"), None)
    if collector is None:
        return []
    ends = sorted(f["t"]["post_end"] for f in run.frames)
    return [{"ph": "C", "name": "frames completed", "pid": collector["pid"], "tid": FRAME_TID, "ts": us(t),
             "args": {"frames": i}} for i, t in enumerate(ends, start=1)]


def _f(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def config_line(report: dict) -> str:
    """Device, workers per role with their torch threads, batch size, letterbox and weights."""
    cfg = report["config"]
    weights = cfg.get("weights") or "random weights (detections meaningless)"
    if not cfg.get("weights") and cfg.get("preset"):
        weights = f"{cfg['preset']} with {weights}"
    roles = []
    for role in ROLES:
        stage = report["stages"][role]
        threads = sorted({(w.get("threads") or {}).get("torch") for w in stage["per_worker"]} - {None})
        shown = "/".join(map(str, threads)) or "?"
        roles.append(f"{stage['workers']} {role} x {shown} thread{'s' if threads != [1] else ''}")
    letterbox = "rect" if cfg.get("rect") else "square"
    return (f"Device {cfg.get('device')}; {', '.join(roles)}; batch {cfg.get('batch_size')}; "
            f"imgsz {cfg.get('imgsz')} {letterbox}; {weights}.")


def failure_lines(failures: list[dict]) -> list[str]:
    lines = [f"- frame {x['id']} {x['name']}: {x['stage']} on {x.get('worker')}: {x['reason']}"
             for x in failures[:LISTED_FAILURES]]
    if len(failures) > LISTED_FAILURES:
        lines.append(f"- ... {len(failures) - LISTED_FAILURES} more")
    return lines


def module_table_rows(modules: list[dict]) -> list[dict]:
    """The TOP_MODULES rows with the most total time, then the residual row if it is not among them."""
    top = sorted(modules, key=lambda r: -r["total_ms"])[:TOP_MODULES]
    residual = [r for r in modules if r["name"] == RESIDUAL_NAME and r not in top]
    return top + residual


def markdown(report: dict) -> str:
    """report.md: what a person reads first."""
    fr, th, lat = report["frames"], report["throughput"], report["latency_ms"]
    lines = [f"# Run {report['run_id']}", "", config_line(report), "",
             f"Frames in {fr['in']}, processed {fr['processed']}, failed {fr['failed']} "
             f"(accounted: {'yes' if fr['accounted'] else 'NO'}); the first {fr['warmup']} are warm-up, "
             "excluded from the statistics.", ""]
    if fr["failures"]:
        lines += failure_lines(fr["failures"]) + [""]
    lines += ["## Throughput and latency", ""]
    lines += _table(["fps", "window s", "measured frames", "latency p50 ms", "p90", "p95", "p99", "max"],
                    [[_f(th["fps"], 2), _f(th["window_s"], 2), str(th["measured_frames"]),
                      *(_f(lat[k]) for k in ("p50", "p90", "p95", "p99", "max"))]])
    lines += ["", "| interval | p50 ms | p95 ms | max ms |", "|---|---|---|---|"]
    lines += [f"| {name} | {_f(s['p50'])} | {_f(s['p95'])} | {_f(s['max'])} |"
              for name, s in report["stage_latency_ms"].items()]
    lines += ["", "## Stages", ""]
    rows = []
    for role in ROLES:
        stage = report["stages"][role]
        for w in stage["per_worker"]:
            rows.append([role, w["name"], str(w["frames"]), _f(w["ms_per_frame"]["p50"]), _f(w["ms_per_frame"]["p95"]),
                         _f(w["busy_s"], 2), _f(w["wait_in_s"], 2), _f(w["blocked_out_s"], 2),
                         _f(100 * w["utilisation"])])
        rows.append([f"**{role}**", f"{stage['workers']} workers", str(stage["frames"]),
                     _f(stage["ms_per_frame"]["p50"]), _f(stage["ms_per_frame"]["p95"]), _f(stage["busy_s"], 2),
                     _f(stage["wait_in_s"], 2), _f(stage["blocked_out_s"], 2), _f(100 * stage["utilisation"])])
    lines += _table(["stage", "worker", "frames", "ms/frame p50", "p95", "busy s", "wait in s", "blocked out s",
                     "util %"], rows)
    lines += ["", "## Links", ""]
    lines += _table(["link", "frames", "bytes per frame"],
                    [[name, str(link["frames"]), f"{link['bytes_per_frame']:,.0f}"]
                     for name, link in report["links"].items()])
    modules = module_table_rows(report["modules"])
    if modules:
        fwd = report["forward"]
        lines += ["", "## Modules", "", f"{fwd.get('forwards', 0)} forwards, mean {_f(fwd.get('mean_ms'), 2)} ms, "
                                        f"p50 {_f(fwd.get('p50_ms'), 2)} ms, p95 {_f(fwd.get('p95_ms'), 2)} ms.", ""]
        lines += _table(["module", "type", "calls", "total ms", "mean ms", "p95 ms", "share %"],
                        [[r["name"], r["type"], str(r["calls"]), _f(r["total_ms"], 2), _f(r["mean_ms"], 3),
                          _f(r["p95_ms"], 3), "" if r["share"] is None else _f(100 * r["share"])] for r in modules])
    lines += ["", bottleneck_line(report["summary"]["bottleneck"]), ""]
    return "\n".join(lines)


def bottleneck_line(role: str) -> str:
    return f"{ROLE_NAMES[role]} is the busiest stage: {HINTS[role]}."


def format_summary(summary: dict, report: dict) -> str:
    """The few lines the runner prints at the end of a run."""
    stages, th = report["stages"], report["throughput"]
    lines = [f"run {summary['run_id']}: {summary['frames_in']} frames in, {summary['processed']} processed, "
             f"{summary['failed']} failed",
             f"throughput  {summary['fps']:.2f} fps over {th['window_s']:.2f} s ({th['measured_frames']} measured frames)",
             f"latency     p50 {summary['latency_p50_ms']:.1f}  p95 {summary['latency_p95_ms']:.1f}  "
             f"p99 {summary.get('latency_p99_ms', report['latency_ms']['p99']):.1f} ms",
             f"{'stage':<8}{'workers':>8}{'ms/frame':>10}{'util %':>8}"]
    for role in ROLES:
        s = stages[role]
        lines.append(f"{role:<8}{s['workers']:>8}{s['ms_per_frame']['mean']:>10.1f}{100 * s['utilisation']:>8.0f}")
    lines.append(bottleneck_line(summary["bottleneck"]))
    if summary.get("run_dir"):
        lines.append(f"run folder  {summary['run_dir']}")
    return "\n".join(lines)


def write_plots(path: str, run: RunData, report: dict) -> None:
    """plots.png: frames completed over time (measured window shaded) and the latency histogram.
    Skipped with a warning when matplotlib is missing or fails: the other reports stand alone."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        log.warning("no plots.png: matplotlib unavailable (%s)", exc)
        return
    ends = sorted(f["t"]["post_end"] - run.started_s for f in run.frames)
    latencies = [(f["t"]["post_end"] - f["t"]["read_start"]) * 1e3 for f in run.frames if f["id"] >= run.warmup]
    start, end, _ = measured_window(run.frames, run.warmup, run.started_s)
    fig, (done, hist) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        done.step(ends, range(1, len(ends) + 1), where="post")
        if end > start:
            done.axvspan(start - run.started_s, end - run.started_s, alpha=0.15, label="measured window")
            done.legend(loc="upper left")
        done.set(xlabel="s since first read", ylabel="frames completed",
                 title=f"{report['throughput']['fps']:.1f} fps in the measured window")
        hist.hist(latencies, bins=30)
        hist.set(xlabel="end-to-end latency (ms)", ylabel="frames", title="latency, warm-up excluded")
        fig.tight_layout()
        fig.savefig(path, dpi=80)
    except (RuntimeError, ValueError, OSError) as exc:
        log.warning("no plots.png: matplotlib failed (%s)", exc)
    finally:
        plt.close(fig)
