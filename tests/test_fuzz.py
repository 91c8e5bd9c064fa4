"""Random and mutated messages: decoding and every handler behind it refuse what is bad with
ProtocolError or SlotError (counted and dropped by the receiver), never another exception that
would take a process down (a live run under such messages: test_fuzz_live.py).

Seeds are fixed, so a failure reproduces; set FUZZ_ROUNDS and FUZZ_SEED for a longer or another search."""

from __future__ import annotations

import os
import random
import time

import msgpack
import numpy as np
import pytest
import zmq

from supervisor.health import Health
from wire.wiring import Endpoints, Wire
from wire.links import Downstream, Upstream
from wire.frame_header import FrameHeader
from wire.messages import (ACK, CREDIT, END, FAILED, FRAME, HEARTBEAT, RELEASE, RESULT,
                              validate)
from sharedmem.slots import SlotError, SlotRing, SlotViews, segment_name
from wire.transport import DropCounter, ProtocolError, make_socket, recv_message, send_message

from tests.fuzzing import (TOKEN, LOG, FUZZ_ROUNDS, FUZZ_SEED, ALL_TYPES, SMALL_LIMITS, random_value, good_headers, mutate_header, mutate_value, mutate_bytes, pack, fuzz_message, socket_pair)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_and_mutated_messages_raise_only_protocol_errors(ctx, made, seed):
    """Through recv_message, validate and a stage's frame check: every bad message is a
    ProtocolError with a kind; none is any other exception; the good ones still decode."""
    rng = random.Random(FUZZ_SEED + seed)
    sender, receiver = socket_pair(ctx, made)
    templates = good_headers()
    kinds: dict[str, int] = {}
    passed = 0
    for _ in range(FUZZ_ROUNDS):
        token = TOKEN if rng.random() < 0.95 else mutate_bytes(rng, TOKEN)
        sender.send_multipart([token, *fuzz_message(rng, templates)])
        assert receiver.poll(2000)
        try:
            message = recv_message(receiver, token=TOKEN, limits=SMALL_LIMITS)
            header = validate(message.header, ALL_TYPES)
            if header["type"] == FRAME:
                FrameHeader.from_message(header, sent_by="infer" if "infer" in header else "pre")
            passed += 1
        except ProtocolError as exc:
            kinds[exc.kind] = kinds.get(exc.kind, 0) + 1
    assert {"token", "msgpack", "schema", "arrays"} <= set(kinds), kinds
    assert passed > 0  # some mutations keep a message valid: the fuzzer is not only throwing noise
    for header in templates:  # and the socket still carries good messages
        send_message(sender, {k: v for k, v in header.items()}, token=TOKEN)
        assert validate(recv_message(receiver, token=TOKEN).header, ALL_TYPES)["type"] == header["type"]


@pytest.mark.parametrize("spec", [",", "(1,)(", "i4,f8", "O", "V8", "M8[", "<U4", "S3"])
def test_an_array_dtype_numpy_cannot_parse_or_does_not_allow_is_a_protocol_error(ctx, made, spec):
    sender, receiver = socket_pair(ctx, made)
    sender.send_multipart([TOKEN, msgpack.packb({"arrays": [[spec, [1]]]}), b"\0" * 8])
    with pytest.raises(ProtocolError) as error:
        recv_message(receiver, token=TOKEN)
    assert error.value.kind == "arrays"


@pytest.fixture
def ring(tmp_path):
    r = SlotRing(segment_name("1-fuzz", "pre-0", 0), slot_bytes=4096, count=2, directory=str(tmp_path))
    yield r
    r.close()


def test_random_slot_references_raise_only_slot_errors(ring, tmp_path):
    rng = random.Random(FUZZ_SEED + 3)
    views = SlotViews("1-fuzz", directory=str(tmp_path))
    slot = ring.acquire(0)
    good, _ = ring.store(slot, [np.zeros((3, 8, 8), np.uint8)])
    read = 0
    try:
        for _ in range(FUZZ_ROUNDS):
            ref = mutate_value(rng, good[0]) if rng.random() < 0.8 else random_value(rng)
            try:
                views.array(ref, [np.zeros(4, np.uint8)])
                read += 1
            except SlotError:
                pass
    finally:
        views.close()
    assert read > 0


# -- the handlers behind the checks, with the run's token ----------------------------------------------

def test_a_producer_survives_mutated_credit_and_acks(ctx, made, tmp_path):
    """What a ROUTER reads (credit and acks from any DEALER that connects): dropped or applied,
    never an exception; the real consumer's credit still works afterwards."""
    rng = random.Random(FUZZ_SEED + 4)
    endpoint = f"ipc://{tmp_path}/p.ipc"
    down = Downstream(ctx, endpoint, ["infer-0"], "pre-0.0", Wire(TOKEN), DropCounter(LOG))
    made.append(down)
    strangers = []
    for identity in (b"fuzz-0.0", b"\xff\xfe", b"infer-0", b"infer-x.1", b"infer-0.0"):
        s = make_socket(ctx, zmq.DEALER, linger_ms=0, identity=identity)
        s.connect(endpoint)
        strangers.append(s)
        made.append(s)
    templates = [h for h in good_headers() if h["type"] in (CREDIT, ACK)]
    for _ in range(FUZZ_ROUNDS // 3):  # one impersonates the consumer's first incarnation
        header = mutate_header(rng, rng.choice(templates))
        rng.choice(strangers).send_multipart([TOKEN, pack({**header, "arrays": []})])
        if down.socket.poll(50):
            while down.socket.poll(0):
                down.handle()
    assert down.drops.counts, "nothing was dropped: the fuzzer sent only good messages"
    real = Upstream(ctx, [endpoint], ["pre-0"], "infer-0.1", 2, Wire(TOKEN), DropCounter(LOG))
    made.append(real)
    real.start()
    deadline = time.perf_counter() + 5
    while b"infer-0.1" not in down.peers or down.peers[b"infer-0.1"].credit < 2:
        assert time.perf_counter() < deadline
        if down.socket.poll(100):
            down.handle()
    assert down.send({"id": 0}) == b"infer-0.1"


def test_a_consumer_survives_mutated_frames(ctx, made, tmp_path):
    """What a DEALER reads from its producer: frames and end-of-stream, mutated."""
    rng = random.Random(FUZZ_SEED + 5)
    endpoint = f"ipc://{tmp_path}/c.ipc"
    router = make_socket(ctx, zmq.ROUTER, linger_ms=0)
    router.bind(endpoint)
    made.append(router)
    up = Upstream(ctx, [endpoint], ["pre-0"], "infer-0.0", 2, Wire(TOKEN), DropCounter(LOG))
    made.append(up)
    up.start()
    assert router.poll(2000)
    identity = router.recv_multipart()[0]
    templates = [h for h in good_headers() if h["type"] in (FRAME, END)]
    for _ in range(FUZZ_ROUNDS // 3):
        router.send_multipart([identity, TOKEN, *fuzz_message(rng, templates)])
        assert up.sockets[0].poll(2000)
        msg = up.receive(up.sockets[0])
        if msg is not None:
            try:
                FrameHeader.from_message(msg.header, sent_by="pre")
            except ProtocolError:
                pass
            up.ack(msg.header["id"], release=rng.random() < 0.5)
    assert up.drops.counts


def test_returns_and_heartbeats_survive_mutated_messages(tmp_path):
    """A preprocess worker's slot returns and the runner's heartbeat table, on headers that
    passed validation with random content."""
    from types import SimpleNamespace

    from workers.preprocess import FramesOut
    rng = random.Random(FUZZ_SEED + 6)
    args = SimpleNamespace(slot_bytes=1024, slot_count=2, run_tag=f"{os.getpid()}-fuzz", name="pre-0", incarnation=0)
    frames_out = FramesOut(args)
    health = Health(timeout_s=5.0)
    health.expect("pre-0", 0)
    templates = {RELEASE: {**good_headers()[5], "seg": frames_out.ring.name}, HEARTBEAT: good_headers()[9]}
    try:
        for _ in range(FUZZ_ROUNDS):
            kind = rng.choice([RELEASE, HEARTBEAT])
            header = mutate_header(rng, templates[kind])
            if kind == HEARTBEAT and rng.random() < 0.5:
                header["name"] = "pre-0"
            try:
                validate(header, {kind})
            except ProtocolError:
                continue
            if kind == RELEASE:
                frames_out.release_items(header)
            else:
                health.beat(header)
                health.stuck()
        assert 0 <= frames_out.ring.free_slots() <= frames_out.ring.count
    finally:
        frames_out.ring.close()


@pytest.mark.parametrize("change", [{"video": {"item": "0", "index": 1}}, {"video": {"index": 1}}, {"video": [0, 1]},
                                    {"px": [1]}, {"pre": ["pre-0"]}, {"cycle": "0"}, {"draw": {}},
                                    {"predictions": "abc"}, {"image_error": 5}])
def test_the_collectors_optional_fields_are_checked_on_arrival(change):
    """What the collector acts on beyond the required fields (a video frame to write, a slot to
    give back, predictions to keep) is checked too: malformed, the message is dropped, not a crash."""
    result = {**good_headers()[6], "id": 3, **change}
    with pytest.raises(ProtocolError) as error:
        validate(result, {RESULT})
    assert error.value.kind == "schema"
    if "video" in change or "cycle" in change:
        with pytest.raises(ProtocolError):
            validate({**good_headers()[7], "id": 3, **change}, {FAILED})


def test_slot_returns_ignore_results_that_name_no_slot(ctx, made, tmp_path):
    """The collector gives a video frame's slot back from the result's px and pre: random ones
    send nothing, raise nothing; a well-formed one still goes to its preprocess worker."""
    from types import SimpleNamespace

    from wire.links import SlotReturns
    rng = random.Random(FUZZ_SEED + 8)
    endpoint = f"ipc://{tmp_path}/returns.ipc"
    pull = make_socket(ctx, zmq.PULL, linger_ms=0)
    pull.bind(endpoint)
    made.append(pull)
    endpoints = Endpoints({"pre": 1}, {"pre-0-returns": endpoint})
    returns = SlotReturns(ctx, SimpleNamespace(wire=Wire(TOKEN), endpoints=endpoints))
    made.append(returns)
    good = {"id": 3, "pre": "pre-0", "px": {"orig": {"seg": "yolo-pipeline-1-x-pre-0-0", "slot": 1, "off": 0}}}
    for _ in range(FUZZ_ROUNDS):
        header = mutate_header(rng, good)
        header["id"] = 3
        if header.get("pre") == "pre-0" and isinstance(header.get("px"), dict):
            header["px"] = rng.choice([[1], "x", {"orig": [1]}, {"lb": {"slot": 1}}, {"orig": {"seg": 5, "slot": 1}}])
        returns.release(header["id"], header.get("pre"), header.get("px"))
    assert not pull.poll(100), "a malformed result released a slot"
    returns.release(good["id"], good["pre"], good["px"])
    assert pull.poll(2000)
    assert recv_message(pull, token=TOKEN).header["items"] == [[1, 3]]


# -- a live run under fire ----------------------------------------------------------------------------
