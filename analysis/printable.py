"""Text safe to encode as UTF-8 and to show, for report.md, the terminal and run.log.

A file name that is not valid UTF-8 is a str with surrogate escapes in Python (as os.listdir
gives it); it travels so, byte for byte, and report.json and detections.json keep it (JSON's
\\udcff escapes). Where a person reads it, its bad bytes show as ``\\xff``.
"""

from __future__ import annotations

import logging


def printable(text: str) -> str:
    """``text`` with surrogate escapes shown as ``\\xNN``; everything else unchanged."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no file name gives
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


class PrintableFormatter(logging.Formatter):
    """Log lines through :func:`printable`: a strict UTF-8 file or terminal never refuses one."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))
