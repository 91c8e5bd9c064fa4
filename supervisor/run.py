"""One run of the pipeline, from a checked configuration to an outcome with an exit code.

The runner starts the stages, then watches: progress from the collector, a heartbeat from every
process, exits, and its own signals. A preprocess, inference or postprocess worker that dies or
stops answering is killed, the others are told (they send its frames again to the survivors or
to its next incarnation), and it is restarted, a bounded number of times per stage. Ctrl-C or
SIGTERM drains the run: no new frames are read, those in flight finish, a partial report is
written; a second one stops at once. Whatever happens, every process, socket file, shared-memory
segment and temporary folder of the run is gone when this returns.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket as socket_module
import tempfile
import time
from dataclasses import dataclass, field

import zmq

from analysis.atomic import write_bytes_atomic
from analysis.printable import PrintableFormatter
from supervisor.console import Console, ConsoleHandler, model_words
from supervisor.health import Health
from analysis.machine import Machine
from supervisor.prepare import make_run_dir, point_latest, slot_plan
from supervisor.stored_runs import release_name, release_unfinished, upload_run_folder
from inputs.object_store import is_store_url
from workers.store import run_root
from supervisor.salvage import salvage_lists, write_runner_report
from supervisor.processes import Launcher
from supervisor import exit_codes
from supervisor.signals import Interrupts
from supervisor.watch import Watch
from collector.journal import remove_journal
from settings.config import RunConfig
from wire.ipc_dirs import make_ipc_dir, remove_stale_ipc_dirs
from topology.stages import endpoint_names, sink_role, stage_counts, worker_names
from process.lifecycle import LOG_FORMAT
from wire.wiring import Endpoints, StageArgs, Wire, make_endpoints
from wire.messages import FINISHED, HEARTBEAT, PROGRESS, Stop, validate
from sharedmem.slots import remove_segments, remove_stale_segments
from wire.transport import REPORT_LIMITS, TOKEN_BYTES, CurveKeys, DropCounter, ProtocolError, make_socket, recv_message, send_message

log = logging.getLogger("runner")

WATCH_INTERVAL_S = 0.25  # heartbeats read, exits, hangs, deadlines and worker logs looked at this often (under
# the loop clock's GAP_S, so a watch that turns on time is never taken for a pause)

class UsageError(ValueError):
    """Found while setting the run up (a port in use): exit code 2, nothing started."""


@dataclass
class Outcome:
    exit_code: int
    run_dir: str | None
    summary: dict | None = None
    reason: str | None = None
    report_written: bool = False
    restarts: list = field(default_factory=list)
    dropped_messages: dict = field(default_factory=dict)  # {"kind": count} the runner itself dropped


def frames_planned(cfg: RunConfig, plan) -> str:
    """What the run will read, in words: a --duration run plans more frames than it will take."""
    if cfg.duration:
        return f"frames for {cfg.duration:g} s"
    if plan.total is None:
        return "frames until the stream ends or the run is stopped"
    return f"{plan.total} frames"


def run_pipeline(cfg: RunConfig, machine: Machine, names: tuple[str, ...], plan, *, show_progress: bool = True,
                 runner_started_s: float | None = None) -> Outcome:
    """Run the pipeline once; raises UsageError before anything starts if a socket cannot be bound.
    With --results in a store, the run folder is made in a private local folder and uploaded at
    the end (supervisor/stored_runs.py); the outcome's run_dir is then its URL."""
    if not is_store_url(cfg.results):
        return _run_once(cfg, machine, names, plan, show_progress, runner_started_s, local="")
    if cfg.run_folder:  # a cluster node's share: its folder stays for the node's actor, the driver merges
        return _run_once(cfg, machine, names, plan, show_progress, runner_started_s, cfg.run_folder)
    with tempfile.TemporaryDirectory(prefix="yolo-run-") as local:
        try:
            outcome = _run_once(cfg, machine, names, plan, show_progress, runner_started_s, local)
        except BaseException:
            release_unfinished(cfg.results, local)  # the name's claim goes with a run that did not start
            raise
        return _uploaded(cfg, outcome)


def _run_once(cfg: RunConfig, machine: Machine, names: tuple[str, ...], plan, show_progress: bool,
              runner_started_s: float | None, local: str) -> Outcome:
    runner_started_s = runner_started_s or time.perf_counter()
    if cfg.transport == "tcp":
        check_tcp_ports(make_endpoints("tcp", "", cfg.tcp_host, cfg.tcp_base_port, stage_counts(cfg)))
    removed = remove_stale_segments()
    removed_dirs = remove_stale_ipc_dirs()
    ipc_dir = _make_ipc_dir(cfg)  # before the run folder: a TMPDIR too long leaves no folder behind
    try:
        run_dir = make_run_dir(cfg.results, cfg.name, cfg.exist_ok, local, claimed=bool(cfg.run_folder))
    except ValueError as exc:  # another run took the --name between the check and now
        shutil.rmtree(ipc_dir, ignore_errors=True)
        raise UsageError(str(exc)) from None
    log_path = os.path.join(run_dir, "run.log")
    file_log = logging.FileHandler(log_path, encoding="utf-8")
    file_log.setFormatter(PrintableFormatter(LOG_FORMAT))
    console = Console(show_progress, None if cfg.duration else plan.total, log_path)  # None: the bar counts up
    console_log = ConsoleHandler(console, level=logging.getLogger().getEffectiveLevel())
    root = logging.getLogger()
    saved_handlers = root.handlers[:]
    root.handlers = [file_log, console_log]
    if removed or removed_dirs:
        log.info("removed %d shared-memory segments and %d ipc folders left by runs that were killed",
                 len(removed), len(removed_dirs))
    token = secrets.token_bytes(TOKEN_BYTES)
    wire = Wire(token, CurveKeys.generate() if cfg.transport == "tcp" else None)
    run_tag = f"{os.getpid()}-{token.hex()[:8]}"
    interrupts = Interrupts().install()
    ctx = zmq.Context()
    sockets = []
    launcher = None
    watch = None
    try:
        endpoints = make_endpoints(cfg.transport, ipc_dir, cfg.tcp_host, cfg.tcp_base_port, stage_counts(cfg))
        control_out = _bound(ctx, zmq.PUB, endpoints["control"], wire, sockets)
        progress_in = _bound(ctx, zmq.PULL, endpoints["progress"], wire, sockets)
        health_in = _bound(ctx, zmq.PULL, endpoints["health"], wire, sockets)
        slot_bytes, slot_count = slot_plan(cfg, plan)
        workers = worker_names(stage_counts(cfg))
        template = StageArgs(name="", index=0, config=cfg, plan=plan, endpoints=endpoints, wire=wire,
                             log_path=log_path, run_dir=run_dir, run_tag=run_tag, names=names,
                             runner_pid=os.getpid(), slot_bytes=slot_bytes, slot_count=slot_count,
                             workers=tuple(workers), runner_started_s=runner_started_s, machine=machine.as_dict())
        log.info("run %s: %s from %s; %s; %d pre, %d infer (%s, %d threads each), %d post workers; data path %s",
                 os.path.basename(run_dir), frames_planned(cfg, plan), cfg.source, model_words(cfg), cfg.pre_workers,
                 cfg.infer_workers, ",".join(cfg.devices), cfg.infer_threads, cfg.post_workers, cfg.data_path)
        log.debug("ipc sockets in %s; shared-memory segments %s*", ipc_dir, run_tag)
        launcher = Launcher(template)
        health = Health(cfg.heartbeat_timeout_s)
        watch = Watch(cfg, launcher, health, control_out, token, interrupts, console)
        console.say(f"starting {len(workers) + 1} processes (inference loads the model first)...")
        launcher.warm_up()
        for name in [sink_role()] + workers[::-1]:  # consumers first, so producers find them
            if interrupts.count:
                break  # interrupted during start-up: the watch ends it at once
            watch.start_worker(name)
        _watch(watch, progress_in, health_in, token, console)
    finally:
        interrupts.restore()
        if watch is not None and watch.phase != "done":
            watch.enter("done", "runner exiting")
        if launcher is not None:
            if watch is None or watch.kill_all:
                for name in list(launcher.processes):
                    launcher.kill(name)
            else:
                _send_quietly(sockets[0] if sockets else None, Stop("run over").to_message(), token)
            killed = launcher.stop_all()
            if killed:
                log.warning("killed %s: they did not exit in time", ", ".join(killed))
        for socket in sockets:
            socket.close(linger=0)
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)
        remove_segments(run_tag)
        console.finish((watch.finished or {}).get("summary", {}).get("fps") if watch else None)
        root.handlers = saved_handlers
        file_log.close()
    return _outcome(cfg, watch, run_dir, interrupts)


def _make_ipc_dir(cfg: RunConfig) -> str:
    longest = max(endpoint_names(stage_counts(cfg)), key=lambda name: len(os.fsencode(name)))
    try:
        return make_ipc_dir(longest)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_tcp_ports(endpoints: Endpoints) -> None:
    """Every port the run's processes will bind, tried now: a port in use is a usage error found
    before any process starts (a worker finding it later would only die)."""
    urls = endpoints.urls()
    for url in urls:
        host, port = url.removeprefix("tcp://").rsplit(":", 1)
        host = host.strip("[]")
        family = socket_module.AF_INET6 if ":" in host else socket_module.AF_INET
        with socket_module.socket(family, socket_module.SOCK_STREAM) as probe:
            probe.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_REUSEADDR, 1)  # as ZeroMQ binds
            try:
                probe.bind((host, int(port)))
            except OSError as exc:
                raise UsageError(f"--tcp-base-port: port {port} on {host} is not free ({exc.strerror}); the run "
                                 f"binds {len(urls)} consecutive ports from --tcp-base-port") from None


def _bound(ctx, kind: int, endpoint: str, wire: Wire, sockets: list) -> zmq.Socket:
    socket = make_socket(ctx, kind, linger_ms=500, max_message_bytes=REPORT_LIMITS.header_bytes,
                         curve=wire.curve, curve_server=True)
    sockets.append(socket)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        raise UsageError(f"cannot bind {endpoint}: {exc} (change tcp_base_port or use ipc)") from None
    return socket


def _send_quietly(socket, header: dict, token: bytes) -> None:
    if socket is not None:
        try:
            send_message(socket, header, token=token, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass


def _watch(watch: Watch, progress_in, health_in, token: bytes, console: Console) -> None:
    """Wakes for the collector's progress (the bar, the end of the run) and otherwise every
    WATCH_INTERVAL_S: heartbeats are read in one go then, not each as it comes (a run's
    processes beat several times a second), and so are exits, hangs, deadlines and the log. A
    wake for progress does that too unless it was done less than half an interval ago, so a
    running pipeline wakes the runner about four times a second, not eight."""
    drops = watch.drops
    watch.clock.take_gaps()  # starting the processes (the fork server importing torch) is no pause
    poller = zmq.Poller()
    poller.register(progress_in, zmq.POLLIN)
    wakeup_fd = watch.interrupts.wakeup_fd
    if wakeup_fd is not None:
        poller.register(wakeup_fd, zmq.POLLIN)  # a signal wakes the watch at once
    last_look_s = next_look_s = progress_s = 0.0
    while watch.phase != "done":
        wait_s = next_look_s - time.perf_counter()
        events = dict(poller.poll(max(0, int(1e3 * wait_s) + 1))) if wait_s > 0 else {}
        if wakeup_fd is not None and wakeup_fd in events:
            watch.interrupts.take_wakeups()
        now = time.perf_counter()
        if progress_in in events:
            _read_all(progress_in, token, {PROGRESS, FINISHED}, drops, "progress", lambda h: _on_progress(watch, h))
            progress_s = now
        looked_lately = now - last_look_s < WATCH_INTERVAL_S / 2
        if now < next_look_s and looked_lately and watch.finished is None \
                and watch.interrupts.count == watch.seen_interrupts:
            continue  # only progress: the rest waits for its turn
        # while progress comes (at most 4 times a second) the looks ride on its wake-ups: the timer
        # waits half an interval longer, still under the loop clock's GAP_S
        last_look_s = now
        next_look_s = now + WATCH_INTERVAL_S * (1.5 if now - progress_s < 2 * WATCH_INTERVAL_S else 1.0)
        _read_all(health_in, token, {HEARTBEAT}, drops, "health", lambda h: _on_beat(watch, h))
        console.echo_worker_logs()
        for gap_s in watch.clock.take_gaps():
            if gap_s > watch.cfg.heartbeat_timeout_s:  # one that would have looked like deaths
                log.info("the runner did not watch for %.1f s (stopped, or starved of CPU): deadlines re-armed", gap_s)
        if watch.finished is not None:
            watch.enter("done", watch.reason or "finished")
            break
        if not watch.health.ready() and watch.interrupts.count and watch.phase == "running":
            watch.reason = f"interrupted by {watch.interrupts.last_said()} during start-up: nothing was run"
            watch.kill_all = True
            watch.enter("done", watch.reason)
            break
        watch.on_interrupt()
        for name, code in watch.launcher.exited():
            watch.on_exit(name, code)
        for name, why in watch.health.stuck():
            watch.on_stuck(name, why)
        watch.check_deadlines()
        watch.repeat_notice()
    console.echo_worker_logs()


def _read_all(socket, token: bytes, types: set, drops: DropCounter, where: str, handle) -> None:
    while socket.poll(0):
        try:
            header = validate(recv_message(socket, token=token, limits=REPORT_LIMITS).header, frozenset(types))
        except ProtocolError as exc:
            drops.note(exc, where)
            continue
        handle(header)


def _on_beat(watch: Watch, header: dict) -> None:
    if watch.health.beat(header) and header.get("signal") in exit_codes.SIGNAL_EXIT_CODES:
        watch.interrupts.note(header["signal"])


def _on_progress(watch: Watch, header: dict) -> None:
    if header["type"] == FINISHED:
        watch.finished = header
        return
    watch.on_progress(header)


def _outcome(cfg: RunConfig, watch: Watch | None, run_dir: str, interrupts: Interrupts) -> Outcome:
    if watch is None:
        return Outcome(exit_codes.ABORTED, run_dir, reason="the run did not start")
    finished = watch.finished
    report_written = bool(finished and "report.json" in finished.get("written", ()))
    if report_written:
        _add_runner_drops(run_dir, watch.drops.counts)
        _point_latest(cfg, run_dir)
    elif watch.collector_died:
        report_written = _write_what_the_runner_knows(cfg, watch, run_dir)
    summary = (finished or {}).get("summary") or None
    outcome = Outcome(exit_codes.OK, run_dir, summary, watch.reason, report_written, watch.restart_log,
                      dict(watch.drops.counts))
    if interrupts.count:
        outcome.exit_code = interrupts.exit_code() or exit_codes.ABORTED
        if finished is None and not report_written:
            _remove_empty_run_dir(run_dir)
    elif watch.aborted or finished is None:
        outcome.exit_code = exit_codes.ABORTED
    elif summary and summary.get("stream_errors"):
        outcome.exit_code = exit_codes.ABORTED
        outcome.reason = "; ".join(summary["stream_errors"])
    elif summary and (summary.get("failed", 0) + summary.get("lost", 0)) and not cfg.allow_failures:
        outcome.exit_code = exit_codes.FRAMES_FAILED
        outcome.reason = (f"{summary['failed'] + summary.get('lost', 0)} of {summary.get('frames_in')} frames failed "
                          "(listed in report.md; --allow-failures makes this exit 0)")
    elif not report_written or (finished or {}).get("write_error") or (summary or {}).get("image_error"):
        outcome.exit_code = exit_codes.OUTPUT_INCOMPLETE
        outcome.reason = (finished or {}).get("write_error") or (summary or {}).get("image_error") or \
            "the report could not be written"
    return outcome


def _write_what_the_runner_knows(cfg: RunConfig, watch: Watch, run_dir: str) -> bool:
    """The collector died: its partial detections and predictions made valid, a report.json of
    what the runner knows, and results/latest pointed at the run."""
    salvaged = salvage_lists(run_dir)
    remove_journal(run_dir)
    written = write_runner_report(run_dir, reason=watch.reason or "the collector died", config=cfg.as_dict(),
                                  progress=watch.last_progress, restarts=watch.restart_log,
                                  dropped=dict(watch.drops.counts), salvaged=salvaged)
    if written:
        _point_latest(cfg, run_dir)
        log.error("report.json holds only what the runner knows; %s", ", ".join(
            f"{name} {count} records" for name, count in salvaged.items()) or "no detections were written")
    return written


def _point_latest(cfg: RunConfig, run_dir: str) -> None:
    if not is_store_url(cfg.results):  # a store has no links: its runs are found by name
        point_latest(run_dir)


def _uploaded(cfg: RunConfig, outcome: Outcome) -> Outcome:
    """The local run folder's files uploaded to the store (a failure is a write error, exit 4,
    naming the file and why); the outcome then names the run folder by its URL."""
    if outcome.run_dir is None:
        return outcome
    root = run_root(cfg.results, outcome.run_dir)
    if not os.path.isdir(outcome.run_dir):
        release_name(root)
        return outcome  # a run stopped before it wrote anything left no folder
    failed = upload_run_folder(outcome.run_dir, root)
    outcome.run_dir = root
    if outcome.summary:
        outcome.summary["run_dir"] = root
    if failed:
        name, reason = next(iter(failed.items()))
        outcome.report_written = outcome.report_written and "report.json" not in failed
        said = f"could not upload {len(failed)} files of the run folder to {root}, {name}: {reason}"
        if outcome.exit_code == exit_codes.OK:
            outcome.exit_code, outcome.reason = exit_codes.OUTPUT_INCOMPLETE, said
        else:
            outcome.reason = f"{outcome.reason}; {said}" if outcome.reason else said
    return outcome


def _add_runner_drops(run_dir: str, counts: dict) -> None:
    """The messages the runner itself refused go into report.json's dropped_messages as "runner":
    the collector wrote the report before the runner's last message was read."""
    if not counts:
        return
    path = os.path.join(run_dir, "report.json")
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        report.setdefault("dropped_messages", {})["runner"] = dict(counts)
        write_bytes_atomic(path, json.dumps(report, indent=1).encode())
    except (OSError, ValueError) as exc:
        log.error("could not add the runner's dropped messages to %s: %s", path, exc)


def _remove_empty_run_dir(run_dir: str) -> None:
    """A run stopped before it wrote anything (a log, empty folders, .partial files) leaves no folder."""
    entries = [os.path.join(run_dir, e) for e in os.listdir(run_dir) if e != "run.log" and not e.endswith(".partial")]
    if all(os.path.isdir(e) and not os.path.islink(e) and not os.listdir(e) for e in entries):
        shutil.rmtree(run_dir, ignore_errors=True)
