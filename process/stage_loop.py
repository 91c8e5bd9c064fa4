"""The skeleton every stage process runs, the collector's included: set-up (title, signals,
threads, logging), the runner's control channel and the heartbeat, the poll loop, and the
closing; each stage plugs in only its own step (:class:`Stage`).

One pass of the loop: beat; apply the peer-gone notices; let the stage do what needs no new
input (send what has credit, run a batch that is due: ``step``); end when the stage is done;
else wait on its sockets (the time spent waiting is the stage's wait or blocked time) and hand
each socket that has something to its handler."""

from __future__ import annotations

import zmq

from process.clock import Clock, poll, worker_stats
from process.control import Control, Heartbeat
from process.lifecycle import enter_process, set_thread_counts, setup_logging
from topology.stages import sink_role
from wire.transport import DropCounter, make_socket, send_message
from wire.wiring import StageArgs

POLL_TIMEOUT_MS = 100


class StageProcess:
    """What a stage process has around its own work: its context, control channel, heartbeat,
    clock and poller, and the push socket to the collector (for failures and its summary)."""

    def __init__(self, args: StageArgs, use_torch: bool):
        self.args = args
        self.signals = enter_process(args)
        self.threads = set_thread_counts(args.torch_threads, args.opencv_threads, use_torch=use_torch)
        self.log = setup_logging(args.name, args.log_path, args.config.log_level)
        self.drops = DropCounter(self.log)
        self.ctx = zmq.Context()
        self.control = Control(self.ctx, args, self.drops)
        self.heartbeat: Heartbeat | None = None  # beats once the stage is set up (a model may load for long)
        self.clock = Clock()
        self.poller = zmq.Poller()
        self.poller.register(self.control.socket, zmq.POLLIN)  # handled last, after the stage's sockets
        self.handlers: dict[zmq.Socket, object] = {}
        self._collector: zmq.Socket | None = None
        self._owned: list = []  # what the stage opened, closed last first when the process ends

    def own(self, closable):
        """``closable`` (anything with ``close()``) is closed when the process ends, in the
        reverse order of owning; returns it."""
        self._owned.append(closable)
        return closable

    def listen(self, socket: zmq.Socket, handle) -> None:
        """Poll ``socket``; ``handle(socket)`` when it has something (in the order listened)."""
        self.poller.register(socket, zmq.POLLIN)
        self.handlers[socket] = handle

    @property
    def to_collector(self) -> zmq.Socket:
        """The PUSH socket to the collector (made on first use: the collector has none)."""
        if self._collector is None:
            self._collector = make_socket(self.ctx, zmq.PUSH, curve=self.args.wire.curve)
            self._collector.connect(self.args.endpoints[sink_role()])
        return self._collector

    def tell_collector(self, header: dict) -> int:
        return send_message(self.to_collector, header, token=self.args.wire.token)

    def summary(self, role: str, frames: int, **extra) -> dict:
        """This process's STATS message: its clocks, threads and drops, and the stage's own fields."""
        return worker_stats(self.args, role, self.threads, self.clock, frames, self.drops, **extra)

    def start_heartbeat(self) -> None:
        """The runner hears of this process from now on: a set-up longer than the heartbeat
        timeout (a model loading) is not taken for a hang, and a Ctrl-C before every process
        beats is a start-up interrupted (nothing run, no run folder)."""
        self.heartbeat = Heartbeat(self.ctx, self.args, self.signals)

    def close(self) -> None:
        for closable in reversed(self._owned):
            closable.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self._collector is not None:
            self._collector.close()
        self.control.close()
        self.ctx.term()


class Stage:
    """A stage's own part of the loop; every method has the do-nothing default."""

    def keep_going(self, control: Control) -> bool:
        """Whether to go round again: until the runner says stop (the collector waits for the
        workers' summaries instead)."""
        return not control.check()

    def peer_gone(self, notice: dict) -> None:
        """A process died or hung (the runner's notice): send again what it held."""

    def step(self) -> bool:
        """Work that needs no new input; True: go round again without waiting."""
        return False

    def done(self) -> bool:
        """Nothing more will come and everything sent is taken: leave the loop."""
        return False

    def poll_timeout_ms(self) -> float:
        return POLL_TIMEOUT_MS

    def blocked_on_output(self) -> bool:
        """Whether a wait now is waiting on the consumers (blocked), not on input."""
        return False

    def idle(self) -> None:
        """A wait ended with nothing for the stage's sockets: what waits for a lull goes now."""

    def finish(self) -> None:
        """After the loop, unless it raised: the summary to the collector."""


def run_loop(process: StageProcess, stage: Stage) -> None:
    control = process.control
    try:
        process.start_heartbeat()
        while stage.keep_going(control):
            process.heartbeat.tick()
            for notice in control.take_gone():
                stage.peer_gone(notice)
            if stage.step():
                continue
            if stage.done():
                break
            events = poll(process.poller, stage.poll_timeout_ms(), process.clock, stage.blocked_on_output())
            handled = False
            for socket, handle in process.handlers.items():
                if socket in events:
                    handle(socket)
                    handled = True
            if not handled:
                stage.idle()
            if control.socket in events:
                control.handle()
        if control.stop_reason or control.drain_reason:
            process.log.info("stopping: %s", control.stop_reason or control.drain_reason)
        stage.finish()
    finally:
        process.close()
