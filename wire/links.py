"""Credit-based links between worker pools, so every sender knows which frames each peer holds
and can send them again if that peer dies.

A consumer connects one DEALER to each producer's ROUTER and grants it credit (how many frames
it may send). The producer sends a frame only to a peer with credit and keeps the frame (its
header and arrays: slot references, or small arrays) in that peer's in-flight ledger; the
consumer acks the frame once it has passed it on, which returns the credit and clears the
entry. Memory stays bounded by the credit, and a dead peer's frames are known by id and sent
again to another peer (plain PUSH/PULL would lose them silently in its queues). A consumer that
passes frames on in batches (the last stage, whose results go to the collector a message per
batch) says each frame is taken once it finished it: that returns the credit at once, so the
batch does not starve it, while the frame stays on the producer's ledger until the batch's ack;
the producer's memory is then bounded by the credit plus what that consumer holds back, which
it bounds in frames and bytes (workers/onward.py).

Peers are known by identity ``name.incarnation`` (``post-1.0``); a restarted worker is a new
incarnation, and a message from an older incarnation, or from a name that is not one of the
expected consumers, is dropped. Acks name the producer incarnation they are for (``to``), so a
restarted producer ignores the acks (and credit) meant for its predecessor.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import zmq

from topology.stages import process_names, source_role
from wire.wiring import Wire
from wire.loop_clock import LoopClock
from wire.messages import ACK, CREDIT, END, FRAME, TAKEN, Ack, Credit, End, FrameOnLink, Release, Taken, validate
from wire.transport import FRAME_LIMITS, DropCounter, Message, ProtocolError, make_socket, recv_message, send_message

DRAIN_TIMEOUT_S = 30.0  # after end-of-stream: how long to wait without any ack before giving up
LINK_TYPES = frozenset({CREDIT, ACK, TAKEN})
UPSTREAM_TYPES = frozenset({FRAME, END})


def parse_identity(identity: bytes) -> tuple[str, int] | None:
    """``b"post-1.2"`` -> ``("post-1", 2)``; None for anything else."""
    try:
        name, _, incarnation = identity.decode("ascii").rpartition(".")
    except UnicodeDecodeError:
        return None
    if not name or not incarnation.isdigit():
        return None
    return name, int(incarnation)


@dataclass
class Peer:
    name: str
    incarnation: int
    credit: int = 0
    in_flight: dict[int, tuple[dict, list]] = field(default_factory=dict)  # id -> (header, arrays)
    credited: set[int] = field(default_factory=set)  # frames in flight whose credit a Taken returned
    ended: bool = False  # end-of-stream sent to it


class Downstream:
    """The producer's side: a bound ROUTER handing frames to the consumers that granted credit."""

    def __init__(self, ctx: zmq.Context, endpoint: str, consumers: Sequence[str], identity: str, wire: Wire,
                 drops: DropCounter, hwm: int = 1000):
        self.socket = make_socket(ctx, zmq.ROUTER, sndhwm=hwm, rcvhwm=hwm, max_message_bytes=FRAME_LIMITS.header_bytes,
                                  curve=wire.curve, curve_server=True)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone peer raises, not vanishes
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # an identity already taken goes to the newest connection
        self.socket.bind(endpoint)
        self.identity = identity
        self.consumers = frozenset(consumers)
        self.token = wire.token
        self.drops = drops
        self.peers: dict[bytes, Peer] = {}
        self.latest: dict[str, int] = {}  # consumer name -> newest incarnation seen
        self.finished: set[str] = set()  # consumers gone for good: no incarnation will come
        self.queue: collections.deque[tuple[dict, list]] = collections.deque()  # frames to send again
        self.queued_from: dict[int, str] = {}  # frame id in the queue -> the retired consumer that held it
        self.bytes_sent = 0
        self.frames_sent = 0
        self.resent = 0
        self.resent_by: dict[str, int] = {}  # identity of a retired consumer -> frames sent again
        self.input_done = False  # the stage will submit nothing more
        self.clock = LoopClock()  # the drain's deadline: time this process was stopped (Ctrl-Z) is left out
        self._last_ack_s = self.clock.now()

    # -- receiving credit and acks ---------------------------------------------------------------
    def handle(self) -> list[int]:
        """Read one credit/ack message; returns the frame ids whose slots the consumer released."""
        try:
            msg = recv_message(self.socket, token=self.token, routed=True)
            header = validate(msg.header, LINK_TYPES)
        except ProtocolError as exc:
            self.drops.note(exc, "link")
            return []
        peer = self._peer(msg.envelope[0])
        if peer is None:
            return []
        if header["type"] == CREDIT:
            peer.credit += max(0, header["n"])
            return []
        if header["to"] != self.identity:
            return []  # an ack for frames my predecessor sent
        if header["type"] == TAKEN:
            taken = {i for i in header["ids"] if i in peer.in_flight} - peer.credited
            peer.credited |= taken
            peer.credit += len(taken)
            return []
        acked = [i for i in header["ids"] if peer.in_flight.pop(i, None) is not None]
        peer.credit += sum(1 for i in acked if i not in peer.credited)
        peer.credited.difference_update(acked)
        self._last_ack_s = self.clock.now()
        released = set(header.get("release") or ())
        return [i for i in acked if i in released]

    def _peer(self, identity: bytes) -> Peer | None:
        parsed = parse_identity(identity)
        if parsed is None or parsed[0] not in self.consumers:
            self.drops.note(ProtocolError("stranger", f"message from unexpected peer {identity[:40]!r}"), "link")
            return None
        name, incarnation = parsed
        if incarnation < self.latest.get(name, -1):
            return None  # an older incarnation, already retired
        if incarnation > self.latest.get(name, -1):
            self._retire(name, below=incarnation)
            self.latest[name] = incarnation
        peer = self.peers.get(identity)
        if peer is None:
            peer = self.peers[identity] = Peer(name, incarnation)
        return peer

    # -- a consumer that died or hung --------------------------------------------------------------
    def peer_gone(self, name: str, incarnation: int, final: bool) -> int:
        """Send again what ``name`` (that incarnation or older) held; returns how many frames."""
        if name not in self.consumers:
            return 0
        if final:
            self.finished.add(name)
        self.latest[name] = max(self.latest.get(name, -1), incarnation + 1)
        return self._retire(name, below=incarnation + 1)

    def _retire(self, name: str, below: int) -> int:
        count = 0
        for identity, peer in list(self.peers.items()):
            if peer.name == name and peer.incarnation < below:
                frames = [peer.in_flight[i] for i in sorted(peer.in_flight)]
                self.queue.extendleft(reversed(frames))
                count += len(frames)
                if frames:
                    key = f"{peer.name}.{peer.incarnation}"
                    self.resent_by[key] = self.resent_by.get(key, 0) + len(frames)
                    self.queued_from.update((header["id"], key) for header, _ in frames)
                del self.peers[identity]
        self.resent += count
        return count

    # -- sending -------------------------------------------------------------------------------------
    def has_credit(self) -> bool:
        return any(p.credit > 0 for p in self.peers.values())

    def all_peers_known(self) -> bool:
        live = {p.name for p in self.peers.values()}
        return all(name in live or name in self.finished for name in self.consumers)

    def send(self, header: dict, arrays: Sequence[np.ndarray] = ()) -> bytes | None:
        """Send one frame to the peer with the most credit; returns that peer's identity, or None
        when the only peers with credit turned out to be gone (the frame was not sent)."""
        if not self.has_credit():
            raise RuntimeError("expected a consumer with credit before sending, got none")
        while self.has_credit():
            identity = max(self.peers, key=lambda k: self.peers[k].credit)
            try:
                nbytes = send_message(self.socket, {**header, **FrameOnLink(header["id"], self.identity).to_message()}, arrays,
                                      token=self.token, envelope=[identity])
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget(identity)
        else:
            return None
        peer = self.peers[identity]
        peer.credit -= 1
        peer.in_flight[header["id"]] = (header, list(arrays))
        self.bytes_sent += nbytes
        self.frames_sent += 1
        return identity

    def send_queued(self) -> int:
        """Send frames waiting to go again, as far as credit allows; returns how many went."""
        sent = 0
        while self.queue and self.has_credit():
            header, arrays = self.queue[0]
            if self.send(header, arrays) is not None:
                self.queue.popleft()
                self.queued_from.pop(header["id"], None)
                sent += 1
        return sent

    def _forget(self, identity: bytes) -> None:
        # A consumer that stopped or died: its unacked frames wait for the runner's notice (or
        # its next incarnation) and then go again.
        peer = self.peers.get(identity)
        if peer is not None:
            peer.credit = 0

    # -- end of stream -----------------------------------------------------------------------------
    def finish(self, log: logging.Logger) -> bool:
        """Call in every loop once the stage will submit nothing more: sends the frames waiting to
        go again, then end-of-stream to every consumer; True once everything sent is acked (or
        when no ack came for DRAIN_TIMEOUT_S, with an error logged)."""
        if not self.input_done:
            self._last_ack_s = self.clock.now()  # the wait for the last acks starts now
        self.input_done = True
        self.send_queued()
        if self.queue or not self.all_peers_known():
            return self._gave_up(log)
        for identity, peer in self.peers.items():
            if not peer.ended:
                try:
                    send_message(self.socket, End().to_message(), token=self.token, envelope=[identity])
                    peer.ended = True
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
        if self.pending() == 0:
            return True
        return self._gave_up(log)

    def _gave_up(self, log: logging.Logger) -> bool:
        if self.clock.now() - self._last_ack_s > DRAIN_TIMEOUT_S:
            log.error("no ack for %.0f s with %d frames unacked and %d waiting to go again: %s",
                      DRAIN_TIMEOUT_S, self.pending(), len(self.queue), self.held_by())
            return True
        return False

    def pending(self) -> int:
        return sum(len(p.in_flight) for p in self.peers.values())

    def held_by(self) -> dict[str, list[int]]:
        """Frames sent but not yet acked, per consumer incarnation; a frame waiting to go again
        under the retired consumer that held it (its loss is that consumer's death, not this
        sender's), or under this sender when that is unknown."""
        held: dict[str, list[int]] = {}
        for peer in self.peers.values():
            if peer.in_flight:
                held.setdefault(f"{peer.name}.{peer.incarnation}", []).extend(peer.in_flight)
        for header, _ in self.queue:
            held.setdefault(self.queued_from.get(header["id"], self.identity), []).append(header["id"])
        return {identity: sorted(ids) for identity, ids in held.items()}

    def close(self) -> None:
        self.socket.close()


class Upstream:
    """The consumer's side: one DEALER per producer, granting credit and acking frames."""

    def __init__(self, ctx: zmq.Context, endpoints: Sequence[str], producers: Sequence[str], identity: str,
                 credit_per_producer: int, wire: Wire, drops: DropCounter, hwm: int = 1000):
        if len(endpoints) != len(producers):
            raise ValueError(f"expected one producer name per endpoint, got {len(producers)} for {len(endpoints)}")
        self.sockets = []
        for endpoint in endpoints:
            socket = make_socket(ctx, zmq.DEALER, sndhwm=hwm, rcvhwm=hwm, identity=identity.encode(),
                                 curve=wire.curve)
            socket.connect(endpoint)
            self.sockets.append(socket)
        self.producers = list(producers)
        self.token = wire.token
        self.drops = drops
        self.credit_per_producer = credit_per_producer
        # frame id -> (producer index, producer identity, bytes of its message: what the producer keeps until the ack)
        self.origin: dict[int, tuple[int, str, int]] = {}
        self.ended = [False] * len(self.sockets)
        self.bytes_received = 0
        self.frames_received = 0

    def start(self) -> None:
        for socket in self.sockets:
            send_message(socket, Credit(self.credit_per_producer).to_message(), token=self.token)

    def receive(self, socket: zmq.Socket) -> Message | None:
        """A frame from ``socket``'s producer; None for its end-of-stream or a bad message."""
        index = self.sockets.index(socket)
        try:
            msg = recv_message(socket, token=self.token)
            validate(msg.header, UPSTREAM_TYPES)
        except ProtocolError as exc:
            self.drops.note(exc, "link")
            return None
        if msg.header["type"] == END:
            self.ended[index] = True
            return None
        self.origin[msg.header["id"]] = (index, msg.header["src"], msg.nbytes)
        self.bytes_received += msg.nbytes
        self.frames_received += 1
        return msg

    def ack(self, frame_id: int, release: bool = False) -> None:
        """The frame has been passed on: free its producer's ledger entry, return the credit, and
        with ``release`` give its shared-memory slot back too (this stage was its last reader)."""
        self.ack_all([(frame_id, release)])

    def ack_all(self, frames: Sequence[tuple[int, bool]]) -> None:
        """:meth:`ack` for each (frame id, release), one message per producer."""
        by_producer: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
        for frame_id, release in frames:
            origin = self.origin.pop(frame_id, None)
            if origin is not None:
                ids, released = by_producer.setdefault(origin[:2], ([], []))
                ids.append(frame_id)
                if release:
                    released.append(frame_id)
        for (index, source), (ids, released) in by_producer.items():
            self._to_producer(index, Ack(ids, len(ids), source, released).to_message())

    def taken(self, frame_id: int) -> int:
        """The frame is finished and held for a batched send: its credit goes back now, its ack
        later (:class:`~wire.messages.Taken`). Returns the bytes its producer keeps meanwhile
        beyond what the credit bounds (its message's: pixels that travelled inline count)."""
        origin = self.origin.get(frame_id)
        if origin is None:
            return 0
        index, source, nbytes = origin
        self._to_producer(index, Taken([frame_id], source).to_message())
        return nbytes

    def _to_producer(self, index: int, header: dict) -> None:
        try:
            send_message(self.sockets[index], header, token=self.token, flags=zmq.NOBLOCK)
        except zmq.Again:  # that producer is gone and its queue is full: the message has no reader
            pass

    def producer_gone(self, name: str, final: bool) -> None:
        """A producer died: its next incarnation needs credit and will send end-of-stream again;
        one gone for good has ended."""
        if name not in self.producers:
            return
        index = self.producers.index(name)
        self.ended[index] = final
        if not final:
            send_message(self.sockets[index], Credit(self.credit_per_producer).to_message(), token=self.token)

    def all_ended(self) -> bool:
        return all(self.ended)

    def held(self) -> list[int]:
        return sorted(self.origin)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close()


class SlotReturns:
    """Gives shared-memory slots back to the preprocess worker that lent them."""

    def __init__(self, ctx: zmq.Context, args):
        self.token = args.wire.token
        self.sockets = {}
        owners = process_names(args.endpoints.counts, source_role())
        for owner, endpoint in zip(owners, args.endpoints.of_pool(source_role(), "-returns")):
            socket = make_socket(ctx, zmq.PUSH, linger_ms=0, sndhwm=1000, curve=args.wire.curve)
            socket.connect(endpoint)
            self.sockets[owner] = socket

    def release(self, frame_id: int, pre, px) -> None:
        """Give back the slot of frame ``frame_id`` (its ``px`` references, lent by the ``pre``
        worker); nothing for a frame whose pixels travelled inline."""
        ref = (px.get("orig") or px.get("lb")) if isinstance(px, dict) else None
        socket = self.sockets.get(pre) if isinstance(pre, str) else None
        if not isinstance(ref, dict) or not isinstance(ref.get("seg"), str) or "slot" not in ref or socket is None:
            return  # inline pixels, or nothing that names a slot: the owner checks what a release names
        try:
            send_message(socket, Release(ref["seg"], [[ref["slot"], frame_id]]).to_message(),
                         token=self.token, flags=zmq.NOBLOCK)
        except zmq.Again:  # that worker is gone: its ring went with it
            pass

    def close(self) -> None:
        for socket in self.sockets.values():
            socket.close()
