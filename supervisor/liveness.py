"""What the OS knows of a process that has gone silent, read before it is called dead.

A late heartbeat alone does not tell a hung process from one on a busy machine. The kernel does:
a process it has stopped (SIGSTOP, Ctrl-Z, a debugger), or one whose threads all sleep while its
CPU clock stands still (a deadlock), is hung; one whose CPU clock advances, or with a thread
waiting for a core (state R) or for the disk (state D, swapping), is alive and only late.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

STOPPED_STATES = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
GONE_STATES = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})
WAITING_STATES = (b"R", b"D")  # runnable (waiting for a core), uninterruptible (waiting for the disk)


@dataclass(frozen=True)
class OsView:
    alive: bool
    stopped: bool = False  # state T or t: it cannot run until someone sends SIGCONT
    cpu_s: float = 0.0  # the time its live threads ran
    waiting_threads: int = 0  # threads in state R or D

    @property
    def state(self) -> str:
        """In words, for log lines."""
        if not self.alive:
            return "gone"
        if self.stopped:
            return "stopped (SIGSTOP, Ctrl-Z or a debugger)"
        if self.waiting_threads:
            return f"{self.waiting_threads} of its threads waiting for a core or the disk"
        return f"{self.cpu_s:.2f} s of CPU so far"


def look(pid: int) -> OsView:
    """The OS's view of ``pid`` now; ``alive`` False for no such process, a zombie, or no pid."""
    if pid <= 0:
        return OsView(alive=False)
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = process.status()
            times = process.cpu_times()
    except (psutil.Error, ValueError):
        return OsView(alive=False)
    if status in GONE_STATES:
        return OsView(alive=False)
    waiting, cpu_ns = _threads(pid)
    cpu_s = cpu_ns / 1e9 if cpu_ns is not None else times.user + times.system
    return OsView(True, status in STOPPED_STATES, cpu_s, waiting)


def _threads(pid: int) -> tuple[int, int | None]:
    """(threads in state R or D, nanoseconds its live threads ran), from /proc/<pid>/task/*/:
    psutil gives the main thread's state only (a worker's main thread sleeps in poll while its
    heartbeat thread waits for a core), and CPU times in 10 ms ticks (an idle worker uses one in
    seconds), where schedstat counts nanoseconds. None for the time where schedstat is missing."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, None
    waiting, cpu_ns, complete = 0, 0, True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:  # the thread ended meanwhile
            continue
        state = stat[stat.rfind(b")") + 2:][:1]  # the field after the command, which may hold spaces
        waiting += state in WAITING_STATES
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as schedstat_file:
                cpu_ns += int(schedstat_file.read().split()[0])
        except (OSError, ValueError, IndexError):  # a kernel without schedstat, or the thread just ended
            complete = False
    return waiting, cpu_ns if complete else None
