"""The runner's judgement of silent processes, on real processes: silence alone is not death.
A silent process that runs (spinning, or waiting for a core) is spared; one the kernel has
stopped, or that sleeps with its CPU clock still, is named; time the watcher itself was not
running is not silence."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from supervisor.health import Health
from supervisor.liveness import look
from wire.loop_clock import LoopClock

TIMEOUT_S = 1.0


@pytest.fixture
def spawn():
    """Start a helper process; every one is killed and reaped at the end."""
    started = []

    def start(code: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", code])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(10)


def _silent(health: Health, name: str, pid: int) -> None:
    """Expect ``name`` and take one beat from it: from now on it says nothing."""
    health.expect(name, 0, pid=pid)
    health.beat({"name": name, "incarnation": 0, "pid": pid, "loop_age_s": 0.0, "position": 0, "signal": None})


def _judged_for(health: Health, seconds: float) -> list[tuple[str, str]]:
    """Look every 0.1 s, as the runner does, for ``seconds``; everything it named."""
    named = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not named:
        named = health.stuck()
        time.sleep(0.1)
    return named


def test_a_silent_process_that_runs_is_late_not_dead(spawn):
    """A process spinning on the CPU (a worker starved of its heartbeat on a loaded machine, or
    busy in one long call) is not handled as dead at the heartbeat timeout."""
    busy = spawn("while True: pass")
    health = Health(TIMEOUT_S)
    _silent(health, "post-0", busy.pid)
    assert _judged_for(health, 3 * TIMEOUT_S) == []
    assert "post-0" in health.late_but_running


def test_a_silent_process_the_kernel_stopped_is_named(spawn):
    busy = spawn("while True: pass")
    health = Health(TIMEOUT_S)
    _silent(health, "infer-0", busy.pid)
    busy.send_signal(signal.SIGSTOP)
    named = _judged_for(health, 10 * TIMEOUT_S)
    assert [n for n, _ in named] == ["infer-0"] and "infer-0 has not answered for" in named[0][1], named
    assert look(busy.pid).stopped


def test_a_silent_process_that_sleeps_with_a_still_cpu_clock_is_named(spawn):
    """A deadlocked worker: alive, asleep, its CPU clock not moving, no heartbeat."""
    asleep = spawn("import time; time.sleep(600)")
    health = Health(TIMEOUT_S)
    _silent(health, "pre-0", asleep.pid)
    named = _judged_for(health, 10 * TIMEOUT_S)
    assert [n for n, _ in named] == ["pre-0"] and named[0][1].endswith("nor run"), named


def test_time_the_watcher_was_not_running_is_not_silence(spawn):
    """The watcher does not look for 3 timeouts (it was stopped, or starved): when it looks
    again, the silent sleeping process is not named at once; it is after a timeout of watching."""
    asleep = spawn("import time; time.sleep(600)")
    health = Health(TIMEOUT_S)
    _silent(health, "collector", asleep.pid)
    health.stuck()
    time.sleep(3 * TIMEOUT_S)
    assert health.stuck() == []
    assert health.clock.take_gaps() and health.clock.left_out_s > TIMEOUT_S
    assert [n for n, _ in _judged_for(health, 10 * TIMEOUT_S)] == ["collector"]


def test_a_process_that_is_gone_is_left_to_its_exit_code(spawn):
    done = spawn("pass")
    done.wait(30)
    health = Health(TIMEOUT_S)
    _silent(health, "post-1", done.pid)
    assert _judged_for(health, 2 * TIMEOUT_S) == []
    assert not look(done.pid).alive and not look(0).alive and not look(-5).alive


def test_the_loop_clock_leaves_out_long_gaps_and_counts_at_most_a_gap_per_reading(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    clock = LoopClock(gap_s=1.0)
    assert clock.now() == 100.0
    now[0] = 100.5
    assert clock.now() == 100.5  # a normal turn counts whole
    now[0] = 130.5
    assert clock.now() == 101.5  # 30 s not running: 1 s of it counts
    assert clock.take_gaps() == [30.0] and clock.take_gaps() == []
    for _ in range(5):  # a loop that only ever turns every 3 s still moves on, a gap per turn
        now[0] += 3.0
        clock.now()
    assert clock.now() == pytest.approx(106.5)
