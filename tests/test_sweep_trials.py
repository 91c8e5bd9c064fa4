"""A sweep trial stopped by a signal ends the sweep (whichever signal: Ctrl-C, SIGTERM or SIGHUP
when the terminal closes); a trial that fails for any other reason is a failed trial and the
sweep goes on."""

from __future__ import annotations

import pytest

from supervisor import exit_codes
from supervisor.run import Outcome
from sweep import trials
from sweep.search import Machine, Settings, Sweep, SweepInterrupted
from workers.config import build_config

SETTINGS = Settings(pre_workers=1, infer_workers=1, post_workers=1, infer_threads=1, batch_size=1)


@pytest.fixture
def live_trials(tmp_path, monkeypatch):
    """LiveTrials whose pipeline run ends with the exit code a test sets, without starting processes."""
    ended = {"code": exit_codes.OK}

    def fake_run(cfg, machine, names, plan, show_progress=True):
        return Outcome(ended["code"], str(tmp_path / "trial"), summary=None, reason=f"ended with {ended['code']}")

    monkeypatch.setattr(trials, "run_pipeline", fake_run)
    monkeypatch.setattr(trials, "plan_source", lambda cfg, download_dir="": None)
    given = build_config({}, {"preset": "none", "source": "synthetic"})
    return trials.LiveTrials(given, str(tmp_path), trial_s=1.0), ended


@pytest.mark.parametrize("signal_name", sorted(exit_codes.SIGNAL_EXIT_CODES))
def test_a_trial_stopped_by_any_stop_signal_ends_the_sweep(live_trials, signal_name):
    measure, ended = live_trials
    ended["code"] = exit_codes.SIGNAL_EXIT_CODES[signal_name]
    with pytest.raises(SweepInterrupted) as stopped:
        measure(SETTINGS, 1)
    assert stopped.value.exit_code == ended["code"]


def test_a_trial_that_aborts_is_a_failed_trial_not_an_interrupt(live_trials):
    measure, ended = live_trials
    ended["code"] = exit_codes.ABORTED
    measurement = measure(SETTINGS, 1)
    assert measurement.fps is None and measurement.exit_code == exit_codes.ABORTED and not measurement.ok


def test_a_sighup_during_a_trial_stops_the_search_with_its_exit_code(live_trials):
    measure, ended = live_trials
    ended["code"] = exit_codes.SIGNAL_EXIT_CODES["SIGHUP"]
    result = Sweep(measure, Machine(cores=2), budget_s=600.0, trial_s=1.0).run(SETTINGS)
    assert result.interrupted == 129 and len(result.trials) == 0
