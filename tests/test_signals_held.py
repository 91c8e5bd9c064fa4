"""Signals while the runner starts a child: the child starts with the stop signals blocked and
takes them over at its entry point (a SIGINT waiting there is dropped, a SIGTERM noted), and a
signal sent to the runner meanwhile is acted on once the child has started, never lost. Each
case runs in a fresh interpreter so that pytest's own signal mask is left alone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.live_run import REPO

STOP_BITS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def run_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def blocked(mask_hex: str) -> set[int]:
    mask = int(mask_hex, 16)
    return {s for s in STOP_BITS if mask >> (s - 1) & 1}


MASK_OF = '''
def mask_of(pid, field="SigBlk"):
    with open(f"/proc/{pid}/status") as status:
        return next(line.split()[1] for line in status if line.startswith(field + ":"))
'''


def test_a_signal_during_a_child_start_waits_and_the_child_starts_with_it_blocked():
    got = run_python(MASK_OF + '''
import json, os, signal, subprocess, sys, time
from supervisor.signals import Interrupts, signals_held
interrupts = Interrupts().install()
with signals_held():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    during = list(interrupts.received)
deadline = time.monotonic() + 5  # one taken by another thread reaches the main thread's handler a moment later
while len(interrupts.received) < 2 and time.monotonic() < deadline:
    time.sleep(0.005)
after = list(interrupts.received)
child_mask = mask_of(child.pid)
child.kill()
print(json.dumps({"during": during, "after": after, "child": child_mask, "runner": mask_of(os.getpid())}))
''')
    # The runner's own mask holds them only where no other thread has them open: numpy's import
    # starts OpenBLAS's pool, whose threads may take a process-directed signal, and Python then runs
    # the handler (a flag, nothing more) in the main thread inside the window, or just after it.
    # Either way none is lost, and the child's mask, copied from the starting thread, has all three
    # blocked.
    assert got["during"] == got["after"][:len(got["during"])], "handled at most once, in order"
    assert sorted(got["after"]) == ["SIGINT", "SIGTERM"], "and handled, not lost"
    assert blocked(got["child"]) == STOP_BITS and blocked(got["runner"]) == set(), got


def test_the_fork_server_and_its_children_start_with_the_stop_signals_blocked():
    """CPython's resource tracker unblocks SIGINT and SIGTERM in its caller when it starts: the
    runner starts it first, so the fork server still inherits all three blocked."""
    got = run_python(MASK_OF + '''
import json, os, multiprocessing.forkserver as forkserver
from supervisor.processes import start_fork_server, stop_helper_processes
start_fork_server()
server = forkserver._forkserver._forkserver_pid
result = {"server": mask_of(server), "runner": mask_of(os.getpid())}
stop_helper_processes(wait=False)
print(json.dumps(result))
''')
    assert blocked(got["server"]) == STOP_BITS and blocked(got["runner"]) == set(), got


def test_a_stage_takes_over_its_signals_drops_a_waiting_sigint_and_notes_a_sigterm():
    got = run_python(MASK_OF + '''
import json, os, signal, types
signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while the stage was still importing
os.kill(os.getpid(), signal.SIGTERM)
from process import lifecycle
received = lifecycle.enter_process(types.SimpleNamespace(name="pre-0"))
print(json.dumps({"mask": mask_of(os.getpid()), "noted": received.received,
                  "pending": sorted(int(s) for s in signal.sigpending())}))
''')
    assert blocked(got["mask"]) == set() and got["pending"] == [], got
    assert got["noted"] == ["SIGTERM"], "the SIGINT was dropped (the runner drains on it), the SIGTERM noted"
