"""Credit-based links: a producer sends only within the credit granted, knows which frame ids
each consumer incarnation holds until they are acked, and sends a dead consumer's frames again."""

import logging
import time

import numpy as np
import pytest
import zmq

from wire.wiring import Wire
from wire.links import Downstream, Upstream, parse_identity
from wire.transport import DropCounter, make_socket, send_message

TOKEN = b"t" * 16
WIRE = Wire(TOKEN)
LOG = logging.getLogger("test")


def wait_for(predicate, step, timeout_s=5.0):
    deadline = time.perf_counter() + timeout_s
    while not predicate():
        assert time.perf_counter() < deadline, "timed out"
        step()


def pump(down: Downstream):
    released = []
    if down.socket.poll(100):
        released.extend(down.handle())
    return released


def receive(up: Upstream, index: int = 0):
    socket = up.sockets[index]
    assert socket.poll(2000), "no message"
    return up.receive(socket)


def producer(ctx, made, endpoint, consumers=("c-0", "c-1")):
    down = Downstream(ctx, endpoint, list(consumers), "p-0.0", WIRE, DropCounter(LOG))
    made.append(down)
    return down


def consumer(ctx, made, endpoint, identity, credit=2):
    up = Upstream(ctx, [endpoint], ["p-0"], identity, credit, WIRE, DropCounter(LOG))
    made.append(up)
    up.start()
    return up


def test_parse_identity():
    assert parse_identity(b"post-1.2") == ("post-1", 2)
    assert parse_identity(b"post-1") is None and parse_identity(b"\xff\x00") is None


def test_credit_ledger_and_end_of_stream(ctx, made, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint)
    ups = [consumer(ctx, made, endpoint, f"c-{i}.0") for i in range(2)]
    wait_for(lambda: down.all_peers_known() and sum(p.credit for p in down.peers.values()) == 4, lambda: pump(down))
    peers = [down.send({"id": i}, [np.full((2, 3), i, np.uint8)]) for i in range(4)]
    assert not down.has_credit()  # 2 consumers x 2 credits, all used
    with pytest.raises(RuntimeError):
        down.send({"id": 99})
    assert sorted(peers) == [b"c-0.0", b"c-0.0", b"c-1.0", b"c-1.0"]
    held = down.held_by()
    assert sorted(held["c-0.0"] + held["c-1.0"]) == [0, 1, 2, 3]
    got = receive(ups[0])
    assert got.header["id"] in held["c-0.0"] and int(got.arrays[0][0, 0]) == got.header["id"]
    assert got.header["src"] == "p-0.0"
    ups[0].ack(got.header["id"], release=True)
    released = []
    wait_for(lambda: down.pending() == 3, lambda: released.extend(pump(down)))
    assert released == [got.header["id"]]
    assert down.peers[b"c-0.0"].credit == 1 and got.header["id"] not in down.held_by().get("c-0.0", [])
    for up in ups:
        while up.sockets[0].poll(200):
            msg = up.receive(up.sockets[0])
            up.ack(msg.header["id"])
    wait_for(lambda: down.finish(LOG), lambda: pump(down))
    for up in ups:
        assert receive(up) is None and up.all_ended()


def test_a_dead_consumers_frames_go_to_its_next_incarnation(ctx, made, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint, consumers=("c-0",))
    first = consumer(ctx, made, endpoint, "c-0.0", credit=3)
    wait_for(lambda: down.has_credit(), lambda: pump(down))
    for i in range(3):
        down.send({"id": i})
    first.close()  # c-0.0 dies holding frames 0, 1, 2
    made.remove(first)
    second = consumer(ctx, made, endpoint, "c-0.1", credit=2)
    wait_for(lambda: b"c-0.1" in down.peers and down.has_credit(), lambda: pump(down))
    assert b"c-0.0" not in down.peers and [h["id"] for h, _ in down.queue] == [0, 1, 2]
    assert down.send_queued() == 2  # within the new incarnation's credit, oldest first
    got = [receive(second).header["id"] for _ in range(2)]
    assert got == [0, 1] and down.resent_by == {"c-0.0": 3}
    assert down.held_by() == {"c-0.1": [0, 1], "c-0.0": [2]}  # the one still waiting is the dead one's loss


def test_peer_gone_resends_to_another_consumer(ctx, made, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint)
    ups = [consumer(ctx, made, endpoint, f"c-{i}.0", credit=1) for i in range(2)]
    wait_for(lambda: sum(p.credit for p in down.peers.values()) == 2, lambda: pump(down))
    first_to = down.send({"id": 7})
    down.send({"id": 8})
    dead = 0 if first_to == b"c-0.0" else 1
    survivor = ups[1 - dead]
    msg = receive(survivor)
    survivor.ack(msg.header["id"])
    wait_for(lambda: down.has_credit(), lambda: pump(down))
    assert down.peer_gone(f"c-{dead}", 0, final=True) == 1
    assert down.send_queued() == 1
    assert receive(survivor).header["id"] == 7
    assert down.all_peers_known()  # the finished consumer is no longer waited for


def test_strangers_and_stale_acks_are_ignored(ctx, made, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint, consumers=("c-0",))
    stranger = make_socket(ctx, zmq.DEALER, linger_ms=0, identity=b"intruder.0")
    made.append(stranger)
    stranger.connect(endpoint)
    send_message(stranger, {"type": "credit", "n": 5}, token=TOKEN)
    no_token = make_socket(ctx, zmq.DEALER, linger_ms=0, identity=b"c-0.5")
    made.append(no_token)
    no_token.connect(endpoint)
    send_message(no_token, {"type": "credit", "n": 5}, token=b"x" * 16)
    for _ in range(2):
        pump(down)
    assert not down.has_credit() and not down.peers
    assert down.drops.counts == {"link:stranger": 1, "link:token": 1}
    up = consumer(ctx, made, endpoint, "c-0.0", credit=1)
    wait_for(down.has_credit, lambda: pump(down))
    down.send({"id": 1})
    msg = receive(up)
    send_message(up.sockets[0], {"type": "ack", "ids": [1], "n": 1, "to": "p-0.7", "release": []}, token=TOKEN)
    pump(down)
    assert down.pending() == 1  # an ack for another producer incarnation frees nothing
    up.ack(msg.header["id"])
    wait_for(lambda: down.pending() == 0, lambda: pump(down))


def test_the_wait_for_the_last_acks_leaves_out_time_the_process_was_stopped(ctx, made, tmp_path, monkeypatch):
    """A frame sent and never acked, the stage's input done: a whole run stopped with Ctrl-Z for
    longer than DRAIN_TIMEOUT_S does not give up at `fg`; the drain waits DRAIN_TIMEOUT_S of
    running time, and only then gives up."""
    import wire.links as links
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint, consumers=("c-0",))
    consumer(ctx, made, endpoint, "c-0.0", credit=1)
    wait_for(lambda: down.has_credit(), lambda: pump(down))
    down.send({"id": 0})
    now = [time.perf_counter()]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    assert not down.finish(LOG)
    now[0] += 3 * links.DRAIN_TIMEOUT_S  # stopped, then resumed
    assert not down.finish(LOG)
    for _ in range(int(links.DRAIN_TIMEOUT_S / 0.1) - 20):  # the loop turns every 0.1 s, never acked
        now[0] += 0.1
        assert not down.finish(LOG)
    gave_up = []
    for _ in range(40):  # 4 s more of running: past the timeout
        now[0] += 0.1
        gave_up.append(down.finish(LOG))
    assert gave_up[-1] and not gave_up[0]


def test_a_frame_taken_returns_its_credit_at_once_and_stays_held_until_its_ack(ctx, made, tmp_path):
    """The last stage holds finished frames for the collector's next batch: Taken gives the credit
    back (once, however often it is said), the frame stays on the ledger to be sent again if the
    consumer dies, and the later ack frees it without returning the credit twice."""
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint, consumers=("c-0",))
    up = consumer(ctx, made, endpoint, "c-0.0", credit=2)
    wait_for(lambda: down.has_credit() and down.peers[b"c-0.0"].credit == 2, lambda: pump(down))
    down.send({"id": 0})
    down.send({"id": 1})
    assert not down.has_credit()
    first, second = (receive(up).header["id"] for _ in range(2))
    assert up.taken(first) > 0  # the bytes its producer keeps until the ack
    up.taken(first)  # said twice: credit once
    wait_for(down.has_credit, lambda: pump(down))
    for _ in range(2):
        pump(down)
    peer = down.peers[b"c-0.0"]
    assert peer.credit == 1 and down.held_by() == {"c-0.0": [0, 1]}
    send_message(up.sockets[0], {"type": "taken", "ids": [second], "to": "p-0.7"}, token=TOKEN)
    pump(down)
    assert peer.credit == 1  # a Taken for another producer incarnation returns nothing
    up.ack_all([(first, False), (second, True)])  # one message for both
    released = []
    wait_for(lambda: down.pending() == 0, lambda: released.extend(pump(down)))
    assert peer.credit == 2 and released == [second] and not peer.credited  # first's credit came back once


def test_frames_taken_by_a_consumer_that_dies_go_again(ctx, made, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = producer(ctx, made, endpoint, consumers=("c-0",))
    first = consumer(ctx, made, endpoint, "c-0.0", credit=1)
    wait_for(down.has_credit, lambda: pump(down))
    down.send({"id": 5})
    first.taken(receive(first).header["id"])
    wait_for(down.has_credit, lambda: pump(down))
    down.send({"id": 6})  # the credit Taken gave back: c-0.0 now holds two frames on one credit
    assert down.held_by() == {"c-0.0": [5, 6]}
    first.close()  # it dies before its batch went
    made.remove(first)
    second = consumer(ctx, made, endpoint, "c-0.1", credit=2)
    wait_for(lambda: b"c-0.1" in down.peers and down.has_credit(), lambda: pump(down))
    assert down.send_queued() == 2 and [receive(second).header["id"] for _ in range(2)] == [5, 6]
