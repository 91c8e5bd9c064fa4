"""The ``--help`` layout of ``runner.py`` and ``python -m yolo``: argparse's own
ArgumentDefaultsHelpFormatter, told how to show a switch's default and when there is none to show."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; a switch (``--rect``, ``--exist-ok``) says
    "(default)" when it is the default and nothing when it is not; a value whose default is
    "not set" (None, False) or spelled out in the help already shows nothing more. A default
    object with a ``shown`` attribute (settings/flags.py's config.toml defaults) is shown as that text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        value = getattr(default, "value", default)
        if "%(default)" in text or "(default" in text or default is argparse.SUPPRESS:
            return text
        if action.nargs == 0:  # a switch: store_const / store_true
            return f"{text} (default)" if action.const == value and value is not None else text
        if value is None or value is False:
            return text
        return f"{text} (default: %(default)s)"
