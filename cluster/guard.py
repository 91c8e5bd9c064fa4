"""Runs one command and makes sure it stops when the process that started the guard dies.

    python -m cluster.guard PARENT_PID WORK_DIR -- python runner.py ...

Ray kills an actor's direct children (SIGKILL, no clean-up) and not at all when the actor
crashes, so the chunk's runner is not the actor's child but the guard's: the guard asks the
kernel for SIGTERM when its parent (the actor) dies (PR_SET_PDEATHSIG), the runner gets the same
when the guard dies, and a runner told SIGTERM drains and removes its processes, shared memory
and ipc folder. SIGINT and SIGTERM given to the guard are passed on; it exits with the runner's
code. When the parent died, the guard also removes ``WORK_DIR`` (the actor's private folder, with
the chunk's partial outputs), which nobody else would. Standard library only: it starts in a
fraction of a second.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile

PR_SET_PDEATHSIG = 1
IPC_DIR_PREFIX = "yolo-ipc-"  # wire.ipc_dirs.IPC_DIR_PREFIX (the guard imports nothing of the project)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m cluster.guard PARENT_PID WORK_DIR -- COMMAND ...", file=sys.stderr)
        return 2
    parent, work_dir, command = int(argv[0]), argv[1], argv[3:]
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the request above: nothing to run for
        shutil.rmtree(work_dir, ignore_errors=True)
        return 143
    # The guard is single-threaded, so preexec_fn is safe here (it is not inside a Ray worker).
    child = subprocess.Popen(command, preexec_fn=die_with_parent)
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    if os.getppid() != parent:  # the actor died: its folder is an orphan now
        shutil.rmtree(work_dir, ignore_errors=True)
    remove_ipc_leftovers(child.pid)
    return 128 - code if code < 0 else code


def remove_ipc_leftovers(runner_pid: int) -> None:
    """The ipc folder a runner that was killed left (one that drained removed its own); named as
    wire.ipc_dirs names it, in TMPDIR or /tmp."""
    for folder in {tempfile.gettempdir(), "/tmp"}:
        for path in glob.glob(os.path.join(folder, f"{IPC_DIR_PREFIX}{runner_pid}-*")):
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
