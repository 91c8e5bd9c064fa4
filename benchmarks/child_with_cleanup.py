"""A benchmark run in a child process whose leftovers the parent removes if the child's own
clean-up does not run: for benchmarks that make machine-wide things (network namespaces, a
bridge, servers) which a process killed at once would leave behind.

bench_cluster_store.py found a SIGTERM to its single process killing it at once in 3 of 6 tries
(exit 143, no traceback, namespaces and Ray nodes left; cause not found). So the parent, which
imports neither Ray nor moto, passes SIGTERM and SIGINT on to the child as SIGINT, gives it
LEFT_GRACE_S to clean up itself, then kills it and calls the benchmark's own ``clean_up``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable

CHILD_ENV = "YP_BENCH_CHILD"
LEFT_GRACE_S = 120.0  # the benchmark's own clean-up after a signal, before it is killed


def in_child() -> bool:
    """Whether this process is the child :func:`run_in_child` started."""
    return os.environ.get(CHILD_ENV) == "1"


def on_sigterm() -> None:
    """SIGTERM and SIGINT clean up as Ctrl-C does (the cluster and the server go with the ``with``
    blocks); SIGINT too, which a shell's background job (and so this child) inherits ignored."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_in_child(limit_s: float, clean_up: Callable[[], None]) -> int:
    """Run this script again as a child with the same arguments; its exit code (128 + the signal
    when this process was signalled). A child signalled to death, or still running LEFT_GRACE_S
    after a signal or past ``limit_s``, is killed and ``clean_up`` called here."""
    child = subprocess.Popen([sys.executable, sys.argv[0], *sys.argv[1:]], env={**os.environ, CHILD_ENV: "1"},
                             start_new_session=True)  # a terminal's Ctrl-C reaches it once, from here
    signalled = []
    grace_end = None

    def forward(signum, _frame):
        signalled.append(signum)
        if len(signalled) == 1 and child.poll() is None:
            child.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    deadline = time.monotonic() + limit_s
    while child.poll() is None:
        if not signalled and time.monotonic() > deadline:
            print(f"error: the benchmark ran past {limit_s:.0f} s: stopping it", file=sys.stderr, flush=True)
            forward(signal.SIGTERM, None)
        if signalled:
            grace_end = grace_end or time.monotonic() + LEFT_GRACE_S
            if time.monotonic() > grace_end:
                child.kill()
        time.sleep(0.2)
    code = child.returncode
    if code < 0 and code != -signal.SIGINT or signalled and code not in (0, 1, -signal.SIGINT):
        print(f"the benchmark ended with {code}: cleaning up after it", file=sys.stderr)
        clean_up()
    if signalled:
        return 128 + signalled[0]
    return 2 if code < 0 else code
