"""Extensions from outside the tree: modules named in ``YOLO_PIPELINE_PLUGINS`` (comma-separated,
importable names) that register stages, backends or input kinds when imported.

The runner imports them before it reads its flags (so ``--backend`` offers a plugin's backend),
and every process it starts imports them again first thing: the variable is inherited, and a
registration made in the runner alone would not reach a spawned or forked process's tables."""

from __future__ import annotations

import importlib
import os

PLUGINS_VARIABLE = "YOLO_PIPELINE_PLUGINS"


class PluginError(ImportError):
    """A plugin named in YOLO_PIPELINE_PLUGINS could not be imported; the message names it."""


def plugin_names(environ=None) -> list[str]:
    value = (os.environ if environ is None else environ).get(PLUGINS_VARIABLE, "")
    return [name.strip() for name in value.split(",") if name.strip()]


def load_plugins(environ=None) -> list[str]:
    """Import every plugin (idempotent: Python imports a module once); the names imported."""
    names = plugin_names(environ)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginError(f"{PLUGINS_VARIABLE}: cannot import plugin {name!r}: {exc}") from None
    return names
