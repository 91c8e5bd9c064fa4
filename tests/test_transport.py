import msgpack
import numpy as np
import pytest
import zmq

from wire.transport import (
    LINGER_MS,
    CurveKeys,
    Limits,
    Message,
    ProtocolError,
    check_endpoint,
    ipc_endpoint,
    make_socket,
    recv_message,
    send_message,
)

TOKEN = bytes(range(16))

RCVTIMEO_MS = 2000


@pytest.fixture
def sockets(ctx, tmp_path):
    """Close every socket a test makes, so ``ctx.term()`` never hangs."""
    made = []

    def make(kind, **options):
        socket = make_socket(ctx, kind, linger_ms=0, **options)
        socket.setsockopt(zmq.RCVTIMEO, RCVTIMEO_MS)
        socket.setsockopt(zmq.SNDTIMEO, RCVTIMEO_MS)
        made.append(socket)
        return socket

    yield make
    for socket in made:
        socket.close()


@pytest.fixture
def pair(sockets, tmp_path):
    frames_out = sockets(zmq.PUSH)
    frames_in = sockets(zmq.PULL)
    endpoint = ipc_endpoint(str(tmp_path), "frames")
    frames_in.bind(endpoint)
    frames_out.connect(endpoint)
    return frames_out, frames_in


def sample_arrays():
    rng = np.random.default_rng(0)
    return [
        rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8),
        rng.standard_normal((7, 5)).astype(np.float32),
        rng.standard_normal((3, 4)).astype(np.float16),
        rng.integers(-(2**40), 2**40, size=(9,), dtype=np.int64),
        np.zeros((0, 6), dtype=np.float32),
        np.array([True, False, True]),
        np.array(2.5),
    ]


def test_round_trip_push_pull(pair):
    frames_out, frames_in = pair
    arrays = sample_arrays()
    header = {"type": "frame", "frame_id": 17, "name": "a/b.jpg", "t": 1.5, "raw": b"\x00\x01"}
    sent = send_message(frames_out, header, arrays, token=TOKEN)
    message = recv_message(frames_in, token=TOKEN, limits=Limits(parts=len(arrays) + 2))
    assert isinstance(message, Message)
    assert message.header == header
    assert message.envelope == []
    assert message.nbytes == sent
    assert sent == len(msgpack.packb({**header, "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]},
                                     use_bin_type=True)) + sum(a.nbytes for a in arrays)
    assert len(message.arrays) == len(arrays)
    for received, original in zip(message.arrays, arrays):
        assert received.dtype == original.dtype
        assert received.shape == original.shape
        np.testing.assert_array_equal(received, original)
        assert not received.flags.writeable
        with pytest.raises(ValueError):
            received[...] = 0


def test_header_only_message(pair):
    frames_out, frames_in = pair
    assert send_message(frames_out, {"type": "stop"}, token=TOKEN) > 0
    message = recv_message(frames_in, token=TOKEN)
    assert message.header == {"type": "stop"}
    assert message.arrays == []


def test_non_contiguous_arrays_are_sent_contiguous(pair):
    frames_out, frames_in = pair
    base = np.arange(6 * 8 * 3, dtype=np.int16).reshape(6, 8, 3)
    strided = base[::2, 1::3]
    fortran = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    bgr_to_rgb = base[..., ::-1]
    send_message(frames_out, {}, [strided, fortran, bgr_to_rgb], token=TOKEN)
    message = recv_message(frames_in, token=TOKEN)
    for received, original in zip(message.arrays, [strided, fortran, bgr_to_rgb]):
        assert received.shape == original.shape
        np.testing.assert_array_equal(received, original)


def test_router_dealer_envelope(sockets, tmp_path):
    requests_in = sockets(zmq.ROUTER)
    endpoint = ipc_endpoint(str(tmp_path), "router")
    requests_in.bind(endpoint)
    worker = sockets(zmq.DEALER, identity=b"worker-3")
    worker.connect(endpoint)

    image = np.full((4, 5, 3), 7, dtype=np.uint8)
    send_message(worker, {"type": "ready"}, [image], token=TOKEN)
    request = recv_message(requests_in, token=TOKEN, routed=True)
    assert request.envelope == [b"worker-3"]
    assert request.header == {"type": "ready"}
    np.testing.assert_array_equal(request.arrays[0], image)

    boxes = np.arange(12, dtype=np.float32).reshape(2, 6)
    sent = send_message(requests_in, {"type": "work", "id": 1}, [boxes], envelope=request.envelope, token=TOKEN)
    reply = recv_message(worker, token=TOKEN)
    assert reply.header == {"type": "work", "id": 1}
    assert reply.nbytes == sent
    np.testing.assert_array_equal(reply.arrays[0], boxes)


def test_header_with_arrays_key_is_rejected(pair):
    frames_out, _ = pair
    with pytest.raises(ValueError, match="'arrays'"):
        send_message(frames_out, {"arrays": []}, token=TOKEN)


def test_object_arrays_are_rejected(pair):
    frames_out, _ = pair
    with pytest.raises(ValueError, match="object"):
        send_message(frames_out, {}, [np.array([None, 1], dtype=object)], token=TOKEN)
    with pytest.raises(ValueError, match="numpy array"):
        send_message(frames_out, {}, [[1, 2, 3]], token=TOKEN)


@pytest.mark.parametrize(
    "frames, match",
    [
        ([b"\xc1"], "msgpack header"),
        ([msgpack.packb([1, 2])], "msgpack map"),
        ([msgpack.packb({"type": "x"})], "'arrays'"),
        ([msgpack.packb({"arrays": [["<f4", [2]]]})], "1 array frame"),
        ([msgpack.packb({"arrays": []}), b"abc"], "0 array frame"),
        ([msgpack.packb({"arrays": [["<f4", [2, 3]]]}), b"\x00" * 20], "24 bytes"),
        ([msgpack.packb({"arrays": [["no-such-dtype", [1]]]}), b"\x00"], "dtype"),
        ([msgpack.packb({"arrays": [["|O", [1]]]}), b"\x00" * 8], "dtype"),
        ([msgpack.packb({"arrays": [["|u1", [-1]]]}), b"\x00"], "shape"),
        ([msgpack.packb({"arrays": [["|u1"]]}), b"\x00"], r"\[dtype, shape\]"),
    ],
)
def test_malformed_messages(pair, frames, match):
    frames_out, frames_in = pair
    frames_out.send_multipart([TOKEN, *frames])
    with pytest.raises(ProtocolError, match=match):
        recv_message(frames_in, token=TOKEN)


def test_routed_message_without_header(pair):
    frames_out, frames_in = pair
    frames_out.send(b"only-an-envelope")
    with pytest.raises(ProtocolError, match="token and a header frame after 1 envelope"):
        recv_message(frames_in, token=TOKEN, routed=True)


def test_make_socket_options(ctx, sockets):
    socket = make_socket(ctx, zmq.DEALER, sndhwm=5, rcvhwm=7, identity=b"id-1")
    try:
        assert socket.getsockopt(zmq.LINGER) == LINGER_MS
        assert socket.getsockopt(zmq.SNDHWM) == 5
        assert socket.getsockopt(zmq.RCVHWM) == 7
        assert socket.getsockopt(zmq.IDENTITY) == b"id-1"
    finally:
        socket.close()
    assert sockets(zmq.PUSH).getsockopt(zmq.LINGER) == 0


@pytest.mark.parametrize(
    "options, match",
    [
        ({"linger_ms": -2}, "linger_ms"),
        ({"sndhwm": -1}, "sndhwm"),
        ({"rcvhwm": -1}, "rcvhwm"),
        ({"identity": b""}, "identity"),
        ({"identity": b"\x00abc"}, "identity"),
        ({"identity": "text"}, "identity"),
    ],
)
def test_make_socket_rejects_bad_options(ctx, options, match):
    with pytest.raises(ValueError, match=match):
        make_socket(ctx, zmq.DEALER, **options)


def test_ipc_endpoint(tmp_path):
    assert ipc_endpoint("/tmp/run", "frames") == "ipc:///tmp/run/frames.ipc"
    assert ipc_endpoint("/tmp/run/", "frames") == "ipc:///tmp/run/frames.ipc"
    with pytest.raises(ValueError, match="unix socket"):
        ipc_endpoint("/tmp/" + "d" * 120, "frames")
    with pytest.raises(ValueError, match="without '/'"):
        ipc_endpoint("/tmp", "a/b")
    with pytest.raises(ValueError, match="without '/'"):
        ipc_endpoint("/tmp", "")


@pytest.mark.parametrize(
    "endpoint",
    ["ipc:///tmp/x.ipc", "tcp://127.0.0.1:5555", "tcp://*:5555", "tcp://localhost:*", "tcp://[::1]:80"],
)
def test_check_endpoint_accepts(endpoint):
    assert check_endpoint(endpoint) == endpoint


@pytest.mark.parametrize(
    "endpoint",
    ["ipc://", "tcp://127.0.0.1", "tcp://:5555", "tcp://host:0", "tcp://host:70000", "tcp://host:port",
     "inproc://x", "udp://h:1", "/tmp/x.ipc", ""],
)
def test_check_endpoint_rejects(endpoint):
    with pytest.raises(ValueError, match="expected an endpoint"):
        check_endpoint(endpoint)


def test_a_message_without_the_run_token_is_refused_before_decoding(pair):
    frames_out, frames_in = pair
    frames_out.send_multipart([b"x" * 16, b"\xc1 not even msgpack"])
    with pytest.raises(ProtocolError, match="token") as error:
        recv_message(frames_in, token=TOKEN)
    assert error.value.kind == "token"
    send_message(frames_out, {"type": "after"}, token=TOKEN)  # the socket still works
    assert recv_message(frames_in, token=TOKEN).header == {"type": "after"}


def test_too_many_parts_are_read_off_and_refused(pair):
    frames_out, frames_in = pair
    frames_out.send_multipart([TOKEN] + [b"x"] * 50)
    with pytest.raises(ProtocolError, match="at most 8 message parts, got 51") as error:
        recv_message(frames_in, token=TOKEN)
    assert error.value.kind == "parts"
    send_message(frames_out, {"type": "next"}, token=TOKEN)
    assert recv_message(frames_in, token=TOKEN).header == {"type": "next"}  # nothing left behind


@pytest.mark.parametrize("header, limits, kind", [
    ({"big": "x" * 5000}, Limits(header_bytes=1000), "header-size"),
    ({f"k{i}": i for i in range(5000)}, Limits(), "msgpack"),  # a map wider than map_len
    ({"values": list(range(1000))}, Limits(array_len=100), "msgpack"),
    ({"text": "y" * 2000}, Limits(str_len=1000), "msgpack"),
])
def test_decoding_is_bounded(pair, header, limits, kind):
    frames_out, frames_in = pair
    frames_out.send_multipart([TOKEN, msgpack.packb({**header, "arrays": []})])
    with pytest.raises(ProtocolError) as error:
        recv_message(frames_in, token=TOKEN, limits=limits)
    assert error.value.kind == kind


def test_array_bytes_are_bounded(pair):
    frames_out, frames_in = pair
    send_message(frames_out, {}, [np.zeros(2000, np.uint8)], token=TOKEN)
    with pytest.raises(ProtocolError, match="at most 1000 bytes"):
        recv_message(frames_in, token=TOKEN, limits=Limits(array_bytes=1000))


def test_curve_refuses_a_client_without_the_runs_server_key(ctx, sockets):
    keys = CurveKeys.generate()
    server = make_socket(ctx, zmq.PULL, linger_ms=0, curve=keys, curve_server=True)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    try:
        stranger = sockets(zmq.PUSH, curve=CurveKeys.generate())  # someone else's server key
        stranger.connect(f"tcp://127.0.0.1:{port}")
        plain = sockets(zmq.PUSH)
        plain.connect(f"tcp://127.0.0.1:{port}")
        for socket in (stranger, plain):
            socket.send_multipart([TOKEN, b"forged"], flags=zmq.NOBLOCK) if socket.poll(0, zmq.POLLOUT) else None
        assert not server.poll(500), "a message crossed without the run's key"
        member = sockets(zmq.PUSH, curve=keys)
        member.connect(f"tcp://127.0.0.1:{port}")
        send_message(member, {"type": "hello"}, token=TOKEN)
        assert server.poll(3000)
        assert recv_message(server, token=TOKEN).header == {"type": "hello"}
    finally:
        server.close()


def test_drop_counter_logs_each_kind_once(caplog):
    from wire.transport import DropCounter
    import logging
    drops = DropCounter(logging.getLogger("drops"))
    for _ in range(3):
        drops.note(ProtocolError("token", "bad token"), "results")
    drops.note(ProtocolError("schema", "bad field"), "results")
    assert drops.counts == {"results:token": 3, "results:schema": 1}
    assert len([r for r in caplog.records if "dropped a bad message" in r.getMessage()]) == 2
