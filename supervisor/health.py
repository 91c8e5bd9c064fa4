"""Which processes are alive and answering: each beats a heartbeat from a thread; one that
stops beating (stopped, frozen, swapped to death) or whose main loop stops turning is named and
handled as dead."""

from __future__ import annotations

import time
from dataclasses import dataclass

STARTUP_TIMEOUT_S = 120.0  # from process start to its first beat: imports, model load, a busy machine
LOOP_STALL_S = 300.0  # a main loop that has not turned for this long is stuck (longest sane forward)


@dataclass
class Beat:
    incarnation: int
    started_s: float
    last_s: float | None = None  # None until the first beat
    pid: int = 0
    position: int = 0
    loop_age_s: float = 0.0


class Health:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.beats: dict[str, Beat] = {}
        self.signals: list[tuple[str, str]] = []  # (process, signal name) passed on by workers

    def expect(self, name: str, incarnation: int, start_position: int = 0) -> None:
        self.beats[name] = Beat(incarnation, time.perf_counter(), position=start_position)

    def forget(self, name: str) -> None:
        self.beats.pop(name, None)

    def beat(self, header: dict) -> bool:
        """Take a beat; False (nothing taken, its signal included) for a beat from an incarnation
        already replaced or from a name that is no process of the run."""
        beat = self.beats.get(header["name"])
        if beat is None or header["incarnation"] != beat.incarnation:
            return False
        beat.last_s = time.perf_counter()
        beat.pid, beat.position, beat.loop_age_s = header["pid"], header["position"], header["loop_age_s"]
        if header.get("signal") and (header["name"], header["signal"]) not in self.signals:
            self.signals.append((header["name"], header["signal"]))
        return True

    def ready(self) -> bool:
        """Every expected process has beaten at least once: start-up is over."""
        return all(b.last_s is not None for b in self.beats.values())

    def position(self, name: str) -> int:
        beat = self.beats.get(name)
        return beat.position if beat else 0

    def stuck(self) -> list[tuple[str, str]]:
        """(name, why) for every process that is not answering."""
        now = time.perf_counter()
        found = []
        for name, beat in self.beats.items():
            if beat.last_s is None:
                if now - beat.started_s > STARTUP_TIMEOUT_S:
                    found.append((name, f"{name} did not start answering within {STARTUP_TIMEOUT_S:.0f} s"))
            elif now - beat.last_s > self.timeout_s:
                found.append((name, f"{name} has not answered for {now - beat.last_s:.0f} s"))
            elif beat.loop_age_s > LOOP_STALL_S:
                found.append((name, f"{name}'s main loop has not turned for {beat.loop_age_s:.0f} s"))
        return found
