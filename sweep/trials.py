"""``runner.py --sweep``: the tuning sweep on the live pipeline.

Each trial is one time-boxed run of ``supervisor.run.run_pipeline`` (the runner's own run
function, in this process) with its own run folder, ``<sweep folder>/trial-NN/`` with the usual
report; its annotated images are removed once it is measured (the sweep measures, it does not
collect output). The sweep folder is ``<results>/<name>`` with ``--name``, else
``<results>/<timestamp>-sweep``; it holds sweep.csv, sweep.json and sweep.png beside the trials.
Every trial keeps the configuration as given except the swept settings; ``--duration`` sets the
trials' length (default ``DEFAULT_TRIAL_S``) and ``--frames`` is not used by them."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass

from analysis.atomic import write_bytes_atomic
from analysis.report import json_safe
from backends.registry import ready_for_sweep, sweep_alternatives
from topology.stages import title
from sweep.search import (FIRST_TRIAL_EXTRA_S, SWEPT, TRIAL_OVERHEAD_S, Measurement, Settings, Sweep,
                            SweepInterrupted, SweepResult, Trial)
from sweep.output import best_lines, command_line, sweep_csv, sweep_summary, sweep_table
from sweep.plot import sweep_png
from analysis.windows import STABLE_WINDOWS, THROUGHPUT_WINDOW_S
from supervisor import exit_codes
from supervisor.prepare import plan_source, prepare_backend, resolve
from supervisor.run import UsageError, run_pipeline
from settings.config import ConfigError, RunConfig, build_config, config_toml, read_toml
from yolo.presets import MODEL_FREE

log = logging.getLogger("runner")

DEFAULT_TRIAL_S = 8.0  # long enough for STABLE_WINDOWS 2 s windows after the start-up transient
DEFAULT_BUDGET_S = 300.0
SWEEP_ONLY = ("name", "exist_ok", "json", "duration")  # flags that shape the sweep, not the run it recommends
TRIAL_OUTPUTS = ("images", "labels")  # a trial's outputs removed once it is measured



@dataclass(frozen=True)
class SweepRequest:
    budget_s: float
    trial_s: float
    save_config: str | None  # write the best settings there as a config file
    flags: dict  # the run's flags as given (RunConfig field -> value), sweep flags left out
    config_path: str  # the config file the defaults came from
    config_flag: str | None  # ``--config`` as given; None for the default file


def sweep_request(cfg: RunConfig, sweep: bool | None, sweep_budget_s: float | None, save_config: str | None,
                  flags: dict, config_path: str, default_config: str) -> SweepRequest | None:
    """The checked sweep request; None without ``--sweep``. ValueError names a bad value."""
    if not sweep:
        given = [flag for flag, value in (("--sweep-budget-s", sweep_budget_s), ("--save-config", save_config))
                 if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)}: expected --sweep as well (the settings saved are the ones "
                             "a sweep finds)")
        return None
    budget = DEFAULT_BUDGET_S if sweep_budget_s is None else sweep_budget_s
    trial_s = cfg.duration or DEFAULT_TRIAL_S
    least = trial_s + TRIAL_OVERHEAD_S + FIRST_TRIAL_EXTRA_S
    if budget < least:
        raise ValueError(f"--sweep-budget-s: expected at least {least:.0f} s (one {trial_s:g} s trial, start-up "
                         f"included), got {budget:g}")
    if save_config and not os.path.isdir(os.path.dirname(os.path.abspath(save_config))):
        raise ValueError(f"--save-config: expected a file in an existing folder, got {save_config!r}")
    if trial_s < (STABLE_WINDOWS + 0.5) * THROUGHPUT_WINDOW_S:
        log.warning("--duration %g s: trials this short hold fewer than %d whole %g s windows, so none can be "
                    "judged stable", trial_s, STABLE_WINDOWS, THROUGHPUT_WINDOW_S)
    given = {k: v for k, v in flags.items() if v is not None}
    return SweepRequest(budget, trial_s, save_config, given, config_path,
                        None if os.path.abspath(config_path) == os.path.abspath(default_config) else config_path)


def make_sweep_dir(results: str, name: str, exist_ok: bool) -> str:
    if name:
        path = os.path.join(results, name)
        os.makedirs(path, exist_ok=exist_ok)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = os.path.join(results, f"{stamp}-sweep" if n == 1 else f"{stamp}-{n}-sweep")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"sweep: no free folder name for {stamp} in {results}")


class LiveTrials:
    """The trial function: one time-boxed pipeline run per call, in its own folder."""

    def __init__(self, given: RunConfig, sweep_dir: str, trial_s: float, download_dir: str = ""):
        self.given, self.sweep_dir, self.trial_s = given, sweep_dir, trial_s
        self.download_dir = download_dir  # a video URL downloaded once, for every trial

    def config(self, settings: Settings, index: int) -> RunConfig:
        return dataclasses.replace(self.given, **settings.as_dict(), duration=self.trial_s, frames=0,
                                   results=self.sweep_dir, name=f"trial-{index:02d}", exist_ok=False, progress=False,
                                   json=False)

    def __call__(self, settings: Settings, index: int) -> Measurement:
        cfg, machine, names = resolve(self.config(settings, index))
        try:
            prepare_backend(cfg)  # the first OpenVINO trial converts the model (cached for the others)
        except ConfigError as exc:
            return Measurement(fps=None, exit_code=2, error=str(exc))
        try:
            outcome = run_pipeline(cfg, machine, names, plan_source(cfg, self.download_dir), show_progress=False)
        except UsageError as exc:
            return Measurement(fps=None, exit_code=exit_codes.USAGE, error=str(exc))
        if exit_codes.stopped_by_signal(outcome.exit_code):
            raise SweepInterrupted(outcome.reason or "interrupted", outcome.exit_code)
        for output in TRIAL_OUTPUTS:
            shutil.rmtree(os.path.join(outcome.run_dir, output), ignore_errors=True)
        return Measurement.from_summary(outcome.summary, outcome.exit_code, outcome.run_dir, outcome.reason)


def log_trial(trial: Trial) -> None:
    m = trial.measurement
    if m.fps is None:
        log.info("trial %d %s %s: %s", trial.index, trial.purpose, trial.settings.label(), trial.verdict)
        return
    neck = f"{title(m.bottleneck)} ({m.limit})" if m.bottleneck else "no bottleneck"
    log.info("trial %d %s %s: %.1f fps, p50 %.1f ms, %s, %s; %s", trial.index, trial.purpose, trial.settings.label(),
             m.fps, m.latency_p50_ms or 0.0, neck, "stable" if m.stable else "not stable", trial.verdict)


def sweep_backends(cfg: RunConfig, device_type: str) -> tuple[str, ...]:
    """The backends other than the default that a trial may move to (backends.registry): none
    for a run without a model; else those the sweep tries on this device type that are ready
    now (OpenVINO: installed, its converted model already cached)."""
    if cfg.preset == MODEL_FREE and not cfg.weights:
        return ()
    options = cfg.backend_options(cfg.devices[0], "fp32", cfg.infer_threads)
    return tuple(spec.name for spec in sweep_alternatives(device_type) if ready_for_sweep(spec.name, options))


def run_sweep(given: RunConfig, resolved: RunConfig, machine, request: SweepRequest,
              started_s: float | None = None, download_dir: str = "") -> int:
    """Run the sweep, write its files, print the table (or the JSON summary); the exit code.
    The budget runs from ``started_s`` (the runner's start, perf_counter clock)."""
    sweep_dir = make_sweep_dir(given.results, given.name, given.exist_ok)
    log.info("sweep %s: %g s budget, %g s trials, from %s", sweep_dir, request.budget_s, request.trial_s,
             Settings.of(resolved).label())
    trials = LiveTrials(given, sweep_dir, request.trial_s, download_dir)
    sweep = Sweep(trials, machine, request.budget_s, request.trial_s, on_trial=log_trial, started_s=started_s,
                  backends=sweep_backends(resolved, machine.device_type))
    result = sweep.run(Settings.of(resolved))
    command, config_saved, failed = None, None, {}
    if result.best is not None:
        run_flags = {k: v for k, v in request.flags.items() if k not in SWEEP_ONLY and k not in SWEPT}
        run_flags.update(result.best.as_dict())
        command = command_line(run_flags, request.config_flag)
        if request.save_config:
            config_saved = _save_config(request, run_flags, result, sweep_dir, failed)
    summary = sweep_summary(result, sweep_dir, request.trial_s, command, config_saved)
    _write_files(sweep_dir, result, summary, failed)
    code = _exit_code(result, failed)
    if given.json:
        print(json.dumps(json_safe({**summary, "files_failed": failed, "exit_code": code})))
    else:
        print(sweep_table(result))
        print("\n".join(best_lines(result, command, config_saved) + [f"sweep folder {sweep_dir}"]))
    return code


def _save_config(request: SweepRequest, run_flags: dict, result: SweepResult, sweep_dir: str,
                 failed: dict) -> str | None:
    cfg = build_config(read_toml(request.config_path), run_flags)
    heading = (f"Written by runner.py --sweep ({sweep_dir}): best settings {result.best.label()} "
               f"(pre / infer x threads / post, batch)\nat {result.best_fps:.1f} fps, "
               f"{100 * (result.gain or 0.0):+.1f} % over the defaults in the same sweep. "
               "Run: python runner.py --config THIS_FILE")
    try:
        write_bytes_atomic(request.save_config, config_toml(cfg, heading).encode())
    except OSError as exc:
        failed[request.save_config] = f"{exc.strerror or exc} ({exc.__class__.__name__})"
        return None
    return request.save_config


def _write_files(sweep_dir: str, result: SweepResult, summary: dict, failed: dict) -> None:
    files = {"sweep.json": lambda: json.dumps(summary, indent=1).encode(),
             "sweep.csv": lambda: sweep_csv(result).encode(), "sweep.png": lambda: sweep_png(result)}
    for name, render in files.items():
        data = render()
        if data is None:
            continue
        try:
            write_bytes_atomic(os.path.join(sweep_dir, name), data)
        except OSError as exc:
            failed[name] = f"{exc.strerror or exc} ({exc.__class__.__name__})"
    for name, error in failed.items():
        log.error("could not write %s: %s", name, error)


def _exit_code(result: SweepResult, failed: dict) -> int:
    if result.interrupted:
        return result.interrupted
    if result.best is None:
        return exit_codes.ABORTED
    return exit_codes.OUTPUT_INCOMPLETE if failed else exit_codes.OK
