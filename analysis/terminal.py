"""The few lines the runner prints at the end of a run, from the summary alone (report.json may
not have been written)."""

from __future__ import annotations

from analysis.printable import printable
from topology.stages import frame_roles, title

MIB = 1 << 20


def _or_blank(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'':>{width}}"


def format_summary(summary: dict, report: dict | None = None) -> str:
    """At most 14 lines. ``report`` is accepted for today's runner, which passes report.json's
    content, and is not read: the summary holds everything printed."""
    lines = [f"run {summary['run_id']}: {summary['frames_in']} frames in, {summary['processed']} processed, "
             f"{summary['failed']} failed, {summary['lost']} lost, {summary['cancelled']} cancelled"]
    source = _source_line(summary)
    if source:
        lines.append(source)
    if summary["fps"] is None:
        lines.append(f"throughput  n/a: {summary['stable_reason']}")
    else:
        stable = "stable" if summary["stable"] else f"NOT STABLE: {summary['stable_reason']}"
        lines.append(f"throughput  {summary['fps']:.2f} fps over {summary['window_s']:.2f} s "
                     f"({summary['measured_frames']} measured frames); {stable}")
    if summary["latency_p50_ms"] is not None:
        lines.append(f"latency     p50 {summary['latency_p50_ms']:.1f}  p95 {summary['latency_p95_ms']:.1f}  "
                     f"p99 {summary['latency_p99_ms']:.1f} ms")
    if summary.get("precision"):
        lines.append(f"model       {summary['precision']}, {summary['backend']}")
    lines.append(_cpu_line(summary))
    lines.append(f"{'stage':<8}{'workers':>8}{'wall ms':>9}{'CPU ms':>8}{'busy %':>8}{'CPU %':>7}{'PSS MiB':>9}")
    for role in frame_roles():
        s = summary["stages"][role]
        lines.append(f"{role:<8}{s['workers']:>8}{_or_blank(s['ms_per_frame'], '.1f', 9)}"
                     f"{_or_blank(s['cpu_ms_per_frame'], '.1f', 8)}"
                     f"{100 * s['utilisation']:>8.0f}{_or_blank(_times_100(s['cpu_utilisation']), '.0f', 7)}"
                     f"{_or_blank(s['peak_pss_bytes'] and s['peak_pss_bytes'] / MIB, '.0f', 9)}")
    if summary["bottleneck"]:
        lines.append(f"bottleneck  {title(summary['bottleneck'])} ({summary['limit']})"
                     + (f": {summary['hint']}" if summary["hint"] else ""))
    if summary.get("run_dir"):
        videos = summary.get("videos_saved") or []
        saved = f" ({summary.get('images_saved') or 0} images, annotated {', '.join(videos)})" if videos else ""
        lines.append(f"run folder  {summary['run_dir']}{saved}")
    failed = (summary.get("files") or {}).get("failed")
    if failed:
        lines.append(f"NOT WRITTEN {', '.join(failed)}: {next(iter(failed.values()))}")
    return printable("\n".join(lines))  # stdout is strict UTF-8: a source name that is not must not end the run


def _source_line(summary: dict) -> str:
    """Frames a live source dropped and its errors, when there were any."""
    parts = []
    dropped = summary.get("dropped_at_source") or 0
    if dropped:
        parts.append(f"{dropped} frames dropped at the source (newer frames replaced them while the pipeline was busy)")
    skipped = summary.get("skipped_files") or 0
    if skipped:
        parts.append(f"{skipped} file{'s' if skipped > 1 else ''} left out: not images or videos")
    errors = summary.get("stream_errors") or []
    if errors:
        parts.append(f"{len(errors)} stream error{'s' if len(errors) > 1 else ''}: {errors[0]}")
    return "source      " + "; ".join(parts) if parts else ""


def _times_100(value: float | None) -> float | None:
    return None if value is None else 100 * value


OTHER_LOAD_NOTE_CORES = 0.2  # other jobs' load worth a mention on the terminal


def _cpu_line(summary: dict) -> str:
    parts = []
    if summary["cpu_ms_per_frame"] is not None:
        parts.append(f"{summary['cpu_ms_per_frame']:.1f} CPU-ms per frame")
    if summary["cpu_saturation"] is not None:
        parts.append(f"cores {100 * summary['cpu_saturation']:.0f} % busy")
    other = summary.get("other_load_cores")
    if other is not None and other >= OTHER_LOAD_NOTE_CORES:
        parts.append(f"other jobs kept {other:.1f} of {summary['machine_cores']} cores busy")
    if summary["bound_fps"] is not None:
        kind = "CPU cores" if summary["bound_kind"] == "cores" else summary["bound_kind"]
        parts.append(f"bound {summary['bound_fps']:.1f} fps ({kind})")
    if summary["efficiency"] is not None:
        parts.append(f"efficiency {100 * summary['efficiency']:.0f} %")
    return "cpu         " + ("; ".join(parts) if parts else "n/a")
