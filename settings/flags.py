"""The runner's flags for the run settings, made from their declarations (settings/declare.py):
a setting's own flag with its aliases, then its switches, with config.toml's values as defaults."""

from __future__ import annotations

import argparse
from typing import Any

from settings.declare import declared, own_flag

# What a value flag parses its words into, by the field's type (as written in the class).
VALUE_KINDS: dict[str, dict[str, Any]] = {"str": {}, "int": {"type": int}, "float": {"type": float},
                                          "tuple[int, ...]": {"type": int, "nargs": "+"}}


class ConfigDefault:
    """A flag's value when the user did not give it: config.toml's, shown by ``--help``, never
    an override (``--config FILE`` may set it otherwise)."""

    def __init__(self, value, shown: str | None = None):
        self.value, self.shown = value, shown

    def __str__(self) -> str:
        if self.shown is not None:
            return self.shown
        if isinstance(self.value, (list, tuple)):
            return " ".join(map(str, self.value)) or "all"
        return str(self.value)


def add_setting_flags(parser: argparse.ArgumentParser, config_class: type, defaults: dict[str, Any]) -> None:
    """Every declared setting's flags on ``parser``, in declaration order; each sets the field's
    name. A bool's own flag is a switch to true; a setting in ``defaults`` (config.toml's values)
    defaults to a :class:`ConfigDefault` of it, any other to None."""
    for f, s in declared(config_class):
        default = {"default": ConfigDefault(defaults[f.name], s.shown)} if f.name in defaults else {}
        if s.flag:
            kind = {"action": "store_const", "const": True} if f.type == "bool" else _value_kind(f.name, f.type)
            if s.choices is not None:
                kind["choices"] = s.choices()
            parser.add_argument(own_flag(f.name), *s.aliases, dest=f.name, help=s.help, **kind, **default)
        for switch in s.switches:
            parser.add_argument(switch.flag, dest=f.name, action="store_const", const=switch.value, help=switch.help,
                                **default)


def _value_kind(name: str, kind: str) -> dict[str, Any]:
    if kind not in VALUE_KINDS:
        raise TypeError(f"setting {name}: expected a type of {list(VALUE_KINDS)} or bool for a flag, got {kind}")
    return dict(VALUE_KINDS[kind])
