"""Extensions from outside the tree: the plugins named in ``YOLO_PIPELINE_PLUGINS``, comma-separated,
each ``module`` (registers what it adds when imported) or ``module:function`` (imported, then the
function called with no arguments: a module that must not register on every import, such as a
test module, says so).

The runner loads them before it reads its flags (so ``--backend`` offers a plugin's backend),
and every process it starts loads them again first thing: the variable is inherited, and a
registration made in the runner alone would not reach a spawned or forked process's tables."""

from __future__ import annotations

import importlib
import os

PLUGINS_VARIABLE = "YOLO_PIPELINE_PLUGINS"
_loaded: set[str] = set()


class PluginError(ImportError):
    """A plugin named in YOLO_PIPELINE_PLUGINS could not be loaded; the message names it."""


def plugin_names(environ=None) -> list[str]:
    value = (os.environ if environ is None else environ).get(PLUGINS_VARIABLE, "")
    return [name.strip() for name in value.split(",") if name.strip()]


def plugin_modules(environ=None) -> list[str]:
    """The modules the plugins live in (what a fork server may import ahead)."""
    return [name.partition(":")[0] for name in plugin_names(environ)]


def load_plugins(environ=None) -> list[str]:
    """Load every plugin once per process; the names loaded."""
    names = plugin_names(environ)
    for name in names:
        if name in _loaded:
            continue
        module_name, _, function = name.partition(":")
        try:
            module = importlib.import_module(module_name)
            if function:
                getattr(module, function)()
        except Exception as exc:  # whatever it raised, the run cannot start as asked: said, not a traceback
            raise PluginError(f"{PLUGINS_VARIABLE}: cannot load plugin {name!r}: {type(exc).__name__}: {exc}") from None
        _loaded.add(name)
    return names
