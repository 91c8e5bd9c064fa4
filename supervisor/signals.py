"""Ctrl-C and SIGTERM in the runner: a flag, never an exception in the middle of a loop.

The first one drains the run (stop reading, finish what is in flight, write a partial report),
the second stops it at once, the third kills every process. Children are started with SIGINT
blocked and SIGTERM ignored (:func:`quiet_children`), so a Ctrl-C during start-up never prints
a traceback per process; each stage then takes its own signals (workers.lifecycle.enter_process).
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


@dataclass
class Interrupts:
    received: list[str] = field(default_factory=list)  # signal names, in order
    _previous: dict = field(default_factory=dict)

    def install(self) -> Interrupts:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._note)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _note(self, signum, frame) -> None:
        self.received.append(signal.Signals(signum).name)

    def note(self, name: str) -> None:
        """A signal a worker received and passed on (a SIGTERM to the process group)."""
        if name not in self.received:
            self.received.append(name)

    @property
    def count(self) -> int:
        return len(self.received)

    def first(self) -> str | None:
        return self.received[0] if self.received else None

    def exit_code(self) -> int | None:
        return EXIT_CODES.get(self.first()) if self.received else None


@contextlib.contextmanager
def quiet_children():
    """Around starting a process: it inherits SIGINT blocked and SIGTERM ignored, and turns
    both into its own handling once its entry point runs; a signal meanwhile reaches the
    runner when the block ends (SIGINT) or through its own handler (SIGTERM)."""
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
