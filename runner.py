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


class ConfigDefault:
    """A flag's value when the user did not give it: config.toml's, shown by ``--help``, never
    an override (``--config FILE`` may set it otherwise)."""

    def __init__(self, value, shown: str | None = None):
        self.value, self.shown = value, shown

    def __str__(self) -> str:
        if self.shown is not None:
            return self.shown
        if isinstance(self.value, (list, tuple)):
            return " ".join(map(str, self.value)) or "all"
        return str(self.value)


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
    argv = sys.argv[1:] if argv is None else argv
    ns = vars(build_parser(json_errors="--json" in argv).parse_args(argv))
    given = {k: None if isinstance(v, ConfigDefault) else v for k, v in ns.items()}
    return given.pop("config"), given


def build_parser(json_errors: bool = False) -> Parser:
    from settings.config import read_toml
    from yolo.helpformat import DefaultsHelpFormatter
    try:
        defaults = read_toml(DEFAULT_CONFIG)
    except ValueError:
        defaults = {}  # a broken default file is reported by main(), with its name
    p = Parser(description=__doc__, formatter_class=DefaultsHelpFormatter)
    p.json_errors = json_errors
    p.add_argument("--config", default=DEFAULT_CONFIG, help="TOML file with the defaults (default: config.toml)")

    def add(*flags, shown=None, **kw):
        dest = kw.get("dest") or flags[0].lstrip("-").replace("-", "_")
        if dest in defaults:
            kw["default"] = ConfigDefault(defaults[dest], shown)
        p.add_argument(*flags, **kw)

    add("--weights", shown="none: a random-weight --preset", help="YOLOv5 checkpoint .pt (without it detections "
        "are meaningless; timings are valid)")
    add("--preset", help="yolov5n/s/m/l/x built with random weights when --weights is empty, or 'none' (no model)")
    add("--source", help="image, folder (recursive), glob, video, .txt list, URL, camera index, or 'synthetic'")
    add("--imgsz", "--img", "--img-size", dest="imgsz", type=int, help="letterbox size (pixels, a multiple of 32)")
    add("--rect", dest="rect", action="store_const", const=True, help="long side to imgsz, short side to a multiple "
        "of 32")
    add("--square", dest="rect", action="store_const", const=False, help="fixed imgsz x imgsz letterbox")
    add("--conf-thres", "--conf", dest="conf_thres", type=float, help="confidence threshold")
    add("--iou-thres", "--iou", dest="iou_thres", type=float, help="NMS IoU threshold")
    add("--max-det", type=int, help="maximum detections per image")
    add("--classes", type=int, nargs="+", help="keep only these class ids")
    add("--agnostic-nms", action="store_const", const=True, help="NMS across classes")
    add("--device", help="cpu, cuda, cuda:N, N, or a list such as cuda:0,cuda:1 or 0,1 (a bare N is cuda:N)")
    add("--backend", choices=("torch", "openvino"),
        help="what runs the forward: torch, or OpenVINO on the CPU (the model converted once, cached on disk)")
    add("--half", action="store_const", const=True, help="fp16 on CUDA, bfloat16 on a CPU that has it")
    add("--no-fuse", dest="fuse", action="store_const", const=False, help="keep BatchNorm separate (default: "
        "folded into the convs)")
    add("--no-channels-last", dest="channels_last", action="store_const", const=False,
        help="keep NCHW weights (default: NHWC, faster on CPU)")
    add("--out-of-place", dest="inplace", action="store_const", const=False, help="decode boxes in Detect without "
        "in-place tensor writes, as an ONNX export needs; same boxes, a little slower (default: in place)")
    add("--workers", type=int, help="default for --pre-workers and --post-workers (0: one per core)")
    add("--pre-workers", type=int, help="source + preprocess processes (0: --workers)")
    add("--infer-workers", type=int, help="inference processes (0: one per GPU, one per core on CPU)")
    add("--post-workers", type=int, help="NMS + drawing processes (0: --workers)")
    add("--infer-threads", type=int, help="torch threads per inference process (0: 1)")
    add("--batch-size", type=int, help="frames per inference batch (same letterboxed shape)")
    add("--max-wait-ms", type=float, help="longest wait for a full batch")
    add("--prefetch", type=int, help="how many batches each worker may have waiting for it from each worker "
        "upstream: more rides over short stalls, costs memory and latency")
    add("--frames", type=int, help="stop after N frames, looping the source if needed (0: one pass)")
    add("--duration", type=float, help="run for S seconds from the first frame, then finish (0: off)")
    add("--vid-stride", type=int, help="read every N-th frame of videos and streams")
    add("--decode", help="full, or reduced (JPEG decoded at 1/2, 1/4, 1/8 when that much larger)")
    add("--max-pixels", type=int, help="images with more pixels are failed frames, refused before decoding")
    add("--warmup", type=int, help="first N frames excluded from statistics")
    add("--synthetic-count", type=int, help="frames in one pass of the synthetic source")
    add("--results", "--project", dest="results", help="folder of run folders")
    add("--name", shown="a timestamp", help="run folder name; if it exists, name2, name3, ... as detect.py does")
    add("--exist-ok", action="store_const", const=True, help="reuse the run folder of that name; what a run "
        "writes there (images, labels, crops, reports) is removed first")
    add("--save-images", help="all, none, or N (every N-th frame)")
    add("--nosave", dest="save_images", action="store_const", const="none", help="--save-images none")
    add("--save-txt", action="store_const", const=True, help="YOLO label files in labels/")
    add("--save-conf", action="store_const", const=True, help="the score in each label line")
    add("--save-crop", action="store_const", const=True, help="each detection's box cut out of the frame, in "
        "crops/<class>/, for the frames whose images are saved")
    add("--line-thickness", type=int, help="box line width in pixels (0: scaled with the image)")
    add("--hide-labels", action="store_const", const=True, help="boxes without class name and score")
    add("--hide-conf", action="store_const", const=True, help="labels without the score")
    add("--module-timing", help="time the model per part: none; layers (each of model.0 ... model.24); blocks "
        "(Conv, C3, SPPF, Detect, nested); leaves (every innermost layer: each Conv2d, BatchNorm, SiLU)")
    add("--timing-mode", help="auto, cpu, cuda-sync or cuda-events")
    add("--transport", help="ipc or tcp")
    add("--tcp-host", help="tcp: the host every socket binds and connects on")
    add("--tcp-base-port", type=int, help="tcp: consecutive ports from here, one per bound socket")
    add("--max-restarts", type=int, help="restarts per stage of workers that die or hang")
    add("--heartbeat-timeout-s", type=float, help="a process silent this long is handled as dead")
    add("--allow-failures", action="store_const", const=True, help="exit 0, not 3, when some frames failed")
    add("--json", action="store_const", const=True, help="print one JSON summary on stdout, logs on stderr")
    add("--log-level", help="debug, info, warning or error")
    add("--no-progress", dest="progress", action="store_const", const=False, help="no progress bar")
    add("--sweep", action="store_const", const=True,
        help="tune worker counts, inference threads and batch size in short trials, then print the best")
    add("--sweep-budget-s", type=float, help="wall-clock budget of --sweep in seconds (default 300)")
    add("--save-config", help="with --sweep: write the best settings to this file, for --config")
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
    name = free_run_name(cfg.results, cfg.name, cfg.exist_ok)
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
    started_s = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config_path, overrides = parse_args(argv)
    sweep_flags = {key: overrides.pop(key) for key in SWEEP_FLAGS}
    ray_flags = {key: overrides.pop(key) for key in RAY_FLAGS}
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    if as_json:
        logging.getLogger().handlers[0].setStream(sys.stderr)  # stdout holds only the JSON summary
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
    from cluster.command import ClusterOptions, check_cluster_run, print_report, run_on_cluster
    from cluster.ray_session import Interrupted, RayMissing
    from settings.config import ConfigError
    try:
        if sweep:
            raise ConfigError("--ray: --sweep tunes one machine; run it on a node without --ray")
        options = ClusterOptions(ray_flags["ray"], ray_flags["ray_lead_s"] or ClusterOptions.lead_s)
        # download_dir "": a video URL stays a URL for every node
        cfg, _machine, names, plan = prepare(given, download_dir="", probe_backends=False)
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
