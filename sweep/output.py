"""What a sweep leaves and prints: sweep.csv and sweep.json (one row per trial), the summary
object ``--json`` prints, the terminal table, and the best settings as a command line."""

from __future__ import annotations

import csv
import io
import shlex

from analysis.report import json_safe
from topology.stages import title
from settings.config import SWITCHES_OFF, flag_of
from sweep.search import SWEPT, SweepResult, Trial, mean_fps

TRIAL_COLUMNS = ("trial", "purpose", *SWEPT, "fps", "latency_p50_ms", "latency_p95_ms", "cpu_ms_per_frame",
                 "cpu_saturation", "bound_fps", "bound_kind", "bottleneck", "limit", "stable", "cost_s", "verdict",
                 "reason", "exit_code", "error", "run_dir")
# Flags whose value is the opposite of their name (store_const False in runner.py's parser).
def trial_row(trial: Trial) -> dict:
    m = trial.measurement
    return {"trial": trial.index, "purpose": trial.purpose, **trial.settings.as_dict(), "fps": m.fps,
            "latency_p50_ms": m.latency_p50_ms, "latency_p95_ms": m.latency_p95_ms,
            "cpu_ms_per_frame": m.cpu_ms_per_frame, "cpu_saturation": m.cpu_saturation, "bound_fps": m.bound_fps,
            "bound_kind": m.bound_kind, "bottleneck": m.bottleneck, "limit": m.limit, "stable": m.stable,
            "cost_s": trial.cost_s, "verdict": trial.verdict, "reason": trial.reason, "exit_code": m.exit_code,
            "error": m.error, "run_dir": m.run_dir}


def sweep_csv(result: SweepResult) -> str:
    text = io.StringIO(newline="")
    out = csv.DictWriter(text, fieldnames=TRIAL_COLUMNS)
    out.writeheader()
    for trial in result.trials:
        row = trial_row(trial)
        out.writerow({k: (f"{v:.4f}" if isinstance(v, float) else "" if v is None else v) for k, v in row.items()})
    return text.getvalue()


def flag_tokens(key: str, value) -> list[str]:
    """The runner's flag for a configuration value: ``--batch-size 4``, ``--square``, ``--classes 0 2``."""
    if value is False and key in SWITCHES_OFF:
        return [flag_of(key, value)]
    flag = flag_of(key)
    if value is True:
        return [flag]
    if value is False:
        return []  # a switch left off: its default
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def command_line(run_overrides: dict, config_path: str | None = None) -> str:
    """``python runner.py`` with ``--config`` (when not the default) and a flag per override."""
    tokens = ["python", "runner.py"] + (["--config", config_path] if config_path else [])
    for key, value in run_overrides.items():
        tokens += flag_tokens(key, value)
    return shlex.join(tokens)


def settings_summary(result: SweepResult, settings) -> dict | None:
    """One settings' figures: its values, mean fps over its trials, and its latest trial's analysis."""
    if settings is None:
        return None
    latest = result.latest(settings)
    m = latest.measurement if latest else None
    return {"settings": settings.as_dict(), "label": settings.label(), "fps": mean_fps(result.trials, settings),
            "trials": [t.index for t in result.trials if t.settings == settings],
            "latency_p50_ms": m and m.latency_p50_ms, "latency_p95_ms": m and m.latency_p95_ms,
            "cpu_ms_per_frame": m and m.cpu_ms_per_frame, "bound_fps": m and m.bound_fps,
            "bottleneck": m and m.bottleneck, "limit": m and m.limit, "hint": m.hint if m else ""}


def sweep_summary(result: SweepResult, sweep_dir: str, trial_s: float, command: str | None,
                  config_saved: str | None) -> dict:
    """sweep.json's content, and the object ``--json`` prints."""
    return json_safe({
        "sweep_dir": sweep_dir, "budget_s": result.budget_s, "elapsed_s": result.elapsed_s, "trial_s": trial_s,
        "threshold": result.threshold, "stopped": result.stopped, "interrupted": bool(result.interrupted),
        "defaults": settings_summary(result, result.defaults), "best": settings_summary(result, result.best),
        "gain": result.gain, "command": command, "config_saved": config_saved,
        "stable_trials": result.stable_trials, "trial_count": len(result.trials),
        "final_check_ratio": result.final_ratio, "unconfirmed": settings_summary(result, result.unconfirmed),
        "trials": [trial_row(t) for t in result.trials]})


def _cell(value, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}}"


def sweep_table(result: SweepResult) -> str:
    """One line per trial: settings, fps, latency, CPU per frame, bound, bottleneck, stability, verdict."""
    header = (f"{'#':>3} {'purpose':<12}{'pre':>4}{'infer':>6}{'thr':>4}{'post':>5}{'batch':>6}{'half':>5}"
              f"{'backend':>9}{'fps':>8}{'p50 ms':>8}{'p95 ms':>8}{'CPU ms':>8}{'bound':>7}  {'bottleneck':<20}{'stable':<7}verdict")
    lines = [header]
    for t in result.trials:
        m, s = t.measurement, t.settings
        neck = f"{title(m.bottleneck)} ({m.limit})" if m.bottleneck else "-"
        best = " *" if t.settings == result.best else ""
        lines.append(f"{t.index:>3} {t.purpose:<12}{s.pre_workers:>4}{s.infer_workers:>6}{s.infer_threads:>4}"
                     f"{s.post_workers:>5}{s.batch_size:>6}{'yes' if s.half else '-':>5}{s.backend:>9}"
                     f"{_cell(m.fps, '.1f', 8)}"
                     f"{_cell(m.latency_p50_ms, '.1f', 8)}"
                     f"{_cell(m.latency_p95_ms, '.1f', 8)}{_cell(m.cpu_ms_per_frame, '.1f', 8)}"
                     f"{_cell(m.bound_fps, '.1f', 7)}  {neck:<20}{'yes' if m.stable else 'no':<7}{t.verdict}{best}")
    return "\n".join(lines)


def best_lines(result: SweepResult, command: str | None, config_saved: str | None) -> list[str]:
    """The verdict under the table: the best settings against the defaults, and how to run them."""
    if result.best is None:
        return [f"no best settings: {result.stopped}"]
    best, base = mean_fps(result.trials, result.best), mean_fps(result.trials, result.defaults)
    best_trials = sum(1 for t in result.trials if t.settings == result.best and t.fps is not None)
    base_trials = sum(1 for t in result.trials if t.settings == result.defaults and t.fps is not None)
    if result.best == result.defaults and result.unconfirmed is not None:
        verdict = (f"best: the defaults ({result.best.label()}), {base:.1f} fps over {base_trials} trials; "
                   f"{result.unconfirmed.label()} led on the mean but was {100 * (result.final_ratio - 1):+.1f} % "
                   "against them back to back: not confirmed in the final check")
    elif result.best == result.defaults:
        verdict = (f"best: the defaults ({result.best.label()}), {base:.1f} fps over {base_trials} trials; "
                   f"no move gained {100 * result.threshold:.0f} %")
    else:
        verdict = (f"best: {result.best.label()} ({result.best.change_from(result.defaults)}), {best:.1f} fps over "
                   f"{best_trials} trials, {100 * result.gain:+.1f} % over the defaults' {base:.1f} fps "
                   f"({base_trials} trials)")
    if result.best != result.defaults and result.final_ratio is not None:
        verdict += f"; {100 * (result.final_ratio - 1):+.1f} % in the final back-to-back check"
    lines = [verdict, f"stopped: {result.stopped} ({result.elapsed_s:.0f} of {result.budget_s:.0f} s)"]
    measured = sum(1 for t in result.trials if t.fps is not None)
    if measured and result.stable_trials == 0:
        lines.insert(0, f"NONE of the {measured} trials was stable (their fps moved by more than 10 % between "
                        "2 s windows: other work on the machine, or trials too short): differences of a few "
                        "percent are noise here, so take the verdict as a lead to re-measure, not a result")
    latest = result.latest(result.best)
    if latest and latest.measurement.hint:
        lines.append(f"analysis of the best: {latest.measurement.hint}")
    if command:
        lines.append(f"run it: {command}")
    if config_saved:
        lines.append(f"config saved: {config_saved} (python runner.py --config {shlex.quote(config_saved)})")
    return lines
