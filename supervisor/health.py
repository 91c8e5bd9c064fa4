"""Which processes are alive and answering: each beats a heartbeat from a thread; one that is
silent is judged with what the OS knows of it before it is handled as dead.

Silence is measured on the watcher's own loop clock (wire.loop_clock): time the runner itself
was not running (SIGSTOP, Ctrl-Z, starved of CPU) is not silence, so every deadline re-arms when
it resumes. A silent process the kernel has stopped, or one that neither runs nor waits to run
(deadlocked), is named at once; one that runs (its CPU clock advances, or a thread waits for a
core or the disk) is only late on a busy machine, and is given up to LOOP_STALL_S.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from supervisor.liveness import look
from wire.loop_clock import LoopClock

log = logging.getLogger("runner")

STARTUP_TIMEOUT_S = 120.0  # from process start to its first beat: imports, model load, a busy machine
LOOP_STALL_S = 300.0  # a main loop that has not turned for this long is stuck (longest sane forward)


@dataclass
class Beat:
    incarnation: int
    started_s: float  # on the loop clock
    pid: int = 0  # from the launcher: a beat's own pid field is not trusted for /proc
    last_s: float | None = None  # None until the first beat
    position: int = 0
    loop_age_s: float = 0.0
    ran: tuple[float, float] | None = None  # while silent: (when, CPU clock) it was last seen running

    def heard_s(self) -> float:
        return self.last_s if self.last_s is not None else self.started_s


class Health:
    def __init__(self, timeout_s: float, clock: LoopClock | None = None):
        self.timeout_s = timeout_s
        self.clock = clock or LoopClock()
        self.beats: dict[str, Beat] = {}
        self.late_but_running: set[str] = set()  # named once in the log, not on every look

    def expect(self, name: str, incarnation: int, start_position: int = 0, pid: int = 0) -> None:
        self.beats[name] = Beat(incarnation, self.clock.now(), pid, position=start_position)

    def forget(self, name: str) -> None:
        self.beats.pop(name, None)

    def beat(self, header: dict) -> bool:
        """Take a beat; False (nothing taken, its signal included) for a beat from an incarnation
        already replaced or from a name that is no process of the run."""
        beat = self.beats.get(header["name"])
        if beat is None or header["incarnation"] != beat.incarnation:
            return False
        beat.last_s, beat.ran = self.clock.now(), None
        beat.position, beat.loop_age_s = header["position"], header["loop_age_s"]
        return True

    def ready(self) -> bool:
        """Every expected process has beaten at least once: start-up is over."""
        return all(b.last_s is not None for b in self.beats.values())

    def position(self, name: str) -> int:
        beat = self.beats.get(name)
        return beat.position if beat else 0

    def stuck(self) -> list[tuple[str, str]]:
        """(name, why) for every process that is not answering and is not running either."""
        now = self.clock.now()
        found = []
        for name, beat in self.beats.items():
            why = self._judge(name, beat, now)
            if why:
                found.append((name, why))
        return found

    def _judge(self, name: str, beat: Beat, now: float) -> str | None:
        """Why ``name`` is hung, or None. From half its timeout of silence on, the OS is asked: a
        CPU clock that moves, or a thread waiting for a core or the disk, is a process running;
        one that has not run for half a timeout, at the end of a whole timeout of silence, is
        hung, and so is one the kernel has stopped."""
        if beat.loop_age_s > LOOP_STALL_S:
            return f"{name}'s main loop has not turned for {beat.loop_age_s:.0f} s"
        limit = self.timeout_s if beat.last_s is not None else STARTUP_TIMEOUT_S
        silent_s = now - beat.heard_s()
        if silent_s <= limit / 2:
            return None
        view = look(beat.pid)
        if not view.alive:
            return None  # it exited: the launcher reports how
        if beat.ran is None or view.cpu_s > beat.ran[1] or view.waiting_threads:
            beat.ran = (now, view.cpu_s)  # the first look of this silence counts as running
        if silent_s <= limit:
            return None
        if view.stopped:
            return self._silence(name, beat, silent_s)
        if now - beat.ran[0] >= limit / 2:
            return self._silence(name, beat, silent_s) + ", nor run"  # all threads asleep, CPU clock still
        if silent_s > LOOP_STALL_S:
            return f"{name} has run for {silent_s:.0f} s without answering"
        if name not in self.late_but_running:
            self.late_but_running.add(name)
            log.warning("%s has not answered for %.0f s but still runs (%s): the machine is busy; waiting for "
                        "it, not restarting it", name, silent_s, view.state)
        return None

    @staticmethod
    def _silence(name: str, beat: Beat, silent_s: float) -> str:
        if beat.last_s is None:
            return f"{name} did not start answering within {silent_s:.0f} s"
        return f"{name} has not answered for {silent_s:.0f} s"
