"""Ctrl-C and SIGTERM on a live run, delivered as a terminal or a process manager does: the exit
code, the partial report, and after every exit no process, ipc folder, /dev/shm segment or
temporary folder of the run left, and results/latest pointing only at a run folder with a report."""

from __future__ import annotations

import signal
import time

import pytest

from tests.live_run import SMALL_RUN
from process.faults import TEST_SLOW_ENV, TEST_START_ENV

pytestmark = pytest.mark.slow

SLOW_RUN = (*SMALL_RUN, "--preset", "none", "--frames", "400", "--save-images", "1")
SLOW_POST = {TEST_SLOW_ENV: "post:30"}  # about 30 frames a second: a run still going when the signal comes


def assert_partial_report(run, reason: str) -> dict:
    report = run.report()
    frames = report["frames"]
    assert 0 < frames["processed"] < frames["in"] == 400
    assert frames["cancelled"] > 0 and frames["accounted"]
    assert frames["processed"] + frames["failed"] + frames["lost"] + frames["cancelled"] == frames["in"]
    assert reason in (report["stop"]["reason"] or ""), report["stop"]
    assert (run.results / "latest").resolve() == run.run_dir.resolve()
    return report


def test_ctrl_c_drains_the_run_and_exits_130_with_a_partial_report(live):
    run = live(*SLOW_RUN, env=SLOW_POST)
    run.wait_for_images(5)
    run.ctrl_c()
    started = time.monotonic()
    assert run.wait() == 130, run.stderr()
    assert time.monotonic() - started < 15
    assert "Ctrl-C: finishing the frames in flight" in run.stderr()
    report = assert_partial_report(run, "interrupted by Ctrl-C")
    assert report["frames"]["lost"] == 0  # drained: what was in flight finished
    assert "Traceback" not in run.stderr()
    run.assert_clean()


def test_a_second_ctrl_c_stops_at_once(live):
    run = live(*SLOW_RUN, env={TEST_SLOW_ENV: "post:1000"})  # a drain of the frames in flight takes its 5 s limit
    run.wait_for_images(1)
    run.ctrl_c()
    time.sleep(0.3)  # the first one has been taken: the drain began
    run.ctrl_c()
    started = time.monotonic()
    assert run.wait() == 130, run.stderr()
    assert time.monotonic() - started < 10  # a drain alone would take its 5 s, then the stop
    assert "Ctrl-C again: stopping now" in run.stderr() and "Traceback" not in run.stderr()
    report = assert_partial_report(run, "interrupted by Ctrl-C")
    assert report["frames"]["lost"] > 0  # frames in flight were not finished: stopped, not drained
    run.assert_clean()


@pytest.mark.parametrize("sent, target, code", [(signal.SIGTERM, "runner", 143), (signal.SIGTERM, "group", 143),
                                                 (signal.SIGHUP, "group", 129)])
def test_sigterm_and_sighup_drain_the_run_with_a_report(live, sent, target, code):
    """SIGTERM to the runner alone (kill PID) or to its whole process group (a process manager),
    or SIGHUP to the group (the terminal or ssh session closed): the run drains as for Ctrl-C,
    writes its report and exits 128 + the signal number."""
    run = live(*SLOW_RUN, env=SLOW_POST)
    run.wait_for_images(5)
    if target == "runner":
        run.signal_runner(sent)
    else:
        run.signal_group(sent)
    assert run.wait() == code, run.stderr()
    assert_partial_report(run, sent.name)
    assert "Traceback" not in run.stderr()
    run.assert_clean()


@pytest.mark.parametrize("when", ["imports", "processes"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(live, when):
    """Ctrl-C while the runner imports, or while its processes start (models loading): one line
    saying so, exit 130, no traceback from any process, and no run folder left."""
    # Inference takes 20 s more to start: the collector is up long before the run can start, on
    # any machine (with the bare model's few seconds a loaded machine raced past start-up).
    run = live(*SMALL_RUN, "--frames", "8", env={TEST_START_ENV: "infer:20"})
    if when == "imports":
        time.sleep(0.3)
    else:
        run.wait_for_stage("collector", 30)
    run.ctrl_c()
    assert run.wait(30) == 130, run.stderr()
    lines = [line for line in run.stderr().splitlines() if "interrupt" in line.lower()]
    assert len(lines) == 1, run.stderr()
    assert "Traceback" not in run.stderr() and "KeyboardInterrupt" not in run.stderr(), run.stderr()
    assert not run.run_dir.exists(), sorted(p.name for p in run.run_dir.iterdir())
    run.assert_clean()


def test_a_signal_makes_the_watchs_wake_up_pipe_readable_and_restore_closes_it():
    """The watch waits up to 0.25 s between looks; a signal wakes its poll at once through the
    wake-up pipe, and restore() puts the handlers and the previous wake-up fd back."""
    import os
    import select

    from supervisor.signals import Interrupts
    handler_before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or ray's where an earlier test ran ray.init here
    fd_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd_before)
    interrupts = Interrupts().install()
    try:
        assert interrupts.wakeup_fd is not None
        assert select.select([interrupts.wakeup_fd], [], [], 0)[0] == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert select.select([interrupts.wakeup_fd], [], [], 1.0)[0] == [interrupts.wakeup_fd]
        interrupts.take_wakeups()
        assert select.select([interrupts.wakeup_fd], [], [], 0)[0] == []
        assert interrupts.received == ["SIGTERM"]
    finally:
        interrupts.restore()
    assert interrupts.wakeup_fd is None and signal.getsignal(signal.SIGTERM) is handler_before
    assert signal.set_wakeup_fd(fd_before) == fd_before, "the previous wake-up fd is back"
