"""Where a frame stage after inference sends what it finished: on to the next stage's pool over a
credit link, or, from the last frame stage, to the collector as a result. Which of the two follows
from the stage table, so a stage registered after postprocess takes postprocess's results and
hands them on without postprocess knowing it is there."""

from __future__ import annotations

import collections
import time

from process.stage_loop import Stage, StageProcess
from topology.stages import consumers_of, next_role, role_of, sink_role
from wire.links import Downstream, Upstream
from wire.messages import Results, done_item
from wire.transport import ProtocolError
from wire.transport import send_message

RESEND_WINDOW = 256  # frames kept after sending: those a collector that died had not written are among them
RESULTS_BATCH = 64  # frames a Results message holds at most
RESULTS_HOLD_S = 0.25  # the longest a finished frame waits for the collector's next message: each message
# costs the collector about 0.2 CPU-ms (its wake-ups), a frame in one about 0.03 (bench_overhead.py); the
# collector writes records this often too, and the latency figures are stamped before the hold
SLOT_HOLD_S = 0.01  # the same for a frame whose pixels go with it (a kept video frame): it holds a slot of a small ring
RESULTS_HOLD_BYTES = 8 << 20  # the batch goes sooner once its frames' messages, which their producers keep until
# the ack, add up to this (originals that travel inline, on tcp or without room in /dev/shm: ~6 MB at 1080p)


class SentResults:
    """The last messages sent to the collector, at least RESEND_WINDOW frames' worth. When it
    dies, those it had not yet written die with it (in its queues, or its memory); they go again
    to its next incarnation, which counts each frame once (collector.journal). A frame sent
    before the window is written, or, if it was lost too, accounted as lost at the end."""

    def __init__(self, process: StageProcess):
        self.results_out, self.token = process.to_collector, process.args.wire.token
        self.recent: collections.deque[tuple[dict, int]] = collections.deque()  # (message, frames in it)
        self.frames_kept = 0
        self.resent_by: dict[str, int] = {}  # identity of the dead collector -> frames sent again

    def send(self, header: dict, frames: int = 1) -> int:
        self.recent.append((header, frames))
        self.frames_kept += frames
        while self.frames_kept - self.recent[0][1] >= RESEND_WINDOW:
            self.frames_kept -= self.recent.popleft()[1]
        return send_message(self.results_out, header, token=self.token)

    def collector_gone(self, notice: dict) -> None:
        if notice["name"] != sink_role():
            return
        for header, _ in self.recent:
            send_message(self.results_out, header, token=self.token)  # queued until the new collector binds
        key = f"collector.{notice['incarnation']}"
        self.resent_by[key] = self.resent_by.get(key, 0) + self.frames_kept




class Onward:
    """A finished frame goes on: the last stage gathers finished frames into one Results message
    for the collector, sent once RESULTS_BATCH are in, the oldest has waited RESULTS_HOLD_S, or
    what their producers keep for them reaches RESULTS_HOLD_BYTES (each frame's credit goes back
    as it is finished, so the wait holds up nothing upstream); a stage with another after it
    queues each for the next pool's credit. Either acks a frame
    upstream only once it is sent, so a frame is always held by someone who can send it again.
    ``release`` in an ack gives the frame's slot back through its sender (inference's acks to
    preprocess)."""

    def __init__(self, process: StageProcess, frames_in: Upstream):
        args = process.args
        self.frames_in, self.log, self.name = frames_in, process.log, args.name
        self.collector = SentResults(process)
        self.link: Downstream | None = None
        role = role_of(args.name)
        if next_role(role) is not None:
            self.link = Downstream(process.ctx, args.endpoints[args.name], consumers_of(args.endpoints.counts, role),
                                   args.identity, args.wire, process.drops)
            process.listen(self.link.socket, lambda socket: self.link.handle())
        self.outbox: collections.deque[tuple[dict, list, bool]] = collections.deque()
        self.pending: list[dict] = []  # Done items for the collector's next Results message
        self.pending_acks: list[tuple[int, bool]] = []
        self.pending_due = 0.0  # perf_counter time when the pending batch must go
        self.pending_bytes = 0  # what the producers keep for the pending frames (their messages)
        self._bytes_to_collector = self.messages_out = 0

    @property
    def link_label(self) -> str:
        """The link the report's bytes per frame are counted on: ``post->collector``."""
        role = role_of(self.name)
        return f"{role}->{next_role(role) or sink_role()}"

    @property
    def bytes_out(self) -> int:
        return self._bytes_to_collector + (self.link.bytes_sent if self.link is not None else 0)

    def ready(self) -> bool:
        """Every consumer is up (the collector's side needs none to be)."""
        return self.link is None or self.link.all_peers_known()

    def put(self, header: dict, arrays: list | tuple = (), release: bool = False) -> None:
        """A finished frame (a result): into the collector's next batch, or queued for the next stage."""
        if self.link is None:
            due = time.perf_counter() + (SLOT_HOLD_S if "px" in header else RESULTS_HOLD_S)
            self.pending_due = min(self.pending_due, due) if self.pending else due
            self.pending.append(done_item(header))
            self.pending_acks.append((header["id"], release))
            self.pending_bytes += self.frames_in.taken(header["id"])
            # the batch goes from step(), not here: a send that fails must not fail a frame already in it
        else:
            self.outbox.append((header, list(arrays), release))

    def flush(self) -> None:
        """The collector's batch goes now; its frames are acked upstream."""
        if not self.pending:
            return
        for start in range(0, len(self.pending), RESULTS_BATCH):
            items = self.pending[start:start + RESULTS_BATCH]
            self._bytes_to_collector += self.collector.send(Results(items).to_message(), frames=len(items))
            self.messages_out += 1
        self.frames_in.ack_all(self.pending_acks)
        self.pending, self.pending_acks, self.pending_bytes = [], [], 0

    def flush_due(self) -> None:
        """The collector's batch goes once it is full, holds RESULTS_HOLD_BYTES, or is due."""
        if self.pending and (len(self.pending) >= RESULTS_BATCH or self.pending_bytes >= RESULTS_HOLD_BYTES
                             or time.perf_counter() >= self.pending_due):
            self.flush()

    def failed(self, failure: dict, release: bool = False) -> None:
        """A FAILED message: always to the collector (no stage after this one can use the frame)."""
        self.collector.send(failure)
        self.frames_in.ack(failure["id"], release=release)

    def step(self) -> bool:
        """Send what has credit (the collector's batch: what is due); True if anything went."""
        if self.link is None:
            self.flush_due()
            return False
        sent = self.link.send_queued() > 0
        while self.outbox and self.link.has_credit():
            header, arrays, release = self.outbox[0]
            if self.link.send(header, arrays) is None:
                continue  # that consumer is gone; try the others
            self.outbox.popleft()
            self.frames_in.ack(header["id"], release=release)
            self.messages_out += 1
            sent = True
        return sent

    def peer_gone(self, notice: dict) -> None:
        self.collector.collector_gone(notice)
        if self.link is not None:
            self.link.peer_gone(notice["name"], notice["incarnation"], notice["final"])

    def blocked(self) -> bool:
        return bool(self.outbox)

    def poll_timeout_ms(self, otherwise: float) -> float:
        """While a batch for the collector is pending, no longer than until it is due."""
        if not self.pending:
            return otherwise
        due_ms = 1e3 * (self.pending_due - time.perf_counter())
        return max(0.0, min(otherwise, due_ms + 1))  # +1: wake just after it is due, not just before

    def finished(self) -> bool:
        """Everything queued went and was taken (the collector's batch goes at once)."""
        self.flush()
        return self.link is None or (not self.outbox and self.link.finish(self.log))

    def held(self) -> dict:
        """The stats fields that say which frames this stage still held, or its consumers did."""
        return {"held": self.frames_in.held(), "held_by": self.link.held_by() if self.link else {},
                "resent": {**self.collector.resent_by, **(self.link.resent_by if self.link else {})}}

    def close(self) -> None:
        if self.link is not None:
            self.link.close()


class FrameStage(Stage):
    """A stage that takes frames from the stage before it, over a credit link granting
    ``credit`` frames to each producer, and sends what it finished on (:class:`Onward`); its
    ``receive(socket)`` takes one frame."""

    def __init__(self, process: StageProcess, credit: int):
        args = process.args
        self.process, self.args = process, args
        producers, urls = args.endpoints.producers(role_of(args.name))
        self.frames_in = process.own(Upstream(process.ctx, urls, producers, args.identity, credit, args.wire,
                                              process.drops))
        for socket in self.frames_in.sockets:
            process.listen(socket, self.receive)
        self.onward = process.own(Onward(process, self.frames_in))

    def receive(self, socket) -> None:
        raise NotImplementedError

    def take(self, socket, parse):
        """(message, ``parse(header)``) of the next frame on ``socket``; None for an end of stream,
        or a header ``parse`` refuses (ProtocolError: counted as dropped and acked, so its
        producer's credit comes back)."""
        msg = self.frames_in.receive(socket)
        if msg is None:
            return None
        try:
            return msg, parse(msg.header)
        except ProtocolError as exc:
            self.process.drops.note(exc, "frames")
            self.frames_in.ack(msg.header["id"])
            return None

    def keep_going(self, control) -> bool:
        return not control.check() and not (self.frames_in.all_ended() and self.onward.finished())

    def peer_gone(self, notice: dict) -> None:
        self.frames_in.producer_gone(notice["name"], notice["final"])
        self.onward.peer_gone(notice)

    def step(self) -> bool:
        return self.onward.step()

    def blocked_on_output(self) -> bool:
        return self.onward.blocked()

    def poll_timeout_ms(self) -> float:
        return self.onward.poll_timeout_ms(super().poll_timeout_ms())

    def idle(self) -> None:
        self.onward.flush_due()
