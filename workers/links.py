"""Credit-based links between worker pools, so every sender knows which frames each peer holds.

A consumer connects one DEALER to each producer's ROUTER and grants it credit (how many frames
it may send). The producer sends a frame only to a peer with credit and records it in that
peer's in-flight ledger; the consumer acks the frame once it has passed it on, which returns
the credit and clears the ledger entry. Memory stays bounded by the credit, and a dead peer's
frames are known by id (plain PUSH/PULL would lose them silently in its queues).
"""

from __future__ import annotations

import logging
import time

import zmq

from workers.transport import Message, make_socket, recv_message, send_message

CREDIT = "credit"
ACK = "ack"
FRAME = "frame"
END = "end"
DRAIN_TIMEOUT_S = 30.0  # after end-of-stream: how long to wait for the last acks


class Downstream:
    """The producer's side: a bound ROUTER handing frames to the consumers that granted credit."""

    def __init__(self, ctx: zmq.Context, endpoint: str, expected_peers: int, hwm: int = 1000):
        self.socket = make_socket(ctx, zmq.ROUTER, sndhwm=hwm, rcvhwm=hwm)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone peer raises, not vanishes
        self.socket.bind(endpoint)
        self.expected_peers = expected_peers
        self.credit: dict[bytes, int] = {}
        self.in_flight: dict[bytes, set[int]] = {}
        self.bytes_sent = 0
        self.frames_sent = 0
        self.ended = False
        self.gone: set[bytes] = set()  # consumers that disappeared mid-run
        self._drain_deadline = 0.0

    def handle(self) -> None:
        """Read one credit/ack message from a consumer."""
        msg = recv_message(self.socket, routed=True)
        peer = msg.envelope[0]
        self.credit.setdefault(peer, 0)
        held = self.in_flight.setdefault(peer, set())
        if msg.header["type"] in (CREDIT, ACK):
            self.credit[peer] += int(msg.header.get("n", 0))
            held.difference_update(msg.header.get("ids", ()))

    def has_credit(self) -> bool:
        return any(c > 0 for c in self.credit.values())

    def send(self, header: dict, arrays=()) -> bytes | None:
        """Send one frame to the peer with the most credit; returns that peer's identity, or
        None when the only peers with credit turned out to be gone (the frame was not sent)."""
        if not self.has_credit():
            raise RuntimeError("expected a consumer with credit before sending, got none")
        while self.has_credit():
            peer = max(self.credit, key=self.credit.__getitem__)
            try:
                nbytes = send_message(self.socket, {**header, "type": FRAME}, arrays, envelope=[peer])
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget(peer)
        else:
            return None
        self.credit[peer] -= 1
        self.in_flight[peer].add(header["id"])
        self.bytes_sent += nbytes
        self.frames_sent += 1
        return peer

    def _forget(self, peer: bytes) -> None:
        # A consumer that stopped or died: its unacked frames stay listed in held_by().
        self.credit.pop(peer, None)
        self.gone.add(peer)

    def all_peers_known(self) -> bool:
        return len(self.credit) + len(self.gone) >= self.expected_peers

    def send_end(self) -> None:
        for peer in list(self.credit):
            try:
                send_message(self.socket, {"type": END}, envelope=[peer])
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget(peer)
        self.ended = True

    def finish(self, log: logging.Logger) -> bool:
        """Call when nothing more will be sent: sends end-of-stream once every consumer is known,
        then True once all frames are acked (or, after DRAIN_TIMEOUT_S, with an error logged)."""
        if not self.ended and self.all_peers_known():
            self.send_end()
            self._drain_deadline = time.perf_counter() + DRAIN_TIMEOUT_S
        if not self.ended:
            return False
        if self.pending() == 0 or not self.credit:
            return True
        if time.perf_counter() > self._drain_deadline:
            log.error("no acks for %d frames after %.0f s: %s", self.pending(), DRAIN_TIMEOUT_S, self.held_by())
            return True
        return False

    def pending(self) -> int:
        return sum(len(ids) for ids in self.in_flight.values())

    def held_by(self) -> dict[str, list[int]]:
        """Frames sent but not yet acked, per consumer: what a dead consumer took with it."""
        return {peer.decode(): sorted(ids) for peer, ids in self.in_flight.items() if ids}

    def close(self) -> None:
        self.socket.close()


class Upstream:
    """The consumer's side: one DEALER per producer, granting credit and acking frames."""

    def __init__(self, ctx: zmq.Context, endpoints: list[str], identity: str, credit_per_producer: int,
                 hwm: int = 1000):
        self.sockets = []
        for endpoint in endpoints:
            socket = make_socket(ctx, zmq.DEALER, sndhwm=hwm, rcvhwm=hwm, identity=identity.encode())
            socket.connect(endpoint)
            self.sockets.append(socket)
        self.credit_per_producer = credit_per_producer
        self.origin: dict[int, int] = {}  # frame id -> index of the producer it came from
        self.ended = [False] * len(self.sockets)
        self.bytes_received = 0
        self.frames_received = 0

    def start(self) -> None:
        for socket in self.sockets:
            send_message(socket, {"type": CREDIT, "n": self.credit_per_producer})

    def receive(self, socket: zmq.Socket) -> Message | None:
        """A frame from ``socket``'s producer, or None for its end-of-stream."""
        index = self.sockets.index(socket)
        msg = recv_message(socket)
        if msg.header["type"] == END:
            self.ended[index] = True
            return None
        self.origin[msg.header["id"]] = index
        self.bytes_received += msg.nbytes
        self.frames_received += 1
        return msg

    def ack(self, frame_id: int) -> None:
        """The frame has been passed on: free its producer's ledger entry and return the credit."""
        index = self.origin.pop(frame_id)
        send_message(self.sockets[index], {"type": ACK, "ids": [frame_id], "n": 1})

    def all_ended(self) -> bool:
        return all(self.ended)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close()
