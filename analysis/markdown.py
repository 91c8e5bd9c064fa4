"""report.md: what a person reads first, from report.json's content."""

from __future__ import annotations

from topology.stages import frame_roles, title
from analysis.trace import process_label
from yolo.module_stats import RESIDUAL_NAME


TOP_MODULES = 15
LISTED_FAILURES = 20
MIB = 1 << 20
NESTED_MARK = "↳ "
PLOT_CAPTIONS = {"plots.png": "frames completed and fps per window", "latency.png": "latency histogram and CDF",
                 "timeline.png": "frames through each process", "modules.png": "time per module",
                 "resources.png": "CPU and memory per process"}
BOUND_NOTE = ("Every figure here was measured under this run's own load: the processes share the cores "
              "(hyperthreads, caches, memory bandwidth), so a bound computed from each process timed alone "
              "would not be reachable by the loaded pipeline.")



def _f(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}"


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value / MIB:.0f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def config_line(report: dict) -> str:
    """Device, workers per role with their torch threads, batch size, letterbox and weights."""
    cfg = report["config"]
    weights = cfg.get("weights") or "random weights (detections meaningless)"
    if not cfg.get("weights") and cfg.get("preset"):
        weights = f"{cfg['preset']} with {weights}"
    roles = []
    for role in frame_roles():
        stage = report["stages"][role]
        threads = sorted({(w.get("threads") or {}).get("torch") for w in stage["per_worker"]} - {None})
        shown = f" x {'/'.join(map(str, threads))} torch thread{'s' if threads != [1] else ''}" if threads else ""
        roles.append(f"{stage['workers']} {role}{shown}")  # no torch in a stage, no torch threads to show
    letterbox = "rect" if cfg.get("rect") else "square"
    machine = report["machine"]
    inference = report.get("inference") or {}
    model = f"{inference['precision']}, {inference['backend']}; " if inference else ""
    if inference.get("data_path"):
        model += f"data path {inference['data_path']}; "
    for gpu in inference.get("devices") or []:
        busy = "n/a" if gpu["busy"] is None else f"{gpu['busy']:.0%}"
        model += (f"{gpu['device']} busy {busy} at most, memory {gpu['memory_reserved_peak_bytes'] / 2**30:.2f} of "
                  f"{gpu['memory_total_bytes'] / 2**30:.0f} GiB at peak; ")
    return (f"Device {cfg.get('device')} ({machine['cores']} cores); {', '.join(roles)}; batch {cfg.get('batch_size')}; "
            f"imgsz {cfg.get('imgsz')} {letterbox}; {model}{weights}.")


def frames_lines(report: dict) -> list[str]:
    fr = report["frames"]
    lines = [f"Frames in {fr['in']}: processed {fr['processed']}, failed {fr['failed']}, lost {fr['lost']}, "
             f"cancelled {fr['cancelled']} (accounted: {'yes' if fr['accounted'] else 'NO'}). "
             f"Measured {fr['measured']}: {_warmup_words(fr['warmup'])} and {fr['cold']} frames of cold forwards "
             "(the first of an input shape in a process) are excluded from fps and latency.", ""]
    stop = report["stop"]
    if stop["reason"]:
        lines += [f"Stopped: {stop['reason']}" + (f" (signal {stop['signal']})" if stop["signal"] else "") + ".", ""]
    if report["outputs"]["image_error"]:
        lines += [f"Saving images failed: {report['outputs']['image_error']}.", ""]
    videos = report["sources"].get("videos") or []
    if videos:
        lines += ["Annotated videos: " + "; ".join(f"[{v['video']}]({v['video']}), {v['frames']} frames at "
                                                   f"{v['fps']:g} fps" + (f", {v['missing']} missing" if v["missing"]
                                                                         else "") for v in videos)
                  + f". Images saved: {report['outputs']['images_saved']}.", ""]
    skipped = report["sources"].get("skipped") or []
    if skipped:
        lines += ["Left out of the source: " + "; ".join(skipped) + ".", ""]
    return lines


def _warmup_words(warmup: int) -> str:
    return f"the warm-up frames (ids below {warmup})" if warmup else "no warm-up frames"


def failure_lines(failures: list[dict]) -> list[str]:
    lines = [f"- frame {x['id']} {x['name']}: {x.get('kind', 'failed')} in {x.get('stage')} on {x.get('worker')}: "
             f"{x.get('reason')}" for x in failures[:LISTED_FAILURES]]
    if len(failures) > LISTED_FAILURES:
        lines.append(f"- ... {len(failures) - LISTED_FAILURES} more")
    return lines


def incident_lines(report: dict) -> list[str]:
    """Restarts, cancelled frames, live streams and dropped messages, when there were any."""
    lines = []
    if report["restarts"]:
        lines += ["## Restarts", ""]
        lines += _table(["process", "incarnation", "signal", "exit code", "at s (since the first read)", "frames resent"],
                        [[r["name"], str(r["incarnation"]), str(r.get("signal") or ""), str(r.get("exit_code", "")),
                          _f(r.get("at_s"), 2), str(r.get("frames_resent", ""))] for r in report["restarts"]])
        lines.append("")
    cancelled, count = report["frames"]["cancelled_frames"], report["frames"]["cancelled"]
    if count:
        names = ", ".join(c["name"] for c in cancelled[:LISTED_FAILURES])
        more = f" and {count - LISTED_FAILURES} more" if count > LISTED_FAILURES else ""
        lines += ["## Cancelled frames", "", f"{count} frames never started because the run stopped: "
                  f"{names}{more}.", ""]
    sources = report["sources"]
    if sources["streams"] or sources["stream_errors"]:
        lines += ["## Live streams", "", f"{sources['dropped_at_source']} frames dropped at the source in all "
                  "(a newer frame replaced each while the pipeline was busy).", ""]
        lines += _table(["stream", "grabbed", "kept (vid-stride)", "delivered", "dropped", "reconnects"],
                        [[s["name"], str(s["grabbed"]), str(s["kept"]), str(s["delivered"]), str(s["dropped"]),
                          str(s["reconnects"])] for s in sources["streams"]])
        lines += [""] + [f"- error: {e}" for e in sources["stream_errors"]] + ([""] if sources["stream_errors"] else [])
    if report["dropped_messages"]:
        lines += ["## Dropped messages", ""]
        lines += [f"- {name}: " + ", ".join(f"{count} {kind}" for kind, count in kinds.items())
                  for name, kinds in report["dropped_messages"].items()] + [""]
    return lines


def throughput_lines(report: dict) -> list[str]:
    th, lat = report["throughput"], report["latency_ms"]
    fps = _f(th["fps"], 2) if th["fps"] is not None else "n/a"
    lines = ["## Throughput and latency", ""]
    lines += _table(["fps", "window s", "measured frames", "stable", "latency p50 ms", "p90", "p95", "p99", "max"],
                    [[fps, _f(th["window_s"], 2), str(th["measured_frames"]), "yes" if th["stable"] else "NO",
                      *((_f(lat[k]) if lat["count"] else "") for k in ("p50", "p90", "p95", "p99", "max"))]])
    lines.append("")
    if th["windows"]:
        lines.append(f"fps per {th['slice_s']:g} s window (aligned to the window's end): "
                     + ", ".join(_f(w["fps"]) for w in th["windows"]) + ".")
    if th["stable"]:
        lines.append(f"Stable: the last {th['windows_needed']} windows agree within "
                     f"{100 * th['tolerance']:.0f} % (max / min, {100 * th['spread']:.1f} % apart).")
    else:
        lines.append(f"**Not stable**: {th['reason']}.")
    lines += ["", "| interval | p50 ms | p95 ms | max ms |", "|---|---|---|---|"]
    lines += [f"| {name} | {_f(s['p50'])} | {_f(s['p95'])} | {_f(s['max'])} |"
              for name, s in report["stage_latency_ms"].items()]
    return lines + [""]


def bound_lines(report: dict) -> list[str]:
    cpu, neck, stages = report["cpu"], report["bottleneck"], report["stages"]
    lines = ["## CPU per frame and the bound", ""]
    if cpu["cpu_ms_per_frame"] is not None:
        used = (f", using {100 * cpu['saturation']:.0f} % of the {cpu['cores']:.2f} cores it had over the measured window"
                if cpu["saturation"] is not None else "")
        lines.append(f"The pipeline spends {cpu['cpu_ms_per_frame']:.1f} CPU-ms per frame ({cpu['source']}){used}.")
        if cpu.get("other_load_cores"):
            lines.append(f"Other jobs on this machine kept {cpu['other_load_cores']:.2f} of its {cpu['machine_cores']} "
                         "cores busy in that window; the CPU bound counts only the cores left to this run.")
    rows = []
    for role in frame_roles():
        cap = stages[role]["capacity"]
        if stages[role]["workers"]:
            rows.append([title(role), str(stages[role]["workers"]), _f(cap["ms_per_frame"]), cap["basis"],
                         _f(neck["stage_capacity_fps"].get(role))])
    if neck["cores_bound_fps"]:
        rows.append(["CPU cores", _f(cpu["cores"], 2), _f(cpu["cpu_ms_per_frame"]), "cpu, all processes",
                     _f(neck["cores_bound_fps"])])
    lines += [""] + _table(["limit", "workers / cores", "ms per frame", "ms of", "capacity fps"], rows) + [""]
    if neck["bound_fps"]:
        kind = "the CPU cores" if neck["bound_kind"] == "cores" else f"{title(neck['bound_kind'])}'s capacity"
        reached = (f"; this run reached {report['throughput']['fps']:.1f} fps: efficiency "
                   f"{100 * neck['efficiency']:.0f} %" if neck["efficiency"] is not None else "")
        lines.append(f"Bound: **{neck['bound_fps']:.1f} fps**, set by {kind}{reached}.")
    return lines + ["", BOUND_NOTE, ""]


def bottleneck_lines(report: dict) -> list[str]:
    neck = report["bottleneck"]
    if neck["stage"] is None:
        return ["## Bottleneck", "", neck["evidence"] + ".", ""]
    limit = {"cores": "the CPU cores are the limit", "stage": "it is the limit",
             "flow": "but it does not limit the run", "unmeasured": "too short a run to say more",
             "source": "the live source limits the run"}[neck["limit"]]
    lines = ["## Bottleneck", "", f"**{title(neck['stage'])}** is the busiest stage; {limit}: {neck['evidence']}.",
             ""]
    if neck["levers"]:
        lines += ["What to change:", ""] + [f"- {lever['text']}" for lever in neck["levers"]] + [""]
    return lines


def stage_lines(report: dict) -> list[str]:
    rows = []
    for role in frame_roles():
        stage = report["stages"][role]
        for w in stage["per_worker"]:
            rows.append([role, process_label(w), str(w["frames"]), _f(w["ms_per_frame"]["p50"]),
                         _f(w["ms_per_frame"]["mean"]), _f(w["cpu_ms_mean"]), _pct(w["utilisation"]),
                         _pct(w["cpu_utilisation"]), _f(w["wait_in_s"], 2), _f(w["blocked_out_s"], 2),
                         _mib(w["peak_pss_bytes"])])
        rows.append([f"**{role}**", f"{stage['workers']} workers", str(stage["frames"]),
                     _f(stage["ms_per_frame"]["p50"]), _f(stage["ms_per_frame"]["mean"]), _f(stage["cpu_ms_mean"]),
                     _pct(stage["utilisation"]), _pct(stage["cpu_utilisation"]), _f(stage["wait_in_s"], 2),
                     _f(stage["blocked_out_s"], 2), _mib(stage["peak_pss_bytes"])])
    lines = ["## Stages", "", "Wall ms per frame beside CPU ms per frame (every thread of the process); busy % by wall time "
             "and by CPU time; peak PSS in MiB.", ""]
    return lines + _table(["stage", "worker", "frames", "wall ms p50", "wall ms mean", "CPU ms mean", "busy %",
                           "CPU busy %", "wait in s", "blocked out s", "peak PSS MiB"], rows) + [""]


def resource_lines(report: dict) -> list[str]:
    usage = report["resources"]
    if not usage["processes"]:
        return []
    lines = ["## Resources", ""]
    lines += _table(["process", "role", "pid", "mean CPU %", "peak RSS MiB", "mean RSS MiB", "peak PSS MiB",
                     "mean PSS MiB"],
                    [[name, str(p["role"]), str(p["pid"]), _f(p["cpu_percent_mean"], 0), _mib(p["peak_rss_bytes"]),
                      _mib(p["mean_rss_bytes"]), _mib(p["peak_pss_bytes"]), _mib(p["mean_pss_bytes"])]
                     for name, p in usage["processes"].items()])
    if usage["peak_pss_total_bytes"] is not None:
        lines += ["", f"Peak PSS of all processes together: {_mib(usage['peak_pss_total_bytes'])} MiB."]
    return lines + [""]


def module_table_rows(modules: list[dict]) -> list[dict]:
    """report.md's module rows: the TOP_MODULES outermost rows of the forward with the most time,
    one row for the other outermost ones, the residual; then the nested rows with the most time
    (``nested``: their time is inside an outermost row's already); then functions timed outside
    the forward (share None). ``counted`` rows' shares sum to the whole forward."""
    in_forward = [r for r in modules if r.get("share") is not None]
    outermost = sorted((r for r in in_forward if r.get("outermost", True) and r["name"] != RESIDUAL_NAME),
                       key=lambda r: -r["total_ms"])
    top, rest = outermost[:TOP_MODULES], outermost[TOP_MODULES:]
    rows = [{**r, "nested": False, "counted": True} for r in top]
    if rest:
        rows.append({"name": f"({len(rest)} other outermost modules)", "type": "", "calls": sum(r["calls"] for r in rest),
                     "total_ms": sum(r["total_ms"] for r in rest), "mean_ms": None, "p95_ms": None,
                     "share": sum(r["share"] for r in rest), "nested": False, "counted": True})
    rows += [{**r, "nested": False, "counted": True} for r in in_forward if r["name"] == RESIDUAL_NAME]
    nested = sorted((r for r in in_forward if not r.get("outermost", True)), key=lambda r: -r["total_ms"])
    rows += [{**r, "nested": True, "counted": False} for r in nested[:TOP_MODULES]]
    rows += [{**r, "nested": False, "counted": False} for r in modules if r.get("share") is None]
    return rows


def module_lines(report: dict) -> list[str]:
    rows = module_table_rows(report["modules"])
    if not rows:
        return []
    fwd = report["forward"]
    lines = ["## Modules", "", f"{fwd.get('forwards', 0)} forwards, mean {_f(fwd.get('mean_ms'), 2)} ms, "
             f"p50 {_f(fwd.get('p50_ms'), 2)} ms, p95 {_f(fwd.get('p95_ms'), 2)} ms"
             + (f", timed with {fwd['timing_mode']}" if fwd.get("timing_mode") else "") + ". Shares are of the whole forward: "
             f"the rows without {NESTED_MARK.strip()} add up to 100 %; a {NESTED_MARK.strip()} row runs inside an "
             "outermost one (its share, in parentheses, is already counted there); rows without a share ran "
             "outside the forward.", ""]
    table = []
    for r in rows:
        share = "" if r["share"] is None else _f(100 * r["share"])
        table.append([(NESTED_MARK if r["nested"] else "") + r["name"], r["type"], str(r["calls"]),
                      _f(r["total_ms"], 2), _f(r["mean_ms"], 3), _f(r["p95_ms"], 3),
                      f"({share})" if r["nested"] else share])
    return lines + _table(["module", "type", "calls", "total ms", "mean ms", "p95 ms", "share %"], table) + [""]


def link_lines(report: dict) -> list[str]:
    return ["## Links", ""] + _table(["link", "frames", "bytes per frame"],
                                     [[name, str(link["frames"]), f"{link['bytes_per_frame']:,.0f}"]
                                      for name, link in report["links"].items()]) + [""]


def plot_lines(report: dict) -> list[str]:
    plots = report.get("plots", [])
    if not plots:
        return []
    return ["## Plots", ""] + [f"- [{name}]({name}): {PLOT_CAPTIONS.get(name, '')}" for name in plots] + [""]


def markdown(report: dict) -> str:
    lines = [f"# Run {report['run_id']}", "", config_line(report), ""]
    lines += frames_lines(report)
    if report["frames"]["failures"]:
        lines += failure_lines(report["frames"]["failures"]) + [""]
    lines += incident_lines(report)
    lines += throughput_lines(report)
    lines += bottleneck_lines(report)
    lines += bound_lines(report)
    lines += stage_lines(report)
    lines += resource_lines(report)
    lines += link_lines(report)
    lines += module_lines(report)
    lines += plot_lines(report)
    return "\n".join(lines)
