"""Failed frames in a stage's log: the first few one by one, then a count. A folder of 5,000
broken files would otherwise print 5,000 lines on the terminal (the runner echoes warnings);
report.json and report.md list every failure with its reason."""

from __future__ import annotations

import logging

FIRST_LOGGED = 5  # failed frames logged one by one per process


class FailureLog:
    def __init__(self, log: logging.Logger, first: int = FIRST_LOGGED):
        self.log, self.first = log, first
        self.count = 0

    def failed(self, message: str, *args, exc_info: bool = False) -> None:
        """One failed frame: logged as a warning while under the first few, counted after."""
        self.count += 1
        if self.count <= self.first:
            self.log.warning(message, *args, exc_info=exc_info)
        if self.count == self.first:
            self.log.warning("further failed frames of this process are counted, not logged one by one "
                             "(report.md lists each with its reason)")

    def close(self) -> None:
        if self.count > self.first:
            self.log.warning("%d frames failed here in all, %d of them not logged one by one", self.count,
                             self.count - self.first)
