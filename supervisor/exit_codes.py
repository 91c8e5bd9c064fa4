"""What the runner's exit code says, defined once for the runner, the run, its signals and the sweep
(the README's "Exit codes" table lists the same)."""

from __future__ import annotations

OK = 0
ABORTED = 1  # the run could not go on (or a stream broke)
USAGE = 2  # bad flags, config or input found before anything started
FRAMES_FAILED = 3  # some frames failed (listed in report.md); --allow-failures makes it 0
OUTPUT_INCOMPLETE = 4  # the report or an output could not be written (disk full)
SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}  # 128 + the signal number, as the shell reports
INTERRUPTED = SIGNAL_EXIT_CODES["SIGINT"]


def stopped_by_signal(code: int | None) -> bool:
    """The run ended because the user (or the system) stopped it: Ctrl-C, SIGTERM or SIGHUP."""
    return code in SIGNAL_EXIT_CODES.values()
