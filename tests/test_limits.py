"""The machine's limits before anything starts: memory for --imgsz, open files, address space,
socket path length, and a run folder name taken by another run. Each is exit 2 with the figure
it needs (or the limit is raised where the hard limit allows), never an OOM kill, a libzmq abort
or a traceback; and a flood of failed frames is a few lines and a count on the terminal."""

from __future__ import annotations

import dataclasses
import os
import re
import resource
from pathlib import Path

import pytest

from supervisor.limits import check_frame_memory, descriptors_needed
from supervisor.prepare import make_run_dir, resolve
from tests.live_run import SMALL_RUN
from settings.config import ConfigError, RunConfig
from process.failure_log import FIRST_LOGGED
from wire.ipc_dirs import IPC_DIR_PREFIX, make_ipc_dir, use_short_tmpdir

QUICK = (*SMALL_RUN, "--preset", "none", "--frames", "8", "--save-images", "none")


def _no_run_folder(run) -> bool:
    return not run.run_dir.exists()


# -- memory ------------------------------------------------------------------------------------------

def test_an_imgsz_whose_frames_cannot_fit_in_memory_is_refused_with_the_largest_that_fits():
    cfg = RunConfig(imgsz=100000, preset="yolov5n")
    with pytest.raises(ConfigError, match=r"config imgsz: frames of 100000x100000 need at least \d+ MB") as caught:
        resolve(cfg)
    fits = int(re.search(r"--imgsz (\d+) is the largest that fits", str(caught.value)).group(1))
    assert fits % 32 == 0 and fits >= 640  # this machine runs 640 (the test suite does)
    resolved, _, _ = resolve(dataclasses.replace(cfg, imgsz=fits))  # and that one is accepted
    assert resolved.imgsz == fits


def test_the_largest_imgsz_given_is_the_largest_that_fits():
    cfg = RunConfig(imgsz=4096, preset="yolov5n", infer_workers=2, batch_size=1)
    available = 2_000_000_000
    with pytest.raises(ConfigError) as caught:
        check_frame_memory(cfg, 20, available=available)
    fits = int(re.search(r"--imgsz (\d+) is", str(caught.value)).group(1))
    check_frame_memory(dataclasses.replace(cfg, imgsz=fits), 20, available=available)
    with pytest.raises(ConfigError):
        check_frame_memory(dataclasses.replace(cfg, imgsz=fits + 32), 20, available=available)


def test_a_huge_imgsz_exits_2_before_any_process_starts(live):
    run = live(*QUICK[:-4], "--imgsz", "100000", "--frames", "2")
    assert run.wait(60) == 2
    assert "--imgsz: frames of 100000x100000 need" in run.stderr() and "Traceback" not in run.stderr(), run.stderr()
    assert _no_run_folder(run)
    run.assert_clean()


@pytest.mark.parametrize("limit", ["ulimit -v 3000000", "ulimit -v 1000000"])
def test_an_address_space_too_small_for_torch_exits_2_naming_memory(live, limit):
    run = live(*QUICK, shell=["sh", "-c"], script=f"{limit} && {{runner}}")
    assert run.wait(60) == 2
    err = run.stderr()
    assert "error: memory: the address space is limited to" in err and "ulimit -v" in err, err
    assert "Traceback" not in err and _no_run_folder(run)
    run.assert_clean()


# -- open files --------------------------------------------------------------------------------------

def test_too_few_open_files_exits_2_naming_how_many_the_plan_needs(live):
    """`ulimit -n 64` (soft and hard) with 16 workers a stage: refused before anything starts."""
    run = live(*QUICK, "--workers", "16", shell=["sh", "-c"], script="ulimit -n 64 && {runner}")
    assert run.wait(60) == 2
    needed = descriptors_needed(16 + 1 + 16 + 2)
    assert f"35 processes need about {needed} open files each, and this shell allows 64 (ulimit -n" in run.stderr()
    assert "Traceback" not in run.stderr() and _no_run_folder(run), run.stderr()
    run.assert_clean()


def test_a_low_soft_open_file_limit_is_raised_to_what_the_run_needs(live):
    """`ulimit -Sn 48` with a hard limit above it and 6 workers a stage (the runner alone would hold
    about 70 descriptors): the soft limit is raised, every frame is processed."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096:
        pytest.skip("the hard open-file limit is too low to raise the soft one")
    run = live(*QUICK, "--workers", "6", "--infer-workers", "2", shell=["sh", "-c"], script="ulimit -Sn 48 && {runner}")
    assert run.wait() == 0, run.stderr()
    assert run.report()["frames"]["processed"] == 8
    assert "Too many open files" not in run.log() + run.stderr()
    run.assert_clean()


# -- socket paths, run folders -----------------------------------------------------------------------

def test_a_tmpdir_too_long_for_socket_paths_uses_a_short_one(live, tmp_path):
    long_tmp = tmp_path / ("t" * 90)
    long_tmp.mkdir()
    run = live(*QUICK, env={"TMPDIR": str(long_tmp)})
    assert run.wait() == 0, run.stderr()
    assert run.report()["frames"]["processed"] == 8
    assert not list(long_tmp.glob(f"{IPC_DIR_PREFIX}*")) and not list(Path("/tmp").glob(
        f"{IPC_DIR_PREFIX}{run.runner_pid}-*"))
    run.assert_clean()


def test_no_short_folder_for_socket_paths_is_a_usage_error_naming_tmpdir(tmp_path, monkeypatch):
    import tempfile

    import wire.ipc_dirs as ipc_dirs
    long_tmp = tmp_path / ("t" * 90)
    long_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.setattr(ipc_dirs, "FALLBACK_DIR", str(long_tmp / "missing"))
    with pytest.raises(ValueError, match="TMPDIR: expected a folder .* set TMPDIR to a shorter folder"):
        use_short_tmpdir()
    with pytest.raises(ValueError, match="TMPDIR: expected a folder .* set TMPDIR to a shorter folder"):
        make_ipc_dir("pre-15-returns")
    assert not os.listdir(long_tmp)
    monkeypatch.setattr(ipc_dirs, "FALLBACK_DIR", "/tmp")
    assert use_short_tmpdir() == "/tmp" == tempfile.gettempdir() == os.environ["TMPDIR"]
    assert use_short_tmpdir() is None  # now short enough


def test_a_run_folder_name_taken_meanwhile_is_a_usage_error_not_a_traceback(tmp_path):
    """The name check and the folder's creation are one step: mkdir either makes it or fails."""
    first = make_run_dir(str(tmp_path), "same")
    with pytest.raises(ConfigError, match="--name: run folder .* exists"):
        make_run_dir(str(tmp_path), "same")
    assert make_run_dir(str(tmp_path), "same", exist_ok=True) == first


def test_two_runs_started_together_with_one_name_one_runs_the_other_exits_2(live, tmp_path):
    """Both take the name when it is free: one gets the folder, the other exits 2. On a busy
    machine one may start after the other made the folder: it then takes ``same2`` (exit 0,
    as detect.py's exp -> exp2). Either way no traceback and no run writes into the other's."""
    runs = [live(*QUICK, name="same") for _ in range(2)]
    codes = sorted(run.wait() for run in runs)
    assert codes in ([0, 2], [0, 0]), [run.stderr() for run in runs]
    assert not any("Traceback" in run.stderr() for run in runs), [run.stderr() for run in runs]
    if codes == [0, 2]:
        loser = runs[0] if "error: " in runs[0].stderr() else runs[1]
        assert "run folder" in loser.stderr(), loser.stderr()
    else:
        assert "this run goes to" in runs[0].stderr() + runs[1].stderr(), [run.stderr() for run in runs]
    for run in runs:
        run.assert_clean()


# -- a flood of failed frames ------------------------------------------------------------------------

def test_thousands_of_failed_frames_are_a_few_lines_and_a_count(live, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for i in range(40):
        (folder / f"{i:03d}.jpg").write_text("not an image")  # a media name that does not decode: a failed frame
    run = live(*SMALL_RUN, "--preset", "none", "--source", str(folder), "--allow-failures")
    assert run.wait() == 0, run.stderr()
    err = run.stderr()
    assert err.count(") failed: ") == FIRST_LOGGED, err
    assert "40 frames failed here in all, 35 of them not logged one by one" in err, err
    assert len(run.report()["frames"]["failures"]) == 40  # the report keeps them all
    run.assert_clean()
