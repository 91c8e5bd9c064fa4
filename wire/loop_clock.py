"""A clock of the time a watching loop was itself running, for its deadlines.

A loop that judges others by their silence ("no heartbeat for 5 s") must not count the time it
was not running itself: stopped with SIGSTOP or Ctrl-Z, starved of CPU, swapped out. Between two
readings of this clock at most ``gap_s`` counts; the rest of a longer gap is left out, so every
deadline measured on it is re-armed when the loop resumes. A loop that only ever turns slowly
(a very busy machine) still advances ``gap_s`` per turn: its deadlines come later, never never.
"""

from __future__ import annotations

import time

GAP_S = 0.5  # a loop that turns every 0.375 s or more often and has not turned for this long was not running; under the
# smallest heartbeat timeout (1 s), so a pause alone never makes a process overdue


class LoopClock:
    def __init__(self, gap_s: float = GAP_S):
        self.gap_s = gap_s
        self._last = time.perf_counter()
        self.left_out_s = 0.0  # all the time left out so far
        self._new_gaps: list[float] = []  # gaps not yet taken by take_gaps()

    def now(self) -> float:
        """Seconds on perf_counter's scale, less the time the loop was not running."""
        t = time.perf_counter()
        delta = t - self._last
        self._last = t
        if delta > self.gap_s:
            self.left_out_s += delta - self.gap_s
            self._new_gaps.append(delta)
        return t - self.left_out_s

    def take_gaps(self) -> list[float]:
        """The long gaps (seconds) seen since the last call: for one log line each."""
        gaps, self._new_gaps = self._new_gaps, []
        return gaps
