"""Sweep trials on the live pipeline: a small sweep through runner.py; its flags checked before
anything starts; a trial stopped by a signal ends the sweep (whichever signal: Ctrl-C, SIGTERM
or SIGHUP when the terminal closes), and a trial that fails for any other reason is a failed
trial and the sweep goes on."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from supervisor import exit_codes
from supervisor.run import Outcome
from sweep import trials
from sweep.search import Machine, Settings, Sweep, SweepInterrupted
from settings.config import build_config, read_toml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

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


# -- live --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_small_live_sweep_finds_settings_at_least_as_fast_as_the_defaults(tmp_path):
    budget_s = 80  # a candidate and the final check kept free for it; one trial only under heavy load
    saved = tmp_path / "best.toml"
    out = subprocess.run([sys.executable, "runner.py", "--sweep", "--sweep-budget-s", str(budget_s), "--imgsz", "96",
                          "--save-images", "none", "--duration", "5", "--results", str(tmp_path / "results"),
                          "--name", "tune", "--save-config", str(saved), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=budget_s + 60)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    sweep_dir = tmp_path / "results" / "tune"
    assert summary["sweep_dir"] == str(sweep_dir)
    assert summary["elapsed_s"] <= budget_s
    assert summary["trials"][0]["purpose"] == "defaults" and summary["defaults"]["fps"] > 0
    assert summary["best"]["fps"] >= summary["defaults"]["fps"]
    with open(sweep_dir / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == summary["trial_count"] >= 1
    if summary["trial_count"] == 1:  # a loaded machine (load ~9 on 2 cores) fits only the defaults in the budget
        assert summary["best"]["settings"] == summary["defaults"]["settings"]
    assert json.loads((sweep_dir / "sweep.json").read_text())["best"] == summary["best"]
    plots = [sweep_dir / "sweep.png"] + [sweep_dir / "trial-01" / name for name in
                                         json.loads((sweep_dir / "trial-01" / "report.json").read_text())["plots"]]
    for plot in plots:
        data = plot.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, plot
    assert not (sweep_dir / "trial-01" / "images").exists()
    assert Settings.of(build_config(read_toml(str(saved)), {})) == Settings(**summary["best"]["settings"])
    assert "--batch-size" in summary["command"] and "--sweep" not in summary["command"]


@pytest.mark.parametrize("flags, message", [
    (["--save-config", "best.toml"], "expected --sweep as well"),
    (["--sweep", "--sweep-budget-s", "10"], "--sweep-budget-s: expected at least"),
    (["--sweep", "--save-config", "/no/such/folder/best.toml"], "--save-config: expected a file in an existing folder"),
])
def test_sweep_flags_are_checked_before_anything_starts(flags, message, caplog):
    from runner import main
    assert main(flags) == 2
    assert message in caplog.text
