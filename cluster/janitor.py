"""Removes a cluster actor's private folder once the actor's process is gone.

    python -m cluster.janitor ACTOR_PID FOLDER

The runner's guard (cluster/guard.py) removes the folder when the actor dies during a run, but
between runs there is no guard, and Ray kills an actor's direct children with SIGKILL when it
goes. So the actor starts this detached (not its child: ``start_detached``), and it watches the
actor's pid (and its start time, against a reused pid) and leaves when the folder is gone (the
actor removed it on a clean close) or after removing it, and the ipc folders runners killed
with it left. Standard library and psutil only (and wire.ipc_dirs, once the actor died).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

POLL_S = 0.5
LEFTOVER_WAIT_S = 10.0  # after the actor's death: its runner, killed with it, is gone by then


def start_detached(actor_pid: int, folder: str, repo_root: str) -> None:
    """Start the janitor as a grandchild that outlives this process: a shell starts it in the
    background and exits, so it is nobody's direct child here."""
    command = " ".join(map(_quoted, [sys.executable, "-m", "cluster.janitor", str(actor_pid), folder]))
    subprocess.run(["sh", "-c", f"{command} </dev/null >/dev/null 2>&1 &"], cwd=repo_root, check=True,
                   env=dict(os.environ, PYTHONPATH=repo_root), start_new_session=True)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m cluster.janitor ACTOR_PID FOLDER", file=sys.stderr)
        return 2
    pid, folder = int(argv[0]), argv[1]
    try:
        actor = psutil.Process(pid)
        started = actor.create_time()
    except psutil.Error:
        actor, started = None, None
    while os.path.isdir(folder) and actor is not None and _alive(actor, started):
        time.sleep(POLL_S)
    died = os.path.isdir(folder)  # else the actor removed it on a clean close
    shutil.rmtree(folder, ignore_errors=True)
    if died:
        _remove_runner_leftovers()
    return 0


def _remove_runner_leftovers(wait_s: float = LEFTOVER_WAIT_S) -> None:
    """A runner killed with its actor (a node removed) leaves its ipc folder in TMPDIR, which
    only the next run here would remove. For a few seconds after the actor's death, remove the
    folders of runners that are gone (a runner still draining removes its own)."""
    from wire.ipc_dirs import remove_stale_ipc_dirs  # imported here: the janitor starts light
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        remove_stale_ipc_dirs(tempfile.gettempdir())
        time.sleep(POLL_S)


def _alive(process: psutil.Process, started: float) -> bool:
    try:
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
