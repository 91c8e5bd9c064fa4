"""The merged report of a cluster run: a row per node (from its runs' own reports), the
cluster's totals, the ledger over global frame ids, report.json, report.md and trace.json.

Totals: fps over the union of the nodes' measured windows on the wall clock (runs on one node
never overlap; nodes' windows do), latency percentiles over every frame's latency, the cluster's
bound = the sum of the nodes' bounds.
"""

from __future__ import annotations

import json
import os
from collections import Counter

from analysis.atomic import write_bytes_atomic
from analysis.report import id_ranges, json_safe
from analysis.samples import summarise_ms
from analysis.stats import ratio
from cluster.merge import merged_trace, run_report
from cluster.outbox import OUTPUT_DIRS
from cluster.work import undone_parts
from supervisor import exit_codes
from supervisor.prepare import point_latest
from supervisor.stored_runs import upload_run_folder
from workers.store import Store, store_errors, why

LEDGER = ("in", "processed", "failed", "lost", "cancelled")


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def ledger(cluster, units_total: int) -> dict:
    """in = processed + failed + lost + cancelled over global ids, with every failure named. A run
    that came back counts by its report; one lost mid-way (or without a report) by the frames it
    delivered, and the rest of a run without a report is lost (or cancelled, stopped before it
    started)."""
    counts = {key: 0 for key in LEDGER}
    failures, cancelled_ids, processed_ids = [], [], []
    for run in cluster.runs:
        report = run_report(run)
        if report is None:
            processed, failed = delivered(run)
            processed_ids += processed
            failures += failed
            undelivered = [u for u in run.units for u in undone_parts(u, set(run.received.delivered))]
            if "interrupted before the run started" in run.result["stderr_tail"]:
                cancelled_ids += [i for u in undelivered for i in u.ids]
            else:
                reason = f"{run.node.label}: the runner exited with code {run.result['exit_code']} without a report"
                failures += _lost(undelivered, reason, run.node.label)
            continue
        processed_ids += [run.global_id(i) for first, last in report["frames"].get("processed_ids", [])
                          for i in range(first, last + 1)]
        failures += [dict(f, id=run.global_id(f["id"]), node=run.node.label) for f in report["frames"]["failures"]]
        cancelled_ids += [run.global_id(i) for first, last in report["frames"]["cancelled_ids"]
                          for i in range(first, last + 1)]
    for run in cluster.salvaged:
        processed, failed = delivered(run)
        processed_ids += processed
        failures += failed
    for unit, reason in cluster.lost:
        failures += _lost([unit], reason, None)
    counts["processed"] = len(processed_ids)
    counts["lost"] = sum(1 for f in failures if f.get("kind") == "lost")
    counts["failed"] = len(failures) - counts["lost"]
    cancelled_ids += [u.first_id + i for u in cluster.cancelled for i in range(u.frames)]
    counts["cancelled"] = len(cancelled_ids)
    counts["in"] = units_total
    twice = len(processed_ids) - len(set(processed_ids))
    accounted = counts["in"] == sum(counts[k] for k in LEDGER[1:]) and not twice
    return {**counts, "accounted": accounted, "failures": sorted(failures, key=lambda f: f["id"]),
            "cancelled_ids": id_ranges(cancelled_ids), "processed_ids": id_ranges(processed_ids),
            "processed_twice": twice}


def delivered(run) -> tuple[list[int], list[dict]]:
    """The global ids a run delivered processed, and its delivered failures."""
    processed = [i for i, failure in run.received.delivered.items() if failure is None]
    failed = [dict(failure, id=i, node=run.node.label) for i, failure in run.received.delivered.items() if failure]
    return processed, failed


def _lost(units, reason: str, node: str | None) -> list[dict]:
    return [{"id": i, "name": u.name, "stage": "cluster", "worker": node, "reason": reason, "kind": "lost"}
            for u in units for i in u.ids]


def node_rows(cluster) -> list[dict]:
    """A row per node: its runs' figures combined (one run, unless a node that died left work for
    a second: fps over the sum of their windows, CPU per frame and the bound weighted by measured
    frames, the bottleneck most of its frames had)."""
    rows = []
    for node in cluster.nodes:
        mine = [(run, run_report(run)) for run in cluster.runs if run.node is node]
        reports = [r for _run, r in mine if r]
        measured = sum(r["throughput"]["measured_frames"] for r in reports)
        window = sum(r["throughput"]["window_s"] for r in reports)
        weighted = [(r["throughput"]["measured_frames"], r["summary"]) for r in reports if r["throughput"]["measured_frames"]]
        cpu = [(m, s["cpu_ms_per_frame"]) for m, s in weighted if s.get("cpu_ms_per_frame")]
        bound = [(m, s["bound_fps"]) for m, s in weighted if s.get("bound_fps")]
        bottlenecks = Counter()
        for m, s in weighted:
            bottlenecks[s.get("bottleneck") or "unknown"] += m
        overheads = [r["throughput"]["window_start_unix"] - run.result["started_unix"] for run, r in mine
                     if r and r["throughput"].get("window_start_unix")]  # the runner's start, to its first frame
        fps = measured / window if window > 0 and measured else None
        bound_fps = sum(m for m, _ in bound) / sum(m / b for m, b in bound) if bound else None
        ends = [r["throughput"]["window_end_unix"] for r in reports if r["throughput"].get("window_end_unix")]
        rows.append({"node": node.label, "node_id": node.node_id, "host": node.host, "address": node.address, "cpus": node.cpus,
                     "gpus": node.gpus, "device": node.config.get("device", "-"), "runs": len(mine),
                     **{key: sum(r["frames"][key] for r in reports) for key in LEDGER},
                     "measured_frames": measured, "window_s": window, "window_end_unix": max(ends, default=None),
                     "fps": fps,
                     "cpu_ms_per_frame": sum(m * c for m, c in cpu) / sum(m for m, _ in cpu) if cpu else None,
                     "bound_fps": bound_fps, "efficiency": ratio(fps, bound_fps),
                     "bottleneck": bottlenecks.most_common(1)[0][0] if bottlenecks else None,
                     "runner_start_s": sum(overheads) / len(overheads) if overheads else None,
                     "status": node.gone or "ok"})
    for row, node in zip(rows, cluster.nodes):  # frames a run delivered before it was lost count too
        for run in cluster.salvaged + [run for run in cluster.runs if run_report(run) is None]:
            if run.node is node:
                processed, failed = delivered(run)
                row["processed"] += len(processed)
                row["failed"] += len(failed)
    return rows


def totals(cluster, rows: list[dict]) -> dict:
    reports = [r for r in map(run_report, cluster.runs) if r and r["throughput"]["measured_frames"]]
    spans = [(r["throughput"]["window_start_unix"], r["throughput"]["window_end_unix"]) for r in reports]
    measured = sum(r["throughput"]["measured_frames"] for r in reports)
    seconds = union_seconds(spans)
    fps = measured / seconds if seconds > 0 and measured else None
    latencies = [ms for r in reports for ms in r.get("frame_latency_ms", [])]
    bounds = [row["bound_fps"] for row in rows if row["bound_fps"]]
    bound = sum(bounds) if bounds else None
    started = [run.result["started_unix"] for run in cluster.runs]
    finished = [run.result["finished_unix"] for run in cluster.runs]
    return {"fps": fps, "measured_frames": measured, "window_s": seconds,
            "window_start_unix": min((s for s, _ in spans), default=None),
            "window_end_unix": max((e for _, e in spans), default=None),
            "wall_s": max(finished) - min(started) if started else 0.0, "latency_ms": summarise_ms(latencies),
            "bound_fps": bound, "efficiency": ratio(fps, bound), "connect_s": cluster.connect_s}


def exit_code_of(cluster, frames: dict, allow_failures: bool) -> tuple[int, str]:
    if cluster.interrupted_by:
        name = "SIGTERM" if cluster.interrupted_by == 15 else "SIGINT"
        return exit_codes.SIGNAL_EXIT_CODES[name], f"interrupted by {name}"
    aborted = [n for n in cluster.nodes if n.gone.startswith("its pipeline aborted")]
    if aborted and (frames["lost"] or frames["failed"]):
        return exit_codes.ABORTED, "; ".join(f"{n.label} {n.gone}" for n in aborted)
    if (frames["failed"] or frames["lost"]) and not allow_failures:
        return exit_codes.FRAMES_FAILED, f"{frames['failed']} frames failed, {frames['lost']} lost"
    incomplete = [run for run in cluster.runs if run.result["exit_code"] == exit_codes.OUTPUT_INCOMPLETE]
    if incomplete:  # a node whose disk or store refused its outputs
        return exit_codes.OUTPUT_INCOMPLETE, "; ".join(f"{run.node.label}: {_said(run.result)}" for run in incomplete)
    return exit_codes.OK, "finished"


def _said(result: dict) -> str:
    try:
        return json.loads(result["stdout"]).get("reason") or "some outputs could not be written"
    except ValueError:
        return "some outputs could not be written"


def build(cluster, run_id: str, config: dict, address: str, units_total: int) -> dict:
    rows = node_rows(cluster)
    frames = ledger(cluster, units_total)
    total = totals(cluster, rows)
    code, reason = exit_code_of(cluster, frames, bool(config.get("allow_failures")))
    runs = [{"run": run.index, "node": run.node.label, "units": len(run.units),
             "frames": sum(u.frames for u in run.units), "exit_code": run.result["exit_code"],
             "seconds": run.result["finished_unix"] - run.result["started_unix"]} for run in cluster.runs]
    summary = {"run_id": run_id, **{("frames_in" if k == "in" else k): frames[k] for k in LEDGER},
               "accounted": frames["accounted"], "fps": total["fps"], "window_s": total["window_s"],
               "wall_s": total["wall_s"], "latency_p50_ms": total["latency_ms"]["p50"],
               "latency_p95_ms": total["latency_ms"]["p95"], "latency_p99_ms": total["latency_ms"]["p99"],
               "bound_fps": total["bound_fps"], "efficiency": total["efficiency"],
               "nodes": [{k: row[k] for k in ("node", "host", "device", "processed", "fps", "status")} for row in rows],
               "exit_code": code, "reason": reason}
    return {"run_id": run_id, "config": config, "cluster": {"address": address, "nodes": rows, "runs": runs,
            "requeued": cluster.requeued}, "frames": frames, "throughput": total, "latency_ms": total["latency_ms"],
            "bottleneck": {"bound_fps": total["bound_fps"], "efficiency": total["efficiency"]}, "summary": summary}


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    s, t = report["summary"], report["throughput"]
    lines = [f"# Cluster run {report['run_id']}", "",
             f"Frames: {s['frames_in']} in, {s['processed']} processed, {s['failed']} failed, {s['lost']} lost, "
             f"{s['cancelled']} cancelled ({'accounted' if s['accounted'] else 'NOT accounted'}); {s['reason']}.", "",
             f"Throughput {_f(t['fps'])} fps over the union of the nodes' windows ({_f(t['window_s'])} s); "
             f"latency p50 {_f(s['latency_p50_ms'])} p95 {_f(s['latency_p95_ms'])} p99 {_f(s['latency_p99_ms'])} ms; "
             f"bound {_f(t['bound_fps'])} fps (sum of the nodes'); efficiency {_f((t['efficiency'] or 0) * 100, 0)} %.",
             "", "| node | host | CPUs | GPUs | device | runs | processed | fps | CPU ms/frame | bound fps | efficiency "
             "| bottleneck | runner start s | status |", "|" + " --- |" * 14]
    for r in report["cluster"]["nodes"]:
        lines.append(f"| {r['node']} | {r['host']} | {r['cpus']} | {r['gpus']} | {r['device']} | {r['runs']} | "
                     f"{r['processed']} | "
                     f"{_f(r['fps'])} | {_f(r['cpu_ms_per_frame'])} | {_f(r['bound_fps'])} | "
                     f"{_f((r['efficiency'] or 0) * 100, 0)} % | {r['bottleneck'] or '-'} | {_f(r['runner_start_s'])} | "
                     f"{r['status']} |")
    for requeued in report["cluster"]["requeued"]:
        lines.append(f"\n{requeued['frames']} frames ran again elsewhere: "
                     f"{requeued['node']} {requeued['reason']}.")
    return "\n".join(lines) + "\n"


def stored_outputs(root: str) -> dict[str, int]:
    """The objects below each output folder of a run folder in a store (the nodes wrote them)."""
    store = Store(root)
    try:
        return {top: len(store.below(top)) for top in OUTPUT_DIRS}
    except store_errors() as exc:
        return {"error": why(exc)}


def write_run_folder(run_dir: str, cluster, run_id: str, config: dict, address: str, units_total: int,
                     class_names, store_root: str = "") -> dict:
    """Every merged file, report.json last but one and results/latest last; returns the report.
    With ``store_root`` (``RESULTS/NAME`` in a store, where the nodes wrote their outputs) the
    files are written into the local ``run_dir`` and uploaded there, report.json last; a file
    that could not be is exit 4, said in the returned report's summary."""
    outputs = cluster.inbox.write_lists(class_names)
    if store_root:
        outputs["files"] = stored_outputs(store_root)
    report = build(cluster, run_id, config, address, units_total)
    report["outputs"] = outputs
    origin = min((run.result["started_unix"] for run in cluster.runs), default=0.0)
    write_bytes_atomic(os.path.join(run_dir, "trace.json"),
                       json.dumps(merged_trace(cluster.runs, cluster.nodes, origin)).encode())
    write_bytes_atomic(os.path.join(run_dir, "report.md"), markdown(report).encode())
    write_bytes_atomic(os.path.join(run_dir, "report.json"), json.dumps(json_safe(report), indent=1).encode())
    if store_root:
        _upload(run_dir, store_root, report["summary"])
    else:
        point_latest(run_dir)
    return report


def _upload(run_dir: str, root: str, summary: dict) -> None:
    failed = upload_run_folder(run_dir, root)
    if failed:
        name, reason = next(iter(failed.items()))
        said = f"could not upload {len(failed)} files of the run folder to {root}, {name}: {reason}"
        if summary["exit_code"] == exit_codes.OK:
            summary["exit_code"], summary["reason"] = exit_codes.OUTPUT_INCOMPLETE, said
        else:
            summary["reason"] = f"{summary['reason']}; {said}"
