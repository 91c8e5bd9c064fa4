"""The run folder's plots, drawn with matplotlib's Agg backend (no display needed) into PNG
bytes that the run folder writes whole or not at all: plots.png (frames completed, fps per window, stability), latency.png
(histogram and CDF), timeline.png (frames through each process, Gantt-like), modules.png (time
per outermost module) and resources.png (CPU % and memory per process). A missing or failing
matplotlib skips the plots with a warning: the other reports stand alone."""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np

from analysis.resources import PSS, RSS, cumulative_cpu
from analysis.run_data import RunData
from topology.stages import done_time, frame_roles, trace_spans
from analysis.windows import is_measured
from yolo.module_stats import RESIDUAL_NAME

log = logging.getLogger(__name__)

PLOT_DPI = 80
TIMELINE_MAX_FRAMES = 60  # frames drawn in timeline.png, from the start of the measured window
TOP_PLOTTED_MODULES = 20
STAGE_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
MIB = 1 << 20


def headless_pyplot(what: str):
    """matplotlib.pyplot on the Agg backend, or None (with a warning naming ``what`` is skipped)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        log.warning("no %s: matplotlib unavailable (%s)", what, exc)
        return None
    return plt


def figure_png(plt, fig) -> bytes:
    """The figure as PNG bytes; the figure is closed whatever happens (pyplot keeps them all)."""
    try:
        with warnings.catch_warnings(record=True) as caught:  # a warning would reach the terminal as it is
            warnings.simplefilter("always")
            fig.tight_layout()
        for warning in {str(w.message) for w in caught}:  # e.g. 64 workers' rows: no room for tight margins
            log.info("a plot kept matplotlib's default layout: %s", warning)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=PLOT_DPI)
        return out.getvalue()
    finally:
        plt.close(fig)


def render_plots(run: RunData, report: dict) -> dict[str, bytes]:
    """{file name: PNG bytes} of every plot that has data to show; {} without matplotlib."""
    plt = headless_pyplot("plots")
    if plt is None:
        return {}
    figures = {"plots.png": throughput_figure, "latency.png": latency_figure, "timeline.png": timeline_figure,
               "modules.png": modules_figure, "resources.png": resources_figure}
    rendered = {}
    for name, draw in figures.items():
        try:
            data = _render(plt, draw, run, report)
        except (RuntimeError, ValueError, TypeError, OSError) as exc:
            log.warning("no %s: matplotlib failed (%s)", name, exc)
            continue
        if data is not None:
            rendered[name] = data
    return rendered


def _render(plt, draw, run: RunData, report: dict) -> bytes | None:
    fig = draw(plt, run, report)
    return None if fig is None else figure_png(plt, fig)


def throughput_figure(plt, run: RunData, report: dict):
    """Frames completed over time with the measured window shaded; fps per window, the last
    ones (those judged for stability) marked, with the tolerance band around their mean."""
    th = report["throughput"]
    finished = done_time()
    ends = sorted(f["t"][finished] - run.started_s for f in run.frames)
    fig, (done, per_window) = plt.subplots(1, 2, figsize=(11, 4))
    done.step(ends, range(1, len(ends) + 1), where="post")
    start, end = th["window_start_s"], th["window_start_s"] + th["window_s"]
    if end > start:
        done.axvspan(start, end, alpha=0.15, label="measured window")
        done.legend(loc="upper left")
    fps = "n/a" if th["fps"] is None else f"{th['fps']:.1f} fps"
    done.set(xlabel="s since the first read", ylabel="frames completed", title=f"{fps} in the measured window")
    windows = th["windows"]
    if windows:
        judged = len(windows) - th["windows_needed"]
        centres = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
        colours = ["tab:orange" if i >= judged else "tab:blue" for i in range(len(windows))]
        per_window.bar(centres, [w["fps"] for w in windows], width=th["slice_s"] * 0.9, color=colours)
        if judged >= 0:
            mean = float(np.mean([w["fps"] for w in windows[judged:]]))
            per_window.axhspan(mean / (1 + th["tolerance"] / 2), mean * (1 + th["tolerance"] / 2), alpha=0.2,
                               color="tab:orange", label=f"±{100 * th['tolerance'] / 2:.0f} % of the last windows' mean")
            per_window.legend(loc="lower left")
    else:
        per_window.text(0.5, 0.5, "no whole window", ha="center", va="center", transform=per_window.transAxes)
    verdict = "stable" if th["stable"] else "not stable"
    per_window.set(xlabel="s since the first read", ylabel="fps",
                   title=f"fps per {th['slice_s']:g} s window: {verdict}")
    return fig


def latency_figure(plt, run: RunData, report: dict):
    done = done_time()
    latencies = np.array([(f["t"][done] - f["t"]["read_start"]) * 1e3 for f in run.frames
                          if is_measured(f, run.warmup)])
    if latencies.size == 0:
        return None
    lat = report["latency_ms"]
    marks = {"p50": "tab:green", "p95": "tab:orange", "p99": "tab:red"}
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    hist.hist(latencies, bins=min(50, max(10, latencies.size // 5)))
    ordered = np.sort(latencies)
    cdf.plot(ordered, np.arange(1, ordered.size + 1) / ordered.size, drawstyle="steps-post")
    for axes in (hist, cdf):
        for key, colour in marks.items():
            axes.axvline(lat[key], color=colour, linestyle="--", label=f"{key} {lat[key]:.1f} ms")
        axes.set_xlabel("end-to-end latency (ms): read to postprocess done")
    hist.set(ylabel="frames", title=f"latency of {latencies.size} measured frames")
    cdf.set(ylabel="fraction of frames", title="cumulative distribution")
    hist.legend(loc="upper right")
    return fig


def stage_colour(role: str) -> str:
    """A frame stage's colour, by its place in the flow (pre blue, infer orange, post green, ...)."""
    return STAGE_COLOURS[frame_roles().index(role) % len(STAGE_COLOURS)]


def timeline_figure(plt, run: RunData, report: dict):
    """A row per process, a bar per frame per stage, over the first TIMELINE_MAX_FRAMES frames
    read from the start of the measured window (all frames in a shorter run)."""
    frames = sorted(run.frames, key=lambda f: f["t"]["read_start"])
    if not frames:
        return None
    window_start = run.started_s + report["throughput"]["window_start_s"]
    if len(frames) > TIMELINE_MAX_FRAMES:
        first = next((i for i, f in enumerate(frames) if f["t"]["read_start"] >= window_start), 0)
        frames = frames[first:first + TIMELINE_MAX_FRAMES]
    rows = _timeline_rows(run, frames)
    fig, axes = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for role, label, t0, t1 in trace_spans():
        bars: dict[int, list[tuple[float, float]]] = {}
        for f in frames:
            name = f.get("workers", {}).get(role)
            if name in rows:
                bars.setdefault(rows[name], []).append((f["t"][t0] - run.started_s, f["t"][t1] - f["t"][t0]))
        for row, spans in bars.items():
            # edges in the stage's colour: black ones made a short span a grey tick the legend did not name
            colour = stage_colour(role)
            axes.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, edgecolors=colour,
                             linewidth=0.4, label=label if row == min(bars) else None)
    axes.set_yticks(list(rows.values()), list(rows))
    axes.invert_yaxis()
    axes.set_xlabel("s since the first read")
    axes.set_title(f"frames {frames[0]['id']}..{frames[-1]['id']} ({len(frames)}) through each process", loc="left")
    axes.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize="small", frameon=False)
    return fig


def _timeline_rows(run: RunData, frames: list[dict]) -> dict[str, int]:
    names = {f.get("workers", {}).get(role) for f in frames for role in frame_roles()} - {None}
    roles = {w["name"]: w["role"] for w in run.workers}
    ordered = sorted(names, key=lambda n: (frame_roles().index(roles[n]) if roles.get(n) in frame_roles() else len(frame_roles()), n))
    return {name: i for i, name in enumerate(ordered)}


def module_label(row: dict) -> str:
    """``model.24 (Detect)``: the module's name with its type, which the bare index hides."""
    kind = row.get("type")
    return f"{row['name']} ({kind})" if kind and row["name"] != RESIDUAL_NAME else row["name"]


def modules_figure(plt, run: RunData, report: dict):
    rows = [r for r in report["modules"] if r.get("share") is not None and r.get("outermost", True)]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: -r["total_ms"])[:TOP_PLOTTED_MODULES]
    fig, axes = plt.subplots(figsize=(9, 1.0 + 0.3 * len(rows)))
    colours = ["tab:gray" if r["name"] == RESIDUAL_NAME else "tab:blue" for r in rows]
    axes.barh([module_label(r) for r in rows], [100 * r["share"] for r in rows], color=colours)
    for i, r in enumerate(rows):
        axes.text(100 * r["share"], i, f" {r['mean_ms']:.2f} ms", va="center", fontsize="small")
    axes.invert_yaxis()
    axes.set(xlabel="share of the forward (%)", title=f"top {len(rows)} outermost modules by time")
    return fig


def memory_series(samples: list) -> tuple[str, list[tuple[float, float]]]:
    """("PSS" or "RSS", [(t_s, bytes)]): one measure per process, never the two mixed (PSS is
    read on fewer samples than RSS, and a line through both zigzags between them)."""
    for measure, column in (("PSS", PSS), ("RSS", RSS)):
        points = [(s[0], s[column]) for s in samples if s[column] is not None]
        if points:
            return measure, points
    return "PSS", []


def resources_figure(plt, run: RunData, report: dict):
    if not run.resources:
        return None
    fig, (cpu_axes, memory_axes) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for name, entry in sorted(run.resources.items()):
        samples = entry.get("samples", [])
        if len(samples) < 2:
            continue
        t, cpu = cumulative_cpu(samples)
        cpu_axes.plot(t[1:] - run.started_s, 100 * np.diff(cpu) / np.maximum(np.diff(t), 1e-9), label=name)
        measure, memory = memory_series(samples)
        if memory:
            memory_axes.plot([t - run.started_s for t, _ in memory], [b / MIB for _, b in memory],
                             marker=".", label=name if measure == "PSS" else f"{name} (RSS)")
    cpu_axes.set(ylabel="CPU % (100 = one core)", title="CPU per process")
    memory_axes.set(xlabel="s since the first read", ylabel="PSS MiB", title="memory per process "
                    "(PSS; RSS, marked, for a process whose PSS was never read)")
    memory_axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    cpu_axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig
