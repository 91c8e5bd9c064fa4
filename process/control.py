"""A stage's two channels to the runner: the control broadcast it listens to (drain, stop, a peer
gone, the runner itself gone) and the heartbeat it sends from a thread."""

from __future__ import annotations

import os
import threading
import time

import zmq

from topology.stages import role_of
from sharedmem.in_hand import poison_named
from process.lifecycle import ReceivedSignals
from wire.messages import DRAIN, PEER_GONE, STOP, Beat, validate
from wire.transport import DropCounter, ProtocolError, make_socket, recv_message, send_message
from wire.wiring import StageArgs

HEARTBEAT_INTERVAL_S = 1.0  # at most; a third of the heartbeat timeout where that is shorter (each beat costs
# the runner about 0.1 CPU-ms, and a run's processes beat together)
CONTROL_TYPES = frozenset({DRAIN, STOP, PEER_GONE})


class Control:
    """The runner's broadcast channel (SUB side): drain, stop and peer-gone notices; plus a
    check that the runner still lives."""

    def __init__(self, ctx: zmq.Context, args: StageArgs, drops: DropCounter):
        self.socket = make_socket(ctx, zmq.SUB, linger_ms=0, curve=args.wire.curve)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(args.endpoints["control"])
        self.token = args.wire.token
        self.runner_pid = args.runner_pid
        self.parent_pid = os.getppid()  # the runner, or the fork server it started
        self.drops = drops
        self.stop_reason: str | None = None
        self.drain_reason: str | None = None
        self.drain_cancels = True  # frames never read count as cancelled (not after --duration)
        self.gone: list[dict] = []  # peer-gone notices not yet applied by the stage
        self.signal: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM), if one did
        self.role = role_of(args.name)
        self.poison: dict[int, str | None] = dict(args.poison_frames)  # id -> why failed (None: a suspect)

    def check(self) -> bool:
        """Read pending notices without waiting; True if the stage should stop now."""
        while self.socket.poll(0):
            self.handle()
        return self.should_stop()

    def handle(self) -> None:
        try:
            header = validate(recv_message(self.socket, token=self.token).header, CONTROL_TYPES)
        except ProtocolError as exc:
            self.drops.note(exc, "control")
            return
        self.signal = self.signal or header.get("signal")
        if header["type"] == STOP:
            self.stop_reason = self.stop_reason or header["reason"]
        elif header["type"] == DRAIN:
            if self.drain_reason is None:
                self.drain_reason = header["reason"]
                self.drain_cancels = header.get("cancel", True) is not False
        else:
            self.gone.append(header)
            self.poison.update(poison_named(header, self.role))

    def take_gone(self) -> list[dict]:
        gone, self.gone = self.gone, []
        return gone

    def draining(self) -> bool:
        return self.drain_reason is not None or self.should_stop()

    def should_stop(self) -> bool:
        if self.stop_reason is None and not self._runner_alive():
            self.stop_reason = "the runner process is gone"
        return self.stop_reason is not None

    def _runner_alive(self) -> bool:
        if os.getppid() != self.parent_pid:
            return False
        try:
            os.kill(self.runner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def close(self) -> None:
        self.socket.close()


def heartbeat_interval_s(timeout_s: float) -> float:
    """How often a process beats: three beats within the timeout, so one late beat is no silence."""
    return min(HEARTBEAT_INTERVAL_S, timeout_s / 3)


class Heartbeat:
    """Beats from a thread every ``heartbeat_interval_s``, so the runner can tell a live process from
    a stopped or frozen one (a stopped process beats no more); each beat says how long ago the
    main loop last ran (a stuck loop), how far a preprocess worker got in its share (where a
    restart resumes), and any SIGTERM received."""

    def __init__(self, ctx: zmq.Context, args: StageArgs, signals: ReceivedSignals):
        self.last_tick = time.perf_counter()
        self.position = args.start_position
        self._ctx, self._args, self._signals = ctx, args, signals
        self.interval_s = heartbeat_interval_s(args.config.heartbeat_timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        self.last_tick = time.perf_counter()

    def _run(self) -> None:
        args = self._args
        socket = make_socket(self._ctx, zmq.PUSH, linger_ms=0, sndhwm=8, curve=args.wire.curve)
        socket.connect(args.endpoints["health"])
        try:
            while True:
                beat = Beat(args.name, args.incarnation, os.getpid(), time.perf_counter() - self.last_tick,
                            self.position, self._signals.first()).to_message()
                try:
                    send_message(socket, beat, token=args.wire.token, flags=zmq.NOBLOCK)
                except zmq.Again:  # the runner is not reading (it may be gone): beats are not queued
                    pass
                if self._stop.wait(self.interval_s):
                    break
        finally:
            socket.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
