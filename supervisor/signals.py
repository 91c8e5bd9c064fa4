"""Ctrl-C, SIGTERM and SIGHUP in the runner: a flag, never an exception in the middle of a loop.

The first one drains the run (stop reading, finish what is in flight, write a partial report),
the second stops it at once, the third kills every process. Children are started with the stop
signals blocked (:func:`signals_held`; a blocked mask survives fork and exec), so a Ctrl-C during
start-up never prints a traceback per process, nor kills the fork server while it imports torch;
each stage then takes its own signals and unblocks them (process.lifecycle.enter_process). A
signal that reaches the runner while it starts a child waits, blocked, and is acted on when the
child has started: it is never lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

from supervisor.exit_codes import SIGNAL_EXIT_CODES
from process.lifecycle import STOP_SIGNALS

SIGNAL_WORDS = {"SIGINT": "Ctrl-C", "SIGHUP": "SIGHUP (terminal closed)"}  # what the user did, in their words


@dataclass
class Interrupts:
    received: list[str] = field(default_factory=list)  # signal names, in order
    _previous: dict = field(default_factory=dict)
    wakeup_fd: int | None = None  # readable when a signal came: a watch waiting in poll wakes at once
    _write_fd: int | None = None
    _previous_wakeup_fd: int = -1

    def install(self) -> Interrupts:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._note)
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: the watch sees the signal at its next turn
            os.close(read_fd)
            os.close(write_fd)
        else:
            self.wakeup_fd, self._write_fd = read_fd, write_fd
        return self

    def take_wakeups(self) -> None:
        """Empty the wake-up pipe (the signals themselves are in ``received``)."""
        try:
            while os.read(self.wakeup_fd, 512):
                pass
        except (BlockingIOError, TypeError):
            pass

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self.wakeup_fd is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.close(self.wakeup_fd)
            os.close(self._write_fd)
            self.wakeup_fd = self._write_fd = None

    def _note(self, signum, frame) -> None:
        self.received.append(signal.Signals(signum).name)

    def note(self, name: str) -> None:
        """A signal a worker received and passed on (a SIGTERM or SIGHUP to the process group)."""
        if name not in self.received:
            self.received.append(name)

    @property
    def count(self) -> int:
        return len(self.received)

    def first(self) -> str | None:
        return self.received[0] if self.received else None

    def last_said(self) -> str:
        """The latest signal as the user would name it ("Ctrl-C")."""
        return SIGNAL_WORDS.get(self.received[-1], self.received[-1]) if self.received else "a signal"

    def exit_code(self) -> int | None:
        return SIGNAL_EXIT_CODES.get(self.first()) if self.received else None


@contextlib.contextmanager
def signals_held():
    """Around starting a process (a few milliseconds: fork and exec, or a request to the fork
    server; longer on a loaded machine): the child inherits the stop signals blocked until its
    entry point takes them over, and the runner receives one sent meanwhile when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
