"""The runner's state while a run goes, and what it does on each event: a death or a hang (restart
or stop), an interrupt (drain, stop, kill), a deadline (duration, drain, stop, stall), progress.

Every deadline is measured on the watcher's loop clock (wire.loop_clock), so time the runner
itself was not running (SIGSTOP, Ctrl-Z, starved of CPU) re-arms them instead of ending the run.
"""

from __future__ import annotations

import logging
import signal
import time

from supervisor.console import Console
from supervisor.health import Health
from supervisor.processes import Launcher
from inputs.kinds import input_kind
from topology.stages import frame_roles, index_of, kind_of, role_of, sink_role, source_role
from supervisor.signals import Interrupts
from collector.journal import Resume
from settings.config import RunConfig
from sharedmem.in_hand import read_held
from wire.messages import Drain, PeerGone, Stop
from wire.transport import DropCounter, send_message

log = logging.getLogger("runner")

NOTICE_RESEND_S = 1.0  # PUB/SUB may drop a message to a late subscriber: repeat drain/stop
DRAIN_TIMEOUT_S = 5.0  # after Ctrl-C/SIGTERM: frames in flight get this long to finish
STOP_GIVE_UP_S = 15.0  # after a stop, wait this long for the collector's report, then end it all
STALL_TIMEOUT_S = 300.0  # no frame finished for this long while all processes live and answer


class Watch:
    """The runner's state while the run goes: its phase, why it is stopping, what it restarted."""

    def __init__(self, cfg: RunConfig, launcher: Launcher, health: Health, control_out, token: bytes,
                 interrupts: Interrupts, console: Console):
        self.cfg, self.launcher, self.health = cfg, launcher, health
        self.control_out, self.token = control_out, token
        self.interrupts, self.console = interrupts, console
        self.clock = health.clock  # one loop clock for heartbeats and deadlines: a pause re-arms all of them
        self.phase = "running"  # running -> draining -> stopping -> done
        self.phase_since = self.clock.now()
        self.reason: str | None = None
        self.aborted = False
        self.kill_all = False  # end every process at once instead of letting them report
        self.finished: dict | None = None
        self.restarts: dict[str, int] = {}
        self.collector_died = False
        self.last_progress: dict | None = None  # the collector's last counts, for a report without it
        self.deaths_holding: dict[tuple[str, int], int] = {}  # (reader name or stage, position or id) -> deaths
        # Frame stage after the source -> {id: why failed}; the source's readers fail a position instead.
        self.poisoned: dict[str, dict[int, str | None]] = {role: {} for role in frame_roles()[1:]}
        self.restart_log: list[dict] = []
        self.gone_notices: list[dict] = []  # every peer-gone notice broadcast: a restarted collector missed them
        self.exited: list[str] = []  # workers that exited by themselves (code 0)
        self.seen_interrupts = 0
        self.last_notice_s = 0.0
        self.last_done, self.last_change_s = -1, self.clock.now()
        self.first_frame_s: float | None = None
        self.duration_ended = False  # a --duration run: frames never read are not counted
        self.drops = DropCounter(log)  # messages the runner refused (bad token, schema, size)

    # -- notices to every process ------------------------------------------------------------------
    def broadcast(self, header: dict) -> None:
        send_message(self.control_out, header, token=self.token)

    def enter(self, phase: str, reason: str) -> None:
        if ["running", "draining", "stopping", "done"].index(phase) <= ["running", "draining", "stopping",
                                                                         "done"].index(self.phase):
            return
        self.phase, self.phase_since = phase, self.clock.now()
        self.reason = self.reason or reason
        self.last_notice_s = 0.0

    def repeat_notice(self) -> None:
        now = self.clock.now()
        if self.phase in ("draining", "stopping") and now - self.last_notice_s > NOTICE_RESEND_S:
            signal_name = self.interrupts.first()
            notice = Drain(self.reason, cancel=not self.duration_ended, signal=signal_name) \
                if self.phase == "draining" else Stop(self.reason, signal=signal_name)
            self.broadcast(notice.to_message())
            self.last_notice_s = now

    # -- deaths, hangs, signals ----------------------------------------------------------------------
    def on_exit(self, name: str, code: int) -> None:
        self.launcher.forget(name)
        self.health.forget(name)
        if code == 0:
            self.exited.append(name)
            return
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        self.on_death(name, f"{name} {how}", signal.Signals(-code).name if code < 0 else None, code)

    def on_stuck(self, name: str, why: str) -> None:
        self.launcher.kill(name)
        self.launcher.forget(name)
        self.health.forget(name)
        self.on_death(name, f"{why}: killed it", "SIGKILL", -signal.SIGKILL)

    def on_death(self, name: str, reason: str, signal_name: str | None, code: int) -> None:
        role = role_of(name)
        if role == sink_role() and self.can_restart_collector():
            self.restart_collector(name, reason, signal_name, code)
            return
        if role == sink_role():
            self.aborted = self.kill_all = True
            self.collector_died = True
            log.error("%s: the run cannot go on without its collector; the runner writes what it knows", reason)
            self.enter("done", reason)
            return
        poison = self.poison_frames(name, reason)
        can_restart = self.phase == "running" and self.restarts.get(role, 0) < self.cfg.max_restarts
        self.tell_gone(name, reason, signal_name, code, final=not can_restart, position=self.health.position(name),
                       poison=[list(p) for p in self.poisoned.get(role, {}).items()])
        if can_restart:
            self.count_restart(name, reason)
            self.start_worker(name, start_position=self.health.position(name),
                              poison=poison[0] if role == source_role() and poison else None)
            return
        if role == source_role() or not self.launcher.alive(role):
            log.error("%s: no %s worker can take its frames; stopping the run", reason, role)
            self.aborted = self.aborted or self.phase == "running"
            self.enter("stopping", reason)
        else:
            log.warning("%s: going on with the other %s workers", reason, role)

    def tell_gone(self, name: str, reason: str, signal_name: str | None, code: int, final: bool,
                  **extra) -> None:
        """The peer-gone notice to every process (its senders send again what it held), kept for
        a collector started later; and the line of the runner's restart log."""
        notice = PeerGone(name, self.launcher.incarnation(name), final, reason, signal=signal_name, exit_code=code,
                          t_s=time.perf_counter(), **extra).to_message()
        self.broadcast(notice)
        self.gone_notices.append(notice)
        self.restart_log.append({"name": name, "incarnation": notice["incarnation"], "reason": reason,
                                 "signal": signal_name, "exit_code": code, "restarted": not final})

    def count_restart(self, name: str, reason: str) -> None:
        role = role_of(name)
        self.restarts[role] = self.restarts.get(role, 0) + 1
        log.warning("%s: restarting it (%d of %d restarts for %s)", reason, self.restarts[role],
                    self.cfg.max_restarts, role)

    def can_restart_collector(self) -> bool:
        """Restarts left, the run not stopping, and no annotated video being written (a video file
        cut by its writer's death cannot be continued, and the frames it held keep their slots)."""
        plan = self.launcher.template.plan
        videos = self.cfg.save_every > 0 and any(input_kind(item.kind).video for item in plan.items)
        return self.phase in ("running", "draining") and not videos and \
            self.restarts.get(sink_role(), 0) < self.cfg.max_restarts

    def restart_collector(self, name: str, reason: str, signal_name: str | None, code: int) -> None:
        """A new collector goes on from what the dead one wrote durably (collector.journal);
        the postprocess workers send it their last results again, told by the notice."""
        self.tell_gone(name, reason, signal_name, code, final=False)
        self.count_restart(name, reason)
        self.start_worker(name, resume=Resume(tuple(self.gone_notices), tuple(self.exited)))

    def poison_frames(self, name: str, reason: str) -> list[tuple[int, str]]:
        """(position or frame id, reason) of what the dead worker held (its in-hand file) that a
        worker died holding once before: failed with the reason, not tried a third time. A
        preprocess worker's positions are its own share's, and the next incarnation fails that
        frame; an inference or postprocess frame may have killed any worker of the stage, and
        whichever worker it reaches next fails it (told by the peer-gone notice, or at start);
        one held at a first death is a suspect (None), which inference runs alone."""
        role = role_of(name)
        reader = role == source_role()
        owner = name if reader else role
        poison, held_now = [], read_held(self.launcher.template.run_tag, name)
        for held in held_now:
            deaths = self.deaths_holding[owner, held] = self.deaths_holding.get((owner, held), 0) + 1
            if deaths == 2:
                what = "reading it" if reader else "holding it"
                poison.append((held, f"{name} died twice {what} ({reason})"))
                log.warning("%s died twice holding the same frame (%s %d): it is failed, not tried again", name,
                            "position of its share" if reader else "frame id", held)
        if role in self.poisoned:
            marks = self.poisoned[role]
            marks.update({held: None for held in held_now if held not in marks})
            marks.update(poison)
        return poison

    def start_worker(self, name: str, start_position: int = 0, poison: tuple[int, str] | None = None,
                     resume: Resume | None = None) -> None:
        role = role_of(name)
        device, threads = "cpu", 1
        if kind_of(role).on_device:
            device, threads = self.cfg.devices[index_of(name) % len(self.cfg.devices)], self.cfg.infer_threads
        self.launcher.start(name, device=device, torch_threads=threads, start_position=start_position,
                            poison=poison or (-1, ""), poison_frames=tuple(self.poisoned.get(role, {}).items()),
                            resume=resume)
        self.health.expect(name, self.launcher.incarnation(name), start_position, pid=self.launcher.pid(name))

    def on_interrupt(self) -> None:
        count = self.interrupts.count
        if count == self.seen_interrupts:
            return
        self.seen_interrupts = count
        what = self.interrupts.last_said()
        if count == 1 and self.phase == "running":
            self.console.say(f"{what}: finishing the frames in flight (at most {DRAIN_TIMEOUT_S:.0f} s); "
                             "press Ctrl-C again to stop at once")
            self.enter("draining", f"interrupted by {what}")
        elif count == 2:
            self.console.say(f"{what} again: stopping now")
            self.enter("stopping", f"interrupted by {what}")
        elif count >= 3:
            self.console.say(f"{what} a third time: killing every process")
            self.kill_all = True
            self.enter("done", f"interrupted by {what}")

    def check_deadlines(self) -> None:
        now = self.clock.now()
        if (self.phase == "running" and self.cfg.duration and self.first_frame_s is not None
                and now - self.first_frame_s >= self.cfg.duration):
            self.duration_ended = True
            self.enter("draining", f"--duration {self.cfg.duration:g} s reached")
        elif self.phase == "draining" and now - self.phase_since > DRAIN_TIMEOUT_S:
            self.enter("stopping", self.reason or "drain timed out")
        elif self.phase == "stopping" and now - self.phase_since > STOP_GIVE_UP_S:
            log.error("no report %.0f s after the stop: ending every process", STOP_GIVE_UP_S)
            self.aborted = self.kill_all = True
            self.enter("done", self.reason or "stop timed out")
        elif self.phase == "running" and now - self.last_change_s > STALL_TIMEOUT_S:
            log.error("no frame finished for %.0f s: stopping the run", STALL_TIMEOUT_S)
            self.aborted = True
            self.enter("stopping", f"no frame finished for {STALL_TIMEOUT_S:.0f} s")

    def on_progress(self, header: dict) -> None:
        self.last_progress = header
        done = header["processed"] + header["failed"]
        if done and self.first_frame_s is None:
            self.first_frame_s = self.clock.now()
        if done != self.last_done:
            self.last_done, self.last_change_s = done, self.clock.now()
        self.console.progress(header["processed"], header["failed"])
