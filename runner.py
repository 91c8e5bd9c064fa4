"""Run YOLOv5 detection as a multiprocess pipeline and leave a run folder in results/.

    python runner.py --device cpu                      # synthetic images, random-weight yolov5n
    python runner.py --weights yolov5n.pt --source imgs/ --workers 4 --device cuda

Starts the stages (source+preprocess, inference, postprocess, collector) as separate
processes joined by ZeroMQ, watches them, shows progress, stops them all at the end.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

import zmq

from workers.config import ConfigError, RunConfig, build_config, read_toml
from workers.lifecycle import LOG_FORMAT, STOP, StageArgs, make_endpoints
from workers.transport import make_socket, recv_message, send_message

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.toml")
POLL_TIMEOUT_MS = 100
STALL_TIMEOUT_S = 300.0  # no frame finished for this long while all processes live: stop the run
STOP_RESEND_S = 1.0  # PUB/SUB may drop a message to a late subscriber: repeat the stop
STOP_GIVE_UP_S = 30.0  # after a stop, wait this long for the collector's report, then end it all
JOIN_TIMEOUT_S = 10.0  # after the collector finished (or a stop): then terminate, then kill

log = logging.getLogger("runner")


def parse_args(argv: list[str] | None) -> tuple[str, dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="TOML file with the defaults (default: config.toml)")
    add = p.add_argument
    add("--weights", help="YOLOv5 checkpoint .pt (default: random-weight --preset; detections meaningless)")
    add("--preset", help="yolov5n/s/m/l/x, built with random weights when --weights is empty")
    add("--source", help="image, directory (recursive), glob, video file, or 'synthetic'")
    add("--imgsz", type=int, help="letterbox size")
    add("--rect", dest="rect", action="store_const", const=True, help="long side to imgsz, short side to a multiple of 32")
    add("--square", dest="rect", action="store_const", const=False, help="fixed imgsz x imgsz letterbox")
    add("--conf-thres", type=float, help="confidence threshold")
    add("--iou-thres", type=float, help="NMS IoU threshold")
    add("--max-det", type=int, help="maximum detections per image")
    add("--classes", type=int, nargs="+", help="keep only these class ids")
    add("--agnostic-nms", action="store_const", const=True, help="NMS across classes")
    add("--device", help="cpu, cuda, cuda:N, or a list such as cuda:0,cuda:1")
    add("--half", action="store_const", const=True, help="fp16 inference (CUDA only)")
    add("--no-fuse", dest="fuse", action="store_const", const=False, help="keep BatchNorm separate")
    add("--no-channels-last", dest="channels_last", action="store_const", const=False,
        help="keep NCHW weights (default NHWC)")
    add("--out-of-place", dest="inplace", action="store_const", const=False, help="Detect without in-place ops")
    add("--workers", type=int, help="default for --pre-workers and --post-workers (0: one per core)")
    add("--pre-workers", type=int, help="source + preprocess processes")
    add("--infer-workers", type=int, help="inference processes (0: one per GPU, one per core on CPU)")
    add("--post-workers", type=int, help="NMS + drawing processes")
    add("--infer-threads", type=int, help="torch threads per inference process (0: 1)")
    add("--batch-size", type=int, help="frames per inference batch (same letterboxed shape)")
    add("--max-wait-ms", type=float, help="longest wait for a full batch")
    add("--prefetch", type=int, help="batches of credit each consumer grants upstream")
    add("--frames", type=int, help="stop after N frames, looping the source if needed (0: one pass)")
    add("--warmup", type=int, help="first N frames excluded from statistics")
    add("--synthetic-count", type=int, help="frames in one pass of the synthetic source")
    add("--results", help="folder of run folders (default results)")
    add("--save-images", help="all, none, or N (every N-th frame)")
    add("--module-timing", help="none, layers, blocks or leaves")
    add("--timing-mode", help="auto, cpu, cuda-sync or cuda-events")
    add("--transport", help="ipc (default) or tcp")
    add("--log-level", help="debug, info, warning or error")
    add("--no-progress", dest="progress", action="store_const", const=False, help="no progress bar")
    ns = vars(p.parse_args(argv))
    return ns.pop("config"), ns


def resolve(cfg: RunConfig) -> tuple[RunConfig, dict]:
    """Fill the automatic counts, check devices and weights; returns the config and the plan
    of processes (name -> (role, torch threads, device))."""
    from yolo.checkpoint import read_checkpoint
    from yolo.devices import resolve_device
    from yolo.names import default_names
    specs = [s.strip() for s in cfg.device.split(",") if s.strip()]
    if not specs:
        raise ConfigError(f"config device: expected cpu, cuda, cuda:N or a list, got {cfg.device!r}")
    try:
        devices = [str(resolve_device(s)) for s in specs]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    on_cuda = devices[0].startswith("cuda")
    if any(d.startswith("cuda") != on_cuda for d in devices):
        raise ConfigError(f"config device: expected all CPU or all CUDA devices, got {cfg.device!r}")
    if cfg.half and not on_cuda:
        raise ConfigError(f"config half: fp16 needs a CUDA device, got device {cfg.device!r}")
    # A bad weights file is an error now, not in a worker; the class names travel to the stages.
    names = read_checkpoint(cfg.weights).names if cfg.weights else default_names(80)
    cores = os.cpu_count() or 1
    workers = cfg.workers or cores
    infer = cfg.infer_workers or (len(devices) if on_cuda else cores)
    resolved = RunConfig(**{**cfg.as_dict(), "classes": tuple(cfg.classes), "workers": workers,
                            "pre_workers": cfg.pre_workers or workers, "post_workers": cfg.post_workers or workers,
                            "infer_workers": infer, "infer_threads": cfg.infer_threads or 1,
                            "devices": tuple(devices)})
    return resolved, {"cores": cores, "on_cuda": on_cuda, "names": tuple(names)}


def warn_oversubscription(cfg: RunConfig, cores: int, on_cuda: bool) -> None:
    counts = {"--pre-workers": cfg.pre_workers, "--post-workers": cfg.post_workers}
    if not on_cuda:
        counts["--infer-workers x --infer-threads"] = cfg.infer_workers * cfg.infer_threads
    for flag, count in counts.items():
        if count > cores:
            log.warning("%s = %d on %d cores: the extra processes time-slice the cores, so each frame waits "
                        "for a core, per-stage ms rise and fps does not; more than the core count only pays "
                        "when a stage waits on disk or network", flag, count, cores)


def make_run_dir(results: str) -> str:
    os.makedirs(results, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id, n = stamp, 1
    while True:
        try:
            os.makedirs(os.path.join(results, run_id, "images"))
            break
        except FileExistsError:
            n += 1
            run_id = f"{stamp}-{n}"
    latest = os.path.join(results, "latest")
    if os.path.islink(latest) or not os.path.exists(latest):
        tmp = latest + ".tmp"
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.symlink(run_id, tmp)
        os.replace(tmp, latest)
    return os.path.join(results, run_id)


def start_processes(cfg: RunConfig, plan, endpoints, run_dir: str, log_path: str, started_s: float,
                    names: tuple[str, ...]) -> dict:
    # Imported here, not at the top: spawn re-imports this module in every child, and each
    # child should import only its own stage's libraries.
    from workers import collector, inference, postprocess, preprocess
    spawn = mp.get_context("spawn")
    processes = {}

    def stage(name, index, target, device="cpu", torch_threads=1, extra=()):
        args = StageArgs(name=name, index=index, config=cfg, plan=plan, endpoints=endpoints, log_path=log_path,
                         run_dir=run_dir, torch_threads=torch_threads, opencv_threads=1, device=device,
                         names=names, parent_pid=os.getpid())
        proc = spawn.Process(target=target, args=(args, *extra), name=name, daemon=True)
        proc.start()
        processes[name] = proc

    worker_names = ([f"pre-{i}" for i in range(cfg.pre_workers)] + [f"infer-{i}" for i in range(cfg.infer_workers)] +
             [f"post-{i}" for i in range(cfg.post_workers)])
    stage("collector", 0, collector.run, extra=(worker_names, started_s))
    for i in range(cfg.post_workers):
        stage(f"post-{i}", i, postprocess.run)
    for i in range(cfg.infer_workers):
        stage(f"infer-{i}", i, inference.run, device=cfg.devices[i % len(cfg.devices)],
              torch_threads=cfg.infer_threads)
    for i in range(cfg.pre_workers):
        stage(f"pre-{i}", i, preprocess.run)
    return processes


def watch(processes: dict, progress_in, control_out, total: int, show_progress: bool) -> tuple[dict | None, str | None]:
    """Until the collector reports the run finished: progress bar, crash and stall detection."""
    from tqdm import tqdm
    bar = tqdm(total=total, unit="frame", disable=not show_progress, dynamic_ncols=True, smoothing=0.1)
    finished, stop_reason = None, None
    last_done, last_change = 0, time.perf_counter()
    stop_sent_s = stopped_s = 0.0
    poller = zmq.Poller()
    poller.register(progress_in, zmq.POLLIN)
    try:
        while finished is None:
            try:
                events = dict(poller.poll(POLL_TIMEOUT_MS))
            except KeyboardInterrupt:
                stop_reason = stop_reason or "interrupted by the user (Ctrl-C)"
                continue
            if progress_in in events:
                msg = recv_message(progress_in)
                if msg.header["type"] == "finished":
                    finished = msg.header
                done = msg.header.get("processed", 0) + msg.header.get("failed", 0)
                if "processed" in msg.header:
                    bar.update(done - bar.n)
                    bar.set_postfix(failed=msg.header["failed"], refresh=False)
                if done != last_done:
                    last_done, last_change = done, time.perf_counter()
            now = time.perf_counter()
            if stop_reason is None:
                crashed = [f"{n} exited with code {p.exitcode}" for n, p in processes.items()
                           if p.exitcode not in (None, 0)]
                if crashed:
                    stop_reason = "; ".join(crashed)
                elif now - last_change > STALL_TIMEOUT_S:
                    stop_reason = f"no frame finished for {STALL_TIMEOUT_S:.0f} s"
                if stop_reason:
                    log.error("stopping the run: %s", stop_reason)
            if stop_reason is not None:
                stopped_s = stopped_s or now
                if now - stop_sent_s > STOP_RESEND_S:
                    send_message(control_out, {"type": STOP, "reason": stop_reason})
                    stop_sent_s = now
                if now - stopped_s > STOP_GIVE_UP_S:
                    log.error("no report %.0f s after the stop: ending every process", STOP_GIVE_UP_S)
                    break
            if processes["collector"].exitcode is not None and finished is None:
                finished = _last_finished(progress_in)  # it may have reported just before exiting
                if finished is None:
                    stop_reason = stop_reason or f"collector exited with code {processes['collector'].exitcode}"
                break
    finally:
        bar.close()
    return finished, stop_reason


def _last_finished(progress_in) -> dict | None:
    while progress_in.poll(0):
        msg = recv_message(progress_in)
        if msg.header["type"] == "finished":
            return msg.header
    return None


def stop_processes(processes: dict) -> None:
    deadline = time.perf_counter() + JOIN_TIMEOUT_S
    for proc in processes.values():
        proc.join(max(0.0, deadline - time.perf_counter()))
    for proc in processes.values():
        if proc.is_alive():
            log.warning("%s did not exit in time: terminating it", proc.name)
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config_path, overrides = parse_args(argv)
    try:
        cfg = build_config(read_toml(config_path), overrides)
        cfg, machine = resolve(cfg)
        from yolo.sources import plan_frames
        plan = plan_frames(cfg.source, cfg.frames or None, cfg.synthetic_count)
    except (ConfigError, ValueError) as exc:
        log.error("error: %s", exc)
        return 2
    if not cfg.weights:
        log.warning("no --weights: using a random-weight %s; timings are valid, detections are meaningless",
                    cfg.preset)
    warn_oversubscription(cfg, machine["cores"], machine["on_cuda"])
    run_dir = make_run_dir(cfg.results)
    log_path = os.path.join(run_dir, "run.log")
    file_log = logging.FileHandler(log_path, encoding="utf-8")
    file_log.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(file_log)
    log.info("run %s: %d frames from %s; %d pre, %d infer (%s, %d threads each), %d post workers",
             os.path.basename(run_dir), plan.total, cfg.source, cfg.pre_workers, cfg.infer_workers,
             ",".join(cfg.devices), cfg.infer_threads, cfg.post_workers)
    ipc_dir = tempfile.mkdtemp(prefix="yolo-")
    ctx = zmq.Context()
    control_out = make_socket(ctx, zmq.PUB, linger_ms=500)
    progress_in = make_socket(ctx, zmq.PULL)
    try:
        endpoints = make_endpoints(cfg.transport, ipc_dir, cfg.tcp_host, cfg.tcp_base_port, cfg.pre_workers,
                                   cfg.infer_workers)
        for socket, endpoint in ((control_out, endpoints.control), (progress_in, endpoints.progress)):
            try:
                socket.bind(endpoint)
            except zmq.ZMQError as exc:
                raise ValueError(f"cannot bind {endpoint}: {exc} (change tcp_base_port or use ipc)") from None
    except ValueError as exc:
        log.error("error: %s", exc)
        control_out.close()
        progress_in.close()
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)
        return 2
    processes = {}
    finished, stop_reason = None, None
    try:
        processes = start_processes(cfg, plan, endpoints, run_dir, log_path, time.perf_counter(),
                                    machine["names"])
        finished, stop_reason = watch(processes, progress_in, control_out, plan.total, cfg.progress)
    finally:
        send_message(control_out, {"type": STOP, "reason": stop_reason or "run finished"})
        stop_processes(processes)
        control_out.close()
        progress_in.close()
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)
    if finished is None:
        log.error("the run did not finish (%s); no report was written to %s", stop_reason, run_dir)
        return 1
    from analysis.terminal import format_summary
    import json
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    print(format_summary(finished["summary"], report))
    if stop_reason:
        log.error("the run was stopped: %s", stop_reason)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
