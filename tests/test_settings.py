"""Each run setting is declared once, on its RunConfig field: config.toml repeats exactly those
settings in their sections with their defaults, and the runner's flags are made from them with
the spellings, switches and help that users know."""

import dataclasses
import json
import os
import subprocess
import sys
import tomllib

import pytest

import runner
from backends import registry
from settings.config import SECTIONS, SWITCHES_OFF, RunConfig, read_toml
from settings.declare import Switch, declared, setting
from settings.flags import add_setting_flags

CONFIG_ONLY = {"trace_module_forwards", "trace_max_frames", "run_folder"}  # no flag of their own: set in a config file


def test_config_toml_holds_every_declared_setting_in_its_section():
    with open(runner.DEFAULT_CONFIG, "rb") as f:
        data = tomllib.load(f)
    found = {(section, key) for section, table in data.items() for key in table}
    declared_keys = {(s.section, f.name) for f, s in declared(RunConfig)}
    assert found - declared_keys == set(), "in config.toml, not declared (or in another section)"
    assert declared_keys - found == set(), "declared, missing from config.toml"


def test_config_toml_values_are_the_declared_defaults():
    values = read_toml(runner.DEFAULT_CONFIG)
    differ = {f.name: (values[f.name], f.default) for f, _ in declared(RunConfig) if values[f.name] != f.default}
    assert differ == {}, "config.toml value, RunConfig default"


def test_sections_and_switches_come_from_the_declarations():
    assert list(SECTIONS) == ["model", "detect", "source", "pipeline", "output", "transport"]
    assert [name for names in SECTIONS.values() for name in names] == [f.name for f, _ in declared(RunConfig)]
    assert SWITCHES_OFF == {"rect": "--square", "fuse": "--no-fuse", "channels_last": "--no-channels-last",
                            "inplace": "--out-of-place", "progress": "--no-progress"}


def test_every_setting_has_a_flag_with_help():
    actions = runner.build_parser()._actions
    without = {f.name for f, _ in declared(RunConfig)
               if not any(a.dest == f.name and a.option_strings and a.help for a in actions)}
    assert without == CONFIG_ONLY
    assert all(a.help for a in actions)


@pytest.mark.parametrize("flags, key, value", [
    (["--img-size", "256"], "imgsz", 256), (["--conf", "0.5"], "conf_thres", 0.5), (["--iou=0.6"], "iou_thres", 0.6),
    (["--project", "runs"], "results", "runs"), (["--weights", "w.pt"], "weights", "w.pt"),
    (["--rect"], "rect", True), (["--square"], "rect", False), (["--square", "--rect"], "rect", True),
    (["--no-fuse"], "fuse", False), (["--out-of-place"], "inplace", False),
    (["--no-channels-last"], "channels_last", False), (["--no-progress"], "progress", False),
    (["--nosave"], "save_images", "none"), (["--save-images", "3"], "save_images", "3"),
    (["--classes", "0", "2"], "classes", [0, 2]), (["--max-wait-ms", "2.5"], "max_wait_ms", 2.5),
    (["--half"], "half", True), (["--json"], "json", True), (["--backend", "openvino"], "backend", "openvino"),
])
def test_flags_set_their_setting(flags, key, value):
    _, given = runner.parse_args(flags)
    assert given[key] == value
    assert all(v is None for k, v in given.items() if k != key)


def test_help_shows_config_defaults_in_words_where_declared():
    text = runner.build_parser().format_help()
    assert "(default: none: a random-weight --preset)" in " ".join(text.split())


def test_backend_choices_are_read_when_the_parser_is_built(monkeypatch):
    registry.register(registry.BackendSpec("plugged", "backends.torch_backend"))
    try:
        _, given = runner.parse_args(["--backend", "plugged"])
        assert given["backend"] == "plugged" and RunConfig(backend="plugged").backend == "plugged"
    finally:
        registry.unregister("plugged")


def test_an_unknown_backend_is_refused_by_the_flag_and_the_config():
    with pytest.raises(SystemExit):
        runner.parse_args(["--backend", "plugged"])
    with pytest.raises(ValueError, match="config backend: expected one of .*'torch'.* got 'plugged'"):
        RunConfig(backend="plugged")


def test_a_plugin_that_cannot_be_imported_is_a_usage_error(monkeypatch, caplog):
    monkeypatch.setenv("YOLO_PIPELINE_PLUGINS", "no_such_plugin_module")
    assert runner.main(["--no-progress"]) == 2
    assert "error: YOLO_PIPELINE_PLUGINS: cannot load plugin 'no_such_plugin_module'" in caplog.text
    out = subprocess.run([sys.executable, "runner.py", "--json"], cwd=os.path.dirname(runner.DEFAULT_CONFIG),
                         capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 2 and "cannot load plugin" in json.loads(out.stdout)["error"]


def test_a_flag_needs_its_help_and_a_type_the_parser_knows():
    with pytest.raises(ValueError, match="expected the help of its flag"):
        setting(1, "detect")

    @dataclasses.dataclass
    class Odd:
        pairs: "dict" = setting(None, "detect", "a mapping", switches=(Switch("--no-pairs", None, "none"),))

    with pytest.raises(TypeError, match="setting pairs: expected a type of"):
        add_setting_flags(runner.Parser(), Odd, {})
