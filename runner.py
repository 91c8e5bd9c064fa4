"""Run YOLOv5 detection as a multiprocess pipeline and leave a run folder in results/.

    python runner.py --device cpu                      # synthetic images, random-weight yolov5n
    python runner.py --weights yolov5n.pt --source imgs/ --workers 4 --device cuda
    python runner.py --sweep --sweep-budget-s 240 --save-config best.toml   # tune, then --config best.toml

Starts the stages (source+preprocess, inference, postprocess, collector) as separate
processes joined by ZeroMQ, watches them, shows progress, stops them all at the end.

Exit codes: 0 every frame processed; 1 the run was aborted; 2 bad usage or configuration;
3 finished but some frames failed (--allow-failures makes that 0); 4 finished but some output
could not be written (disk full); 130 / 143 / 129 interrupted by Ctrl-C / SIGTERM / SIGHUP.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

from typing import TYPE_CHECKING

from supervisor import exit_codes  # a few constants: children that re-import this script stay light

if TYPE_CHECKING:
    from supervisor.run import Outcome

SWEEP_FLAGS = ("sweep", "sweep_budget_s", "save_config")
RAY_FLAGS = ("ray", "ray_lead_s")

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.toml")

log = logging.getLogger("runner")


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error under ``--json`` is also one JSON object on stdout."""

    json_errors = False

    def error(self, message: str):
        if self.json_errors:
            print(json.dumps(usage_error(message)))
        super().error(message)


def usage_error(message: str) -> dict:
    """What ``--json`` prints for a run that never started because of bad usage (exit code 2)."""
    return {"exit_code": exit_codes.USAGE, "error": message, "reason": "bad usage", "run_dir": None,
            "report_written": False}


def parse_args(argv: list[str] | None) -> tuple[str, dict]:
    from settings.flags import ConfigDefault
    argv = sys.argv[1:] if argv is None else argv
    ns = vars(build_parser(json_errors="--json" in argv).parse_args(argv))
    given = {k: None if isinstance(v, ConfigDefault) else v for k, v in ns.items()}
    return given.pop("config"), given


def build_parser(json_errors: bool = False) -> Parser:
    """The run settings' flags come from their declarations on RunConfig (settings/config.py),
    with config.toml's values as defaults; the runner's own flags (--config, --sweep*, --ray*)
    are added here. Plugins are loaded first (main), so --backend offers their backends."""
    from settings.config import RunConfig, read_toml
    from settings.flags import add_setting_flags
    from yolo.helpformat import DefaultsHelpFormatter
    try:
        defaults = read_toml(DEFAULT_CONFIG)
    except ValueError:
        defaults = {}  # a broken default file is reported by main(), with its name
    p = Parser(description=__doc__, formatter_class=DefaultsHelpFormatter)
    p.json_errors = json_errors
    p.add_argument("--config", default=DEFAULT_CONFIG, help="TOML file with the defaults (default: config.toml)")
    add_setting_flags(p, RunConfig, defaults)
    p.add_argument("--sweep", action="store_const", const=True,
                   help="tune worker counts, inference threads and batch size in short trials, then print the best")
    p.add_argument("--sweep-budget-s", type=float, help="wall-clock budget of --sweep in seconds (default 300)")
    p.add_argument("--save-config", help="with --sweep: write the best settings to this file, for --config")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster: one pipeline per node, work balanced by "
                   "speed, one merged run folder; ADDRESS is host:port or 'auto' (see docs/cluster.md)")
    p.add_argument("--ray-lead-s", type=float, help="with --ray: seconds of a node's work its feed holds beyond "
                   "what its pipeline has in flight (default 1; more evens out a jittery node, less ends closer)")
    return p


def flag_named(message: str, flags: dict) -> str:
    """Errors name the setting ("config imgsz: ..."); when its value came from a flag, name the
    flag the user typed instead ("--imgsz: ...")."""
    from settings.config import flag_of
    key, sep, rest = message.removeprefix("config ").partition(":")
    if message.startswith("config ") and sep and flags.get(key) is not None:
        return f"{flag_of(key, flags[key])}:{rest}"
    return message


def prepare(cfg, download_dir: str, probe_backends: bool = True):
    """The resolved configuration, machine, class names and frame plan; ConfigError names what is bad.
    A ``--name`` that is taken becomes name2, name3, ... unless ``--exist-ok``, as in detect.py.
    ``probe_backends``: time the forwards for the backend lever (not for a sweep or a Ray driver,
    which run no pipeline of their own here: the probe's seconds would be spent for no report)."""
    from supervisor.forward_probe import probe_forwards
    from supervisor.prepare import check_results_dir, free_run_name, plan_source, prepare_backend, resolve
    cfg, machine, names = resolve(cfg)
    check_results_dir(cfg.results)
    # a cluster node's share (run_folder) writes under the name its driver chose
    name = cfg.name if cfg.run_folder else free_run_name(cfg.results, cfg.name, cfg.exist_ok)
    if name != cfg.name:
        log.info("run folder %s exists: this run goes to %s (--exist-ok reuses it)",
                 os.path.join(cfg.results, cfg.name), os.path.join(cfg.results, name))
        cfg = dataclasses.replace(cfg, name=name)
    plan = plan_source(cfg, download_dir)
    prepare_backend(cfg)
    probe = probe_forwards(cfg, plan) if probe_backends else None  # the --backend openvino lever's measurement
    if probe is not None:
        machine = dataclasses.replace(machine, forward_probe=probe.as_dict())
    return cfg, machine, names, plan


def main(argv: list[str] | None = None) -> int:
    from inputs.downloads import DownloadFolder
    with DownloadFolder() as download_dir:  # a video URL fetched whole lives there until the run ends
        return run_main(argv, download_dir)


def run_main(argv: list[str] | None, download_dir: str) -> int:
    # Imported here, not at the top: a Ctrl-C during these imports is then one line (see the
    # end of this file), and spawned children that re-import this script stay light.
    from supervisor.processes import start_fork_server, stop_helper_processes
    from supervisor.run import UsageError, run_pipeline
    from sweep.trials import run_sweep, sweep_request
    from settings.config import ConfigError, build_config, read_toml
    from topology.plugins import PluginError, load_plugins
    started_s = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    if as_json:
        logging.getLogger().handlers[0].setStream(sys.stderr)  # stdout holds only the JSON summary
    try:
        load_plugins()  # before the flags are built: a plugin's backend is a --backend choice
    except PluginError as exc:
        return usage_failed(str(exc), as_json)
    config_path, overrides = parse_args(argv)
    sweep_flags = {key: overrides.pop(key) for key in SWEEP_FLAGS}
    ray_flags = {key: overrides.pop(key) for key in RAY_FLAGS}
    try:
        given = cfg = build_config(read_toml(config_path), overrides)
        logging.getLogger().setLevel(cfg.log_level.upper())
        say_plan(cfg)
        sweep = sweep_request(cfg, **sweep_flags, flags=overrides, config_path=config_path,
                              default_config=DEFAULT_CONFIG)
        if ray_flags["ray"] is not None:
            return run_on_ray(given, ray_flags, sweep is not None, overrides, as_json)
        start_fork_server()  # torch imports there while the rest is checked here
        cfg, machine, names, plan = prepare(cfg, download_dir, probe_backends=sweep is None)
    except (ConfigError, ValueError) as exc:
        stop_helper_processes(wait=False)
        return usage_failed(flag_named(str(exc), overrides), as_json)
    except KeyboardInterrupt:
        log.error("interrupted before the run started")
        stop_helper_processes(wait=False)
        return exit_codes.INTERRUPTED
    if not cfg.weights and cfg.preset != "none":
        log.warning("no --weights: using a random-weight %s; timings are valid, detections are meaningless",
                    cfg.preset)
    if sweep is not None:
        try:
            return run_sweep(dataclasses.replace(given, name=cfg.name), cfg, machine, sweep, started_s, download_dir)
        finally:
            stop_helper_processes()
    warn_oversubscription(cfg, machine.cores, machine.device_type == "cuda")
    try:
        outcome = run_pipeline(cfg, machine, names, plan, show_progress=cfg.progress, runner_started_s=started_s)
    except UsageError as exc:
        return usage_failed(str(exc), as_json)
    finally:
        stop_helper_processes()
    print_outcome(outcome, cfg.json)
    return outcome.exit_code


def run_on_ray(given, ray_flags: dict, sweep: bool, overrides: dict, as_json: bool) -> int:
    """--ray: this process drives one pipeline per node of a Ray cluster (cluster/)."""
    from cluster.command import ClusterOptions, check_cluster_run, driver_config, print_report, run_on_cluster
    from cluster.ray_session import Interrupted, RayMissing
    from settings.config import ConfigError
    try:
        if sweep:
            raise ConfigError("--ray: --sweep tunes one machine; run it on a node without --ray")
        options = ClusterOptions(ray_flags["ray"], ray_flags["ray_lead_s"] or ClusterOptions.lead_s)
        # download_dir "": a video URL stays a URL for every node
        cfg, _machine, names, plan = prepare(driver_config(given), download_dir="", probe_backends=False)
        check_cluster_run(cfg, plan)
    except (ConfigError, ValueError, RayMissing) as exc:
        return usage_failed(flag_named(str(exc), overrides), as_json)
    try:
        report = run_on_cluster(options, given, cfg, names, plan)
    except ConfigError as exc:  # no cluster at the address, or the run folder taken meanwhile
        return usage_failed(str(exc), as_json)
    except (RuntimeError, ConnectionError) as exc:
        log.error("error: the cluster run failed: %s", exc)
        return exit_codes.ABORTED
    except (KeyboardInterrupt, Interrupted) as exc:  # while joining or placing the actors: nothing ran
        log.error("interrupted before the run started")
        return exit_codes.SIGNAL_EXIT_CODES["SIGTERM"] if isinstance(exc, Interrupted) else exit_codes.INTERRUPTED
    print_report(report, cfg.json)
    return report["summary"]["exit_code"]


def say_plan(cfg) -> None:
    """The run's plan at once, before the seconds of checking weights and source (torch loads)."""
    model = cfg.weights or ("no model" if cfg.preset == "none" else f"a random-weight {cfg.preset}")
    log.info("%s: %s on %s with %s%s; checking the weights and the source...",
             f"run {cfg.name}" if cfg.name else "run", cfg.source, cfg.device, model,
             f", batch {cfg.batch_size}" if cfg.batch_size > 1 else "")


def usage_failed(message: str, as_json: bool) -> int:
    """Bad usage found before the run: one error line, and with ``--json`` the error object."""
    log.error("error: %s", message)
    if as_json:
        print(json.dumps(usage_error(message)))
    return exit_codes.USAGE


def warn_oversubscription(cfg, cores: int, on_cuda: bool) -> None:
    counts = {"--pre-workers": cfg.pre_workers, "--post-workers": cfg.post_workers}
    if not on_cuda:
        counts["--infer-workers x --infer-threads"] = cfg.infer_workers * cfg.infer_threads
    for flag, count in counts.items():
        if count > cores:
            log.warning("%s = %d on %d cores: the extra processes time-slice the cores, so each frame waits "
                        "for a core, per-stage ms rise and fps does not; more than the core count only pays "
                        "when a stage waits on disk or network", flag, count, cores)


def print_outcome(outcome: Outcome, as_json: bool) -> None:
    if as_json:
        from analysis.report import json_summary
        print(json.dumps(json_summary(outcome.summary or {}, exit_code=outcome.exit_code, reason=outcome.reason,
                                      run_dir=outcome.run_dir, report_written=outcome.report_written,
                                      runner_dropped_messages=outcome.dropped_messages)))
    elif outcome.summary:
        from analysis.terminal import format_summary
        print(format_summary(outcome.summary))
    if outcome.reason and outcome.exit_code:
        run = f"run {os.path.basename(outcome.run_dir)}: " if outcome.run_dir and os.path.isdir(outcome.run_dir) else ""
        log.error("%s%s (exit code %d)", run, outcome.reason, outcome.exit_code)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before main could take over Ctrl-C (its own imports)
        print("interrupted before the run started", file=sys.stderr)
        sys.exit(exit_codes.INTERRUPTED)
