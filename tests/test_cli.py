"""runner.py's command line as a detect.py user types it: detect.py's spellings, defaults in
--help, run folders named exp, exp2, ..., --exist-ok clearing the old run's outputs, and an error
object on stdout for --json."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

import runner
from supervisor.prepare import RUN_OUTPUT_DIRS, clear_run_outputs, device_specs, free_run_name
from settings.config import ConfigError, RunConfig, flag_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("flags, key, value", [
    (["--conf", "0.5"], "conf_thres", 0.5), (["--conf=0.4"], "conf_thres", 0.4),
    (["--conf-thres", "0.3"], "conf_thres", 0.3), (["--iou", "0.6"], "iou_thres", 0.6),
    (["--img", "320"], "imgsz", 320), (["--img-size", "256"], "imgsz", 256), (["--imgsz", "128"], "imgsz", 128),
    (["--nosave"], "save_images", "none"), (["--project", "runs/detect"], "results", "runs/detect"),
    (["--save-crop"], "save_crop", True), (["--line-thickness", "3"], "line_thickness", 3),
    (["--hide-labels"], "hide_labels", True), (["--hide-conf"], "hide_conf", True),
])
def test_detect_py_spellings_are_accepted(flags, key, value):
    config, given = runner.parse_args(flags)
    assert given[key] == value and config == runner.DEFAULT_CONFIG


def test_flags_not_given_override_nothing():
    _, given = runner.parse_args([])
    assert all(value is None for value in given.values())  # so --config FILE's values stand


def test_help_shows_every_default_and_which_letterbox_is_default():
    out = subprocess.run([sys.executable, "runner.py", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0
    entries = re.split(r"\n  (?=-)", out.stdout.split("options:")[1])  # one per option, wrapped lines joined
    lines = {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries if entry.strip()}
    assert "(default: 640)" in lines["--imgsz"] and "(default: 0.25)" in lines["--conf-thres"]
    assert lines["--rect"].endswith("(default)") and "default" not in lines["--square"]
    assert "(default: a timestamp)" in lines["--name"] and "(default: cpu)" in lines["--device"]
    source_file = re.search(r"\b(analysis|workers|supervisor|yolo)/\w+\.py", out.stdout)
    assert source_file is None  # no help line sends the user to read a source file


@pytest.mark.parametrize("device, specs", [("0", ["cuda:0"]), ("0,1", ["cuda:0", "cuda:1"]), ("cpu", ["cpu"]),
                                           (" cuda:1 , 2", ["cuda:1", "cuda:2"])])
def test_a_bare_device_index_is_a_cuda_device(device, specs):
    assert device_specs(device) == specs


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_0_without_cuda_says_cuda_is_missing(caplog):
    assert runner.main(["--device", "0", "--no-progress"]) == 2
    assert "CUDA is not available" in caplog.text and "expected cpu" not in caplog.text, caplog.text


def test_a_taken_name_becomes_name2_then_name3(tmp_path):
    assert free_run_name(str(tmp_path), "exp", False) == "exp"
    (tmp_path / "exp").mkdir()
    assert free_run_name(str(tmp_path), "exp", False) == "exp2"
    (tmp_path / "exp2").mkdir()
    assert free_run_name(str(tmp_path), "exp", False) == "exp3"
    assert free_run_name(str(tmp_path), "exp", True) == "exp" and free_run_name(str(tmp_path), "", False) == ""


def test_exist_ok_removes_what_a_run_writes_and_nothing_else(tmp_path):
    for folder in RUN_OUTPUT_DIRS:
        (tmp_path / folder / "sub").mkdir(parents=True)
        (tmp_path / folder / "sub" / "old.jpg").write_bytes(b"x")
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    removed = clear_run_outputs(str(tmp_path))
    assert set(removed) == {*RUN_OUTPUT_DIRS, "report.json"}
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_save_config_without_sweep_names_only_the_flag_given(caplog):
    assert runner.main(["--save-config", "best.toml", "--no-progress"]) == 2
    assert "--save-config: expected --sweep" in caplog.text and "--sweep-budget-s" not in caplog.text


@pytest.mark.parametrize("flags, error", [(["--bogus"], "unrecognized arguments: --bogus"),
                                          (["--imgsz", "33"], "--imgsz: expected a positive multiple of 32")])
def test_json_on_a_usage_error_prints_an_error_object(flags, error):
    out = subprocess.run([sys.executable, "runner.py", "--json", *flags], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    summary = json.loads(out.stdout)  # stdout holds exactly one JSON object
    assert summary["exit_code"] == 2 and error in summary["error"] and summary["run_dir"] is None


def test_a_bad_line_thickness_is_named():
    with pytest.raises(ConfigError, match="config line_thickness: expected 0 .* got -1"):
        RunConfig(line_thickness=-1)


def test_the_plan_is_said_before_the_checks_that_take_seconds(caplog):
    assert runner.main(["--source", "/no/such/dir", "--batch-size", "2", "--no-progress"]) == 2
    said = caplog.text.index("run: /no/such/dir on cpu with a random-weight yolov5n, batch 2; checking the weights")
    assert said < caplog.text.index("error: --source")


def test_every_setting_flag_the_runner_takes_is_the_one_its_messages_and_the_sweep_name():
    """flag_of (used by usage errors, the sweep's command line and its moves) names, for every
    setting the parser sets, one of the flags that set it to that value."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    checked = 0
    for action in runner.build_parser()._actions:
        if action.dest not in fields or not action.option_strings:
            continue
        value = action.const if action.const is not None else True
        assert flag_of(action.dest, value) in action.option_strings or \
            any(flag_of(action.dest, value) in other.option_strings for other in runner.build_parser()._actions
                if other.dest == action.dest), (action.dest, value, action.option_strings)
        checked += 1
    assert checked > 30
