"""Starting the stage processes the cheap way, and ending them for sure.

Preprocess workers and the collector use no torch: they are spawned fresh (about 0.3 s each).
Inference and postprocess workers need torch, whose import costs seconds and hundreds of MB per
process: they are forked from one fork server that imported torch once, so they start at once
and share those pages (less memory in the sum of PSS, and a restart takes a fraction of a second).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.resource_tracker as resource_tracker
import os
import signal
import time

from supervisor.limits import check_address_space
from supervisor.signals import signals_held
from settings.config import ConfigError
from wire.ipc_dirs import use_short_tmpdir
from topology.plugins import plugin_modules
from topology.stages import index_of, kind_of, role_of, stages
from wire.wiring import StageArgs

FORKSERVER_IMPORTS = ["torch", "torchvision", "cv2"]
JOIN_TIMEOUT_S = 10.0

log = logging.getLogger("runner")


def forkserver_preload() -> list[str]:
    """What the fork server imports once, for every torch stage it forks: torch, the plugins
    (their registrations), and the torch stages' modules."""
    return FORKSERVER_IMPORTS + plugin_modules() + [kind.module for kind in stages() if kind.uses_torch]


def run_stage(module: str, args: StageArgs) -> None:
    """A child's entry point: the stage module is imported here, in the child, so the runner
    never imports what only a stage needs (torch)."""
    importlib.import_module(module).run(args)


def start_fork_server() -> None:
    """Start the fork server (idempotent): it imports torch, in its own process, while the runner
    goes on checking the configuration and the lean processes start. A ``ulimit -v`` too small
    for torch is a ConfigError here, not an abort in the fork server."""
    check_address_space()
    _short_tmpdir()
    mp.get_context("forkserver").set_forkserver_preload(forkserver_preload())
    with signals_held():
        resource_tracker.ensure_running()  # first: starting it unblocks SIGINT and SIGTERM in the caller
    with signals_held():
        multiprocessing.forkserver.ensure_running()


def _short_tmpdir() -> None:
    """Before the fork server makes its socket in TMPDIR: a TMPDIR too long for socket paths is
    swapped for /tmp, or refused naming TMPDIR (a ConfigError: exit 2)."""
    try:
        used = use_short_tmpdir()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if used:
        log.info("TMPDIR is too long for socket paths: using %s for this run's sockets", used)


class Launcher:
    """Starts and restarts named stage processes from a template of their arguments."""

    def __init__(self, template: StageArgs):
        self.template = template
        self.spawn = mp.get_context("spawn")
        self.forked = mp.get_context("forkserver")
        self.processes: dict[str, mp.process.BaseProcess] = {}
        self.incarnations: dict[str, int] = {}

    def warm_up(self) -> None:
        start_fork_server()

    def start(self, name: str, device: str = "cpu", torch_threads: int = 1, start_position: int = 0,
              poison: tuple[int, str] = (-1, ""), poison_frames: tuple[tuple[int, str], ...] = (),
              resume=None) -> None:
        """``resume``: a restarted collector's collector.journal.Resume."""
        kind = kind_of(role_of(name))
        incarnation = self.incarnations.get(name, -1) + 1
        args = dataclasses.replace(self.template, name=name, index=index_of(name),
                                   incarnation=incarnation, device=device, torch_threads=torch_threads,
                                   start_position=start_position, poison_position=poison[0], poison_reason=poison[1],
                                   poison_frames=poison_frames, resume=resume)
        context = self.forked if kind.uses_torch else self.spawn
        process = context.Process(target=run_stage, args=(kind.module, args), name=name, daemon=True)
        if context is self.forked:
            process.start()  # forked by the fork server, started with the signals blocked; may wait for it
        else:
            with signals_held():
                process.start()
        self.processes[name] = process
        self.incarnations[name] = incarnation

    def pid(self, name: str) -> int:
        process = self.processes.get(name)
        return (process.pid or 0) if process is not None else 0

    def incarnation(self, name: str) -> int:
        return self.incarnations.get(name, 0)

    def exited(self) -> list[tuple[str, int]]:
        """(name, exit code) of processes that ended and have not been reported yet."""
        return [(name, p.exitcode) for name, p in self.processes.items() if p.exitcode is not None]

    def forget(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            process.join(0)

    def kill(self, name: str) -> None:
        """SIGKILL: a stage ignores SIGINT and turns SIGTERM into a request to drain the run."""
        process = self.processes.get(name)
        if process is not None and process.exitcode is None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.join(5.0)

    def alive(self, role: str) -> list[str]:
        return [n for n, p in self.processes.items() if role_of(n) == role and p.exitcode is None]

    def stop_all(self, timeout_s: float = JOIN_TIMEOUT_S) -> list[str]:
        """Wait for every process to exit by itself, then kill the rest; returns who was killed."""
        deadline = time.perf_counter() + timeout_s
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.perf_counter()))
        killed = [name for name, p in self.processes.items() if p.exitcode is None]
        for name in killed:
            self.kill(name)
        return killed


def stop_helper_processes(wait: bool = True) -> None:
    """Stop multiprocessing's fork server and resource tracker. They would end with the runner
    anyway; reaping them (``wait``) also hands their CPU time, and that of the workers the fork
    server reaped, to the OS's accounting of the runner (what `time` and rusage report). Without
    ``wait`` (a run that never started) the fork server ends by itself once its imports are done.
    Uses the private ``_stop`` methods that CPython's own tests use; without them, nothing."""
    if not wait:
        _kill_fork_server()
        return
    for helper in (getattr(multiprocessing.forkserver, "_forkserver", None),
                   getattr(resource_tracker, "_resource_tracker", None)):
        stop = getattr(helper, "_stop", None)
        if stop is None:
            continue
        try:
            stop()
        except (OSError, ChildProcessError):
            pass


def _kill_fork_server() -> None:
    """A run that never started: the fork server, still importing torch, has no children yet;
    end it now rather than let it finish its imports after the runner has gone."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    server._forkserver_pid = None
