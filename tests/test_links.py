"""Credit-based links: a producer sends only within the credit granted, and knows which frame
ids each consumer holds until they are acked."""

import logging
import time

import numpy as np
import pytest
import zmq

from workers.links import Downstream, Upstream


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


def wait_for(predicate, step, timeout_s=5.0):
    deadline = time.perf_counter() + timeout_s
    while not predicate():
        assert time.perf_counter() < deadline, "timed out"
        step()


def pump(down: Downstream):
    if down.socket.poll(100):
        down.handle()


def receive(up: Upstream, index: int = 0):
    socket = up.sockets[index]
    assert socket.poll(2000), "no message"
    return up.receive(socket)


def test_credit_ledger_and_end_of_stream(ctx, tmp_path):
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = Downstream(ctx, endpoint, expected_peers=2)
    ups = [Upstream(ctx, [endpoint], f"c{i}", credit_per_producer=2) for i in range(2)]
    try:
        for up in ups:
            up.start()
        wait_for(down.all_peers_known, lambda: pump(down))
        wait_for(lambda: sum(down.credit.values()) == 4, lambda: pump(down))
        peers = [down.send({"id": i}, [np.full((2, 3), i, np.uint8)]) for i in range(4)]
        assert not down.has_credit()  # 2 consumers x 2 credits, all used
        with pytest.raises(RuntimeError):
            down.send({"id": 99})
        assert sorted(peers) == [b"c0", b"c0", b"c1", b"c1"]
        held = down.held_by()
        assert sorted(held["c0"] + held["c1"]) == [0, 1, 2, 3]
        got = receive(ups[0])
        assert got.header["id"] in held["c0"] and int(got.arrays[0][0, 0]) == got.header["id"]
        ups[0].ack(got.header["id"])
        wait_for(lambda: down.pending() == 3, lambda: pump(down))
        assert down.credit[b"c0"] == 1 and got.header["id"] not in down.held_by().get("c0", [])
        for up in ups:
            while up.sockets[0].poll(200):
                msg = up.receive(up.sockets[0])
                up.ack(msg.header["id"])
        log = logging.getLogger("test")
        wait_for(lambda: down.finish(log), lambda: pump(down))
        for up in ups:
            assert receive(up) is None and up.all_ended()
    finally:
        down.close()
        for up in ups:
            up.close()
