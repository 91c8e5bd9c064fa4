"""A paused or starved machine is not a dead one: live runs whose runner is stopped (SIGSTOP, or
Ctrl-Z then `fg`) for longer than the heartbeat timeout end as if nothing happened, while a
worker that is itself stopped is still found and killed (tests/test_faults.py)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.live_run import SMALL_RUN
from process.faults import TEST_SLOW_ENV

pytestmark = pytest.mark.slow

TIMEOUT = ("--heartbeat-timeout-s", "1.5")
PAUSE_S = 4.0  # well over the timeout above


def test_a_runner_paused_mid_run_goes_on_when_it_resumes(live):
    """SIGSTOP to the runner alone for 4 s (timeout 1.5 s) while frames flow, then SIGCONT: no
    process is declared dead, every frame is processed, exit 0."""
    run = live(*SMALL_RUN, *TIMEOUT, "--preset", "none", "--frames", "60", "--save-images", "1",
               env={TEST_SLOW_ENV: "post:40"})
    run.wait_for_images(3)
    run.signal_runner(signal.SIGSTOP)
    time.sleep(PAUSE_S)
    run.signal_runner(signal.SIGCONT)
    assert run.wait() == 0, run.stderr()
    assert "has not answered" not in run.log() and "killed it" not in run.log(), run.log()[-2000:]
    report = run.report()
    assert report["frames"]["processed"] == 60 and not report["restarts"]
    run.assert_clean()


def test_a_run_that_finishes_while_its_runner_is_paused_exits_0_with_its_report(live):
    """The runner stopped until the collector has written the whole report: on SIGCONT the runner
    reads the collector's 'finished', exits 0 and points results/latest at the run."""
    run = live(*SMALL_RUN, *TIMEOUT, "--preset", "none", "--frames", "12", "--save-images", "1",
               env={TEST_SLOW_ENV: "post:20"})
    run.wait_for_images(2)
    run.signal_runner(signal.SIGSTOP)
    try:
        run.wait_until(lambda: (run.run_dir / "report.json").is_file() and run.stage("collector") is None, 60,
                       "the collector to write the report and exit")
    finally:
        run.signal_runner(signal.SIGCONT)
    assert run.wait() == 0, run.stderr()
    assert "cannot go on without its collector" not in run.stderr(), run.stderr()
    assert run.report()["frames"]["processed"] == 12
    assert (run.results / "latest").resolve() == run.run_dir.resolve()
    run.assert_clean()


def test_ctrl_z_then_fg_of_the_whole_run_goes_on(live):
    """What a terminal does on Ctrl-Z and `fg`: SIGTSTP to the whole process group, and SIGCONT
    4 s later. Every process resumes; every frame is processed; exit 0."""
    run = live(*SMALL_RUN, *TIMEOUT, "--preset", "none", "--frames", "40", "--save-images", "1",
               env={TEST_SLOW_ENV: "post:40"})
    run.wait_for_images(3)
    run.signal_group(signal.SIGSTOP)  # SIGTSTP would be ignored by an orphaned process group
    time.sleep(PAUSE_S)
    run.signal_group(signal.SIGCONT)
    assert run.wait() == 0, run.stderr()
    assert "has not answered" not in run.log(), run.log()[-2000:]
    assert run.report()["frames"]["processed"] == 40
    run.assert_clean()
