"""The folder of a run's ipc socket files: private (mode 0700), short enough for the unix socket
path limit, named with the runner's pid so that a later run can remove the folder of a killed
runner."""

from __future__ import annotations

import os
import shutil
import tempfile

from wire.transport import IPC_PATH_MAX_BYTES

IPC_DIR_PREFIX = "yolo-ipc-"  # + the runner's pid + "-" + random
FALLBACK_DIR = "/tmp"  # when TMPDIR is too long for socket paths
MKDTEMP_RANDOM_CHARS = 8


LONGEST_NAME = "pre-9999-returns"  # the longest socket name of a run of up to 10,000 workers a stage
SOCKET_DIRS_BYTES = 40  # room for Python's own socket folders (the fork server's pymp-*/listener-*)


def use_short_tmpdir() -> str | None:
    """Call first in the runner: when TMPDIR is so long that a socket in it would pass the unix
    socket path limit (the fork server's, and ipc's), point TMPDIR at /tmp for this process and
    its children; returns the folder now used, or None when TMPDIR was fine. ValueError naming
    TMPDIR when /tmp is no better."""
    current = tempfile.gettempdir()
    prefix = f"{IPC_DIR_PREFIX}{os.getpid()}-"
    if socket_path_bytes(current, prefix, LONGEST_NAME) <= IPC_PATH_MAX_BYTES:
        return None
    if os.path.isdir(FALLBACK_DIR) and os.access(FALLBACK_DIR, os.W_OK | os.X_OK) \
            and socket_path_bytes(FALLBACK_DIR, prefix, LONGEST_NAME) <= IPC_PATH_MAX_BYTES:
        os.environ["TMPDIR"] = tempfile.tempdir = FALLBACK_DIR
        return FALLBACK_DIR
    raise ValueError(f"TMPDIR: expected a folder whose path leaves room for socket paths of at most "
                     f"{IPC_PATH_MAX_BYTES} bytes (the unix socket limit), got {current!r} "
                     f"({len(os.fsencode(current))} bytes) and no writable {FALLBACK_DIR}: set TMPDIR to a "
                     "shorter folder")


def make_ipc_dir(longest_name: str) -> str:
    """A new private folder in TMPDIR; ValueError naming TMPDIR if the socket
    ``<folder>/<longest_name>.ipc`` would pass the unix socket path limit."""
    directory, prefix = tempfile.gettempdir(), f"{IPC_DIR_PREFIX}{os.getpid()}-"
    size = socket_path_bytes(directory, prefix, longest_name)
    if size > IPC_PATH_MAX_BYTES:
        raise ValueError(f"TMPDIR: expected a folder whose path leaves room for ipc socket paths of at most "
                         f"{IPC_PATH_MAX_BYTES} bytes (the unix socket limit), got {directory!r} ({size} bytes with "
                         "the socket's name): set TMPDIR to a shorter folder, or use --transport tcp")
    return tempfile.mkdtemp(prefix=prefix, dir=directory)


def socket_path_bytes(directory: str, prefix: str, name: str) -> int:
    """Bytes of ``<directory>/<prefix><random>/<name>.ipc``, or of Python's own socket folders."""
    ours = len(os.fsencode(os.path.join(directory, prefix + "x" * MKDTEMP_RANDOM_CHARS, f"{name}.ipc")))
    return max(ours, len(os.fsencode(directory)) + SOCKET_DIRS_BYTES)


def remove_stale_ipc_dirs(directory: str | None = None) -> list[str]:
    """Remove this user's ipc folders of runners that are gone (a SIGKILLed runner leaves its own),
    in ``directory``, or in TMPDIR and /tmp."""
    if directory is None:
        folders = dict.fromkeys(os.path.realpath(d) for d in (tempfile.gettempdir(), FALLBACK_DIR) if os.path.isdir(d))
        return [name for folder in folders for name in remove_stale_ipc_dirs(folder)]
    removed = []
    for entry in os.scandir(directory):
        pid_text = entry.name.removeprefix(IPC_DIR_PREFIX).split("-", 1)[0]
        if not (entry.name.startswith(IPC_DIR_PREFIX) and pid_text.isdigit()) or pid_alive(int(pid_text)):
            continue
        try:
            mine = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
        except FileNotFoundError:  # another run starting now removed it first
            continue
        if mine:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid exists (a runner's: the leftovers named after it are in use)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
