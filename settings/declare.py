"""A run setting is declared once, on its RunConfig field: its default, its config.toml section,
the flags that set it and their help. The config file's sections and the switches that turn a
setting off are read from those declarations here; the runner's flags in settings/flags.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

METADATA_KEY = "setting"


@dataclass(frozen=True)
class Switch:
    """A flag without a value that sets its setting to ``value``: ``--square`` (rect false),
    ``--nosave`` (save_images "none")."""

    flag: str
    value: Any
    help: str


@dataclass(frozen=True)
class Setting:
    """What a field declares beyond its type and default."""

    section: str  # its table in config.toml
    help: str  # of its own flag
    aliases: tuple[str, ...]  # more spellings of its own flag: --img, --img-size for --imgsz
    switches: tuple[Switch, ...]
    flag: bool  # False: no flag of its own (only its switches, or only config.toml, set it)
    choices: Callable[[], tuple[str, ...]] | None  # called when a parser is built: plugins may add some
    shown: str | None  # --help's words for a default whose value says little ("" -> "a timestamp")


def setting(default: Any, section: str, help: str = "", *, aliases: tuple[str, ...] = (),
            switches: tuple[Switch, ...] = (), flag: bool = True, choices: Callable[[], tuple[str, ...]] | None = None,
            shown: str | None = None) -> Any:
    """A dataclass field that is a run setting, e.g.
    ``imgsz: int = setting(640, "detect", "letterbox size", aliases=("--img", "--img-size"))``:
    a value flag ``--imgsz`` (its name with dashes; a bool's flag is a switch to true) with two
    more spellings, read from ``[detect]`` in a config file."""
    if flag and not help:
        raise ValueError(f"setting in [{section}]: expected the help of its flag, got none")
    return dataclasses.field(default=default, metadata={
        METADATA_KEY: Setting(section, help, tuple(aliases), tuple(switches), flag, choices, shown)})


def declared(config_class: type) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of ``config_class`` declared with :func:`setting`, in their order."""
    return [(f, f.metadata[METADATA_KEY]) for f in dataclasses.fields(config_class) if METADATA_KEY in f.metadata]


def sections(config_class: type) -> dict[str, tuple[str, ...]]:
    """Config file section -> the settings it holds, both in declaration order."""
    table: dict[str, list[str]] = {}
    for f, s in declared(config_class):
        table.setdefault(s.section, []).append(f.name)
    return {section: tuple(names) for section, names in table.items()}


def switches_off(config_class: type) -> dict[str, str]:
    """Setting -> the switch that sets it false: ``{"rect": "--square", "fuse": "--no-fuse", ...}``."""
    return {f.name: switch.flag for f, s in declared(config_class) for switch in s.switches if switch.value is False}


def own_flag(name: str) -> str:
    """A setting's own flag: ``--`` and its name with dashes (``batch_size`` -> ``--batch-size``)."""
    return "--" + name.replace("_", "-")
