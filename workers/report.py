"""The run folder: report.json, report.md, modules.csv, trace.json and plots.png, from what
the collector gathered (``RunData``)."""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass

from workers.stats import fps, measured_window, summarise_ms, utilisation

log = logging.getLogger(__name__)

ROLES = ("pre", "infer", "post")
HINTS = {"pre": "add --pre-workers (decode + letterbox is the limit)",
         "infer": "inference is the limit: try --batch-size, --half on CUDA, or more --infer-workers",
         "post": "add --post-workers, or save fewer images (--save-images N)"}


@dataclass
class RunData:
    run_id: str
    config: dict
    environment: dict
    frames_in: int
    warmup: int
    started_s: float
    finished_s: float
    frames: list
    failed: list
    detections: list
    workers: list
    links: dict
    module_rows: list
    forward: dict
    module_spans: list
    log_file: str = "run.log"


def _latency(frames: list, start: str, end: str) -> dict:
    return summarise_ms([(f["t"][end] - f["t"][start]) * 1e3 for f in frames])


def build_report(run: RunData) -> dict:
    measured = [f for f in run.frames if f["id"] >= run.warmup]
    start, end, count = measured_window(run.frames, run.warmup, run.started_s)
    stages = {}
    for role in ROLES:
        members = [w for w in run.workers if w["role"] == role]
        busy = sum(w["busy_s"] for w in members)
        wall = sum(w["wall_s"] for w in members)
        stages[role] = {
            "workers": len(members), "frames": sum(w["frames"] for w in members), "busy_s": busy,
            "cpu_s": sum(w.get("cpu_s", 0.0) for w in members),
            "ms_per_frame": summarise_ms([ms for w in members for ms in w["frame_ms"]]),
            "wait_in_s": sum(w["wait_in_s"] for w in members),
            "blocked_out_s": sum(w["blocked_out_s"] for w in members), "utilisation": utilisation(busy, wall),
            "per_worker": [{**{k: w.get(k) for k in ("name", "pid", "device", "threads", "frames", "batches",
                                                   "busy_s", "cpu_s", "wait_in_s", "blocked_out_s", "wall_s")},
                            "ms_per_frame": summarise_ms(w["frame_ms"]),
                            "utilisation": utilisation(w["busy_s"], w["wall_s"]),
                            "substages_ms": {k: summarise_ms(v) for k, v in w.get("substages_ms", {}).items()}}
                           for w in members]}
    links = {name: {**link, "bytes_per_frame": link["bytes"] / link["frames"] if link["frames"] else 0.0}
             for name, link in run.links.items()}
    processed, failed = len(run.frames), len(run.failed)
    throughput = {"wall_s": run.finished_s - run.started_s, "window_s": max(end - start, 0.0),
                  "measured_frames": count, "fps": fps(count, start, end)}
    latency = _latency(measured, "read_start", "post_end")
    bottleneck = max(ROLES, key=lambda r: stages[r]["utilisation"])
    summary = {"run_id": run.run_id, "frames_in": run.frames_in, "processed": processed, "failed": failed,
               "fps": throughput["fps"], "latency_p50_ms": latency["p50"], "latency_p95_ms": latency["p95"],
               "latency_p99_ms": latency["p99"], "wall_s": throughput["wall_s"], "bottleneck": bottleneck,
               "per_role_ms_per_frame": {r: stages[r]["ms_per_frame"]["mean"] for r in ROLES},
               "per_role_utilisation": {r: stages[r]["utilisation"] for r in ROLES}}
    return {
        "run_id": run.run_id, "config": run.config, "environment": run.environment,
        "frames": {"in": run.frames_in, "processed": processed, "failed": failed, "warmup": run.warmup,
                   "accounted": run.frames_in == processed + failed, "failures": run.failed},
        "throughput": throughput, "latency_ms": latency,
        "stage_latency_ms": {"pre": _latency(measured, "read_start", "pre_end"),
                             "queue_pre_infer": _latency(measured, "pre_end", "infer_start"),
                             "infer": _latency(measured, "infer_start", "infer_end"),
                             "queue_infer_post": _latency(measured, "infer_end", "post_start"),
                             "post": _latency(measured, "post_start", "post_end")},
        "stages": stages, "links": links, "forward": run.forward, "modules": run.module_rows, "summary": summary,
    }


def write_run_folder(run_dir: str, run: RunData) -> dict:
    report = build_report(run)
    with open(os.path.join(run_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, allow_nan=False, default=float)
    with open(os.path.join(run_dir, "detections.json"), "w") as f:
        json.dump(run.detections, f, indent=1)
    write_modules_csv(os.path.join(run_dir, "modules.csv"), run.module_rows)
    with open(os.path.join(run_dir, "trace.json"), "w") as f:
        json.dump(trace_events(run), f)
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write(markdown(report))
    write_plots(os.path.join(run_dir, "plots.png"), run, report)
    return report["summary"]


def write_modules_csv(path: str, rows: list) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["name", "type", "params", "input_shape", "calls", "total_ms", "mean_ms", "p50_ms", "p95_ms",
                      "share", "outermost"])
        for r in rows:
            out.writerow([r["name"], r["type"], r["params"], r["input_shapes"], r["calls"],
                          *(f"{r[k]:.4f}" for k in ("total_ms", "mean_ms", "p50_ms", "p95_ms")),
                          "" if r["share"] is None else f"{r['share']:.4f}", r["outermost"]])


def trace_events(run: RunData) -> dict:
    """Chrome trace-event format: a track per process, a span per frame per stage, and the
    inference processes' per-module spans on threads by nesting depth."""
    def us(t: float) -> float:
        return round((t - run.started_s) * 1e6, 1)

    pids = {w["name"]: w["pid"] for w in run.workers}
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
              for name, pid in pids.items()]
    spans = (("pre", "read+letterbox", "read_start", "pre_end"), ("infer", "infer", "infer_start", "infer_end"),
             ("post", "nms+draw+save", "post_start", "post_end"))
    for f in run.frames:
        for role, label, t0, t1 in spans:
            worker = f["workers"].get(role)
            if worker not in pids:
                continue
            name = f"{label} batch={f['batch']}" if role == "infer" else label
            events.append({"ph": "X", "name": name, "pid": pids[worker], "tid": 0, "ts": us(f["t"][t0]),
                           "dur": round((f["t"][t1] - f["t"][t0]) * 1e6, 1),
                           "args": {"frame": f["id"], "name": f["name"]}})
    for s in run.module_spans:
        events.append({"ph": "X", "name": s["name"], "pid": s["pid"], "tid": 10 + s["depth"], "ts": us(s["start_s"]),
                       "dur": round(s["dur_ms"] * 1e3, 1)})
    for pid in {s["pid"] for s in run.module_spans}:
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 9, "args": {"name": "forward"}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 10, "args": {"name": "modules"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _f(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    cfg, fr, th, lat = report["config"], report["frames"], report["throughput"], report["latency_ms"]
    weights = cfg.get("weights") or f"random {cfg.get('preset')} weights (detections meaningless)"
    lines = [f"# Run {report['run_id']}", "",
             f"{weights}; device {cfg.get('device')}; {cfg.get('pre_workers')} pre, {cfg.get('infer_workers')} "
             f"infer x {cfg.get('infer_threads')} torch threads, {cfg.get('post_workers')} post workers; batch "
             f"{cfg.get('batch_size')}; imgsz {cfg.get('imgsz')} {'rect' if cfg.get('rect') else 'square'}", "",
             f"Frames in {fr['in']}, processed {fr['processed']}, failed {fr['failed']} "
             f"(accounted: {fr['accounted']}); warm-up {fr['warmup']}.", ""]
    for failure in fr["failures"][:20]:
        lines.append(f"- frame {failure['id']} {failure['name']}: {failure['stage']}: {failure['reason']}")
    if len(fr["failures"]) > 20:
        lines.append(f"- ... {len(fr['failures']) - 20} more")
    lines += ["", "| fps | window s | latency p50 ms | p90 | p95 | p99 | max |", "|---|---|---|---|---|---|---|",
              f"| {_f(th['fps'], 2)} | {_f(th['window_s'], 2)} | {_f(lat['p50'])} | {_f(lat['p90'])} | "
              f"{_f(lat['p95'])} | {_f(lat['p99'])} | {_f(lat['max'])} |", "",
              "| worker | frames | ms/frame p50 | p95 | busy s | cpu s | wait in s | blocked out s | util % |",
              "|---|---|---|---|---|---|---|---|---|"]
    for role, stage in report["stages"].items():
        for w in stage["per_worker"]:
            lines.append(f"| {w['name']} | {w['frames']} | {_f(w['ms_per_frame']['p50'])} | "
                         f"{_f(w['ms_per_frame']['p95'])} | {_f(w['busy_s'], 2)} | {_f(w.get('cpu_s') or 0, 2)} | "
                         f"{_f(w['wait_in_s'], 2)} | {_f(w['blocked_out_s'], 2)} | {_f(100 * w['utilisation'])} |")
    lines += ["", "| link | frames | bytes per frame |", "|---|---|---|"]
    lines += [f"| {name} | {link['frames']} | {link['bytes_per_frame']:,.0f} |" for name, link in report["links"].items()]
    rows = sorted(report["modules"], key=lambda r: -r["total_ms"])[:15]
    if rows:
        lines += ["", f"Forward: {report['forward'].get('forwards')} forwards, p50 "
                      f"{_f(report['forward'].get('p50_ms', 0))} ms.", "",
                  "| module | type | calls | mean ms | p95 ms | share % |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {r['type']} | {r['calls']} | {_f(r['mean_ms'], 3)} | {_f(r['p95_ms'], 3)} | "
                  f"{'' if r['share'] is None else _f(100 * r['share'])} |" for r in rows]
    bottleneck = report["summary"]["bottleneck"]
    lines += ["", f"Busiest stage: **{bottleneck}**: {HINTS[bottleneck]}.", ""]
    return "\n".join(lines)


def format_summary(summary: dict, report: dict) -> str:
    stages = report["stages"]
    lines = [f"run {summary['run_id']}: {summary['processed']}/{summary['frames_in']} frames processed, "
             f"{summary['failed']} failed",
             f"throughput  {summary['fps']:.2f} fps over {report['throughput']['window_s']:.2f} s "
             f"({report['throughput']['measured_frames']} measured frames)",
             f"latency     p50 {summary['latency_p50_ms']:.1f}  p95 {summary['latency_p95_ms']:.1f}  "
             f"p99 {summary['latency_p99_ms']:.1f} ms",
             f"{'stage':<8}{'workers':>8}{'ms/frame':>10}{'util %':>8}"]
    for role in ROLES:
        s = stages[role]
        lines.append(f"{role:<8}{s['workers']:>8}{s['ms_per_frame']['mean']:>10.1f}{100 * s['utilisation']:>8.0f}")
    lines.append(f"busiest stage: {summary['bottleneck']} ({HINTS[summary['bottleneck']]})")
    return "\n".join(lines)


def write_plots(path: str, run: RunData, report: dict) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # plots are a convenience; the reports stand without them
        log.warning("no plots: %s", exc)
        return
    ends = sorted(f["t"]["post_end"] - run.started_s for f in run.frames)
    latencies = [(f["t"]["post_end"] - f["t"]["read_start"]) * 1e3 for f in run.frames if f["id"] >= run.warmup]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(ends, range(1, len(ends) + 1))
    a.set(xlabel="s since first read", ylabel="frames completed", title=f"{report['throughput']['fps']:.1f} fps")
    b.hist(latencies, bins=30)
    b.set(xlabel="end-to-end latency (ms)", ylabel="frames", title="latency")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
