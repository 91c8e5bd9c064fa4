"""Random and mutated messages: decoding and every handler behind it refuse what is bad with
ProtocolError or SlotError (counted and dropped by the receiver), never another exception that
would take a process down; and a live run that has random and mutated messages thrown at every
socket it binds still ends with every frame.

Seeds are fixed, so a failure reproduces; set FUZZ_ROUNDS and FUZZ_SEED for a longer or another search."""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from supervisor.health import Health
from workers.faults import TEST_SLOW_ENV
from workers.wiring import Endpoints, Wire
from workers.links import Downstream, Upstream
from workers.frame_header import FrameHeader
from workers.messages import (ACK, CREDIT, DRAIN, END, FAILED, FRAME, HEARTBEAT, PEER_GONE,
                              PROGRESS, RELEASE, RESULT, SCHEMAS, STATS, STOP, validate)
from workers.slots import SlotError, SlotRing, SlotViews, segment_name
from workers.transport import DropCounter, Limits, ProtocolError, make_socket, recv_message, send_message

TOKEN = bytes(range(16))
LOG = logging.getLogger("fuzz")
FUZZ_ROUNDS = int(os.environ.get("FUZZ_ROUNDS", "1500"))
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))  # added to every test's seed: another search
ALL_TYPES = frozenset(SCHEMAS)
SMALL_LIMITS = Limits(header_bytes=4096, parts=6, array_bytes=4096, str_len=512, bin_len=512, array_len=64, map_len=32)


# -- what the fuzzer throws ---------------------------------------------------------------------------

def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["none", "bool", "int", "bigint", "float", "str", "bytes"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, -1, 2, 3, 7, 64, 255, 4096, rng.randint(-10**6, 10**6)])
    if kind == "bigint":
        return rng.choice([2**31, 2**32, 2**40, 2**62, 2**63 - 1, -(2**63), 2**64 - 1])
    if kind == "float":
        return rng.choice([0.0, -1.5, 1e300, float("inf"), float("-inf"), float("nan"), rng.random()])
    if kind == "str":
        return rng.choice(["", "pre-0", "infer-0.0", "post-1.3", "x" * rng.randint(0, 40), "ü\x00/..",
                           "yolo-pipeline-1-x-pre-0-0", "<f4", "|u1", ",", "(1,)(", "O", "i4,f8"])
    if kind == "bytes":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 24)))
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {random_key(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def random_key(rng: random.Random) -> Any:
    known = ["type", "id", "n", "ids", "to", "release", "seg", "items", "name", "src", "px", "lb", "orig", "cands",
             "inline", "slot", "off", "dtype", "shape", "t", "arrays", "reason", "final", "incarnation", "video"]
    return rng.choice(known) if rng.random() < 0.8 else random_value(rng, 3)


def good_headers() -> list[dict]:
    """One well-formed header per message type, the frames as each stage receives them."""
    t = {"read_start": 1.0, "read_end": 1.1, "pre_end": 1.2}
    px = {"lb": {"inline": 0}, "orig": None}
    pre = {"type": FRAME, "id": 3, "src": "pre-0.0", "name": "a.jpg", "cycle": 0, "ratio": 0.5, "pad": [0, 8],
           "orig_shape": [48, 64], "lb_shape": [32, 32], "keep_image": False, "pre": "pre-0", "t": t, "px": px,
           "release_by": "infer"}
    return [
        {"type": CREDIT, "n": 2},
        {"type": ACK, "ids": [1, 2], "n": 2, "to": "pre-0.0", "release": [1]},
        pre,
        {**pre, "src": "infer-0.0", "infer": "infer-0", "batch": 1, "cold": False, "px": {**px, "cands": {"inline": 0}}},
        {"type": END},
        {"type": RELEASE, "seg": "yolo-pipeline-1-x-pre-0-0", "items": [[0, 3]]},
        {"type": RESULT, "id": 10**6, "name": "a.jpg", "t": t, "detections": [], "workers": {}, "batch": 1,
         "image_saved": False, "cold": False},
        {"type": FAILED, "id": 10**6, "name": "a.jpg", "stage": "pre", "worker": "fuzz", "reason": "fuzz"},
        {"type": STATS, "name": "fuzz-0", "role": "pre", "incarnation": 0, "pid": 1, "frames": 0, "wall_s": 1.0,
         "busy_s": 0.0, "busy_cpu_s": 0.0, "cpu_s": 0.0, "wait_in_s": 0.0, "blocked_out_s": 0.0, "frame_ms": {},
         "frame_cpu_ms": {}, "substages_ms": {}},
        {"type": HEARTBEAT, "name": "fuzz-0", "incarnation": 0, "pid": 1, "loop_age_s": 0.1, "position": 0},
        {"type": PROGRESS, "processed": 1, "failed": 0},
        {"type": DRAIN, "reason": "fuzz"},
        {"type": STOP, "reason": "fuzz"},
        {"type": PEER_GONE, "name": "fuzz-0", "incarnation": 0, "final": False, "reason": "fuzz"},
    ]


def mutate_header(rng: random.Random, header: dict) -> dict:
    """A few random edits: a field removed, retyped, or replaced by random data, a key added."""
    header = dict(header)
    for _ in range(rng.randint(1, 3)):
        edit = rng.random()
        keys = [k for k in header if k != "type"]
        if edit < 0.25 and keys:
            del header[rng.choice(keys)]
        elif edit < 0.75 and keys:
            key = rng.choice(keys)
            header[key] = mutate_value(rng, header[key])
        else:
            header[random_key(rng)] = random_value(rng)
    return header


def mutate_value(rng: random.Random, value: Any) -> Any:
    if isinstance(value, dict) and value and rng.random() < 0.7:
        return mutate_header(rng, value)
    if isinstance(value, list) and value and rng.random() < 0.7:
        items = list(value)
        items[rng.randrange(len(items))] = mutate_value(rng, items[rng.randrange(len(items))])
        return items
    return random_value(rng)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        edit = rng.random()
        if edit < 0.4 and data:
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        elif edit < 0.6:
            del data[rng.randrange(len(data) + 1):]
        elif edit < 0.8:
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        else:
            data += data[: rng.randint(0, len(data))]
    return bytes(data)


def pack(header: dict) -> bytes:
    try:
        return msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):  # not packable (a key or int msgpack refuses): random bytes
        return os.urandom(32)


def fuzz_message(rng: random.Random, templates: list[dict]) -> list[bytes]:
    """The parts after the token: a header (random, mutated, or a mutated encoding) and arrays."""
    choice = rng.random()
    if choice < 0.15:
        header_bytes = pack(random_value(rng))
    elif choice < 0.7:
        header = mutate_header(rng, rng.choice(templates))
        if rng.random() < 0.7:
            header["arrays"] = [[rng.choice(["|u1", "<f4", "<i8", "|b1", ",", "(1,)(", "O", "V8", random_value(rng)]),
                                 rng.choice([[4], [2, 2], [0], [-1], [2**40, 2**40], random_value(rng)])]
                                for _ in range(rng.randint(0, 2))]
        header_bytes = pack(header)
    else:
        header_bytes = mutate_bytes(rng, pack({**rng.choice(templates), "arrays": []}))
    arrays = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 4, 16, 17]))) for _ in range(rng.randint(0, 3))]
    return [header_bytes, *arrays]


# -- decoding and checks --------------------------------------------------------------------------------

def socket_pair(ctx, made, kind_out=zmq.PUSH, kind_in=zmq.PULL, name="fuzz"):
    receiver = make_socket(ctx, kind_in, linger_ms=0)
    receiver.bind(f"inproc://{name}")
    sender = make_socket(ctx, kind_out, linger_ms=0)
    sender.connect(f"inproc://{name}")
    made.extend([sender, receiver])
    return sender, receiver


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

    from workers.links import SlotReturns
    rng = random.Random(FUZZ_SEED + 8)
    endpoint = f"ipc://{tmp_path}/returns.ipc"
    pull = make_socket(ctx, zmq.PULL, linger_ms=0)
    pull.bind(endpoint)
    made.append(pull)
    returns = SlotReturns(ctx, SimpleNamespace(wire=Wire(TOKEN), endpoints=Endpoints({"pre": 1}, {"pre-0-returns": endpoint})))
    made.append(returns)
    good = {"id": 3, "pre": "pre-0", "px": {"orig": {"seg": "yolo-pipeline-1-x-pre-0-0", "slot": 1, "off": 0}}}
    for _ in range(FUZZ_ROUNDS):
        header = mutate_header(rng, good)
        header["id"] = 3
        if header.get("pre") == "pre-0" and isinstance(header.get("px"), dict):
            header["px"] = rng.choice([[1], "x", {"orig": [1]}, {"lb": {"slot": 1}}, {"orig": {"seg": 5, "slot": 1}}])
        returns.release(header)
    assert not pull.poll(100), "a malformed result released a slot"
    returns.release(good)
    assert pull.poll(2000)
    assert recv_message(pull, token=TOKEN).header["items"] == [[1, 3]]


# -- a live run under fire ----------------------------------------------------------------------------

LIVE_FRAMES = 80
WORKER_NAMES = {"pre-0", "infer-0", "post-0", "collector"}
ROUTED = ("pre-0", "infer-0")  # ROUTERs: a fuzzer connects a DEALER


def harmless(header: dict) -> dict:
    """A mutated message that stays valid must not be a forgery that changes the outcome (the
    fuzzer holds the token, as a run's own process does): ids outside the plan, names of no worker,
    and never a FINISHED report to the runner."""
    if isinstance(header.get("id"), int) and not isinstance(header.get("id"), bool) and header["id"] < 10**5:
        header["id"] = 10**6 + (header["id"] % 1000 if header["id"] >= 0 else 0)
    if isinstance(header.get("name"), str) and header["name"] in WORKER_NAMES:
        header["name"] = "fuzz-0"
    if header.get("signal") is not None:
        header["signal"] = None  # a SIGTERM passed on drains the run by design
    if header.get("type") == "finished":
        header["type"] = PROGRESS
    return header


def templates_for(endpoint: str) -> list[dict]:
    by_socket = {"pre-0": (CREDIT, ACK), "infer-0": (CREDIT, ACK), "pre-0-returns": (RELEASE,),
                 "collector": (RESULT, FAILED, STATS), "progress": (PROGRESS,), "health": (HEARTBEAT,)}
    kinds = by_socket.get(endpoint, ())
    return [h for h in good_headers() if h["type"] in kinds]


def throw_at(ctx, endpoints: dict[str, str], token: bytes | None, rng: random.Random, rounds: int) -> int:
    """Random and mutated messages at every bound socket of the run; returns how many went."""
    sent = 0
    sockets = []
    try:
        for name, url in endpoints.items():
            if name == "control":
                s = ctx.socket(zmq.XSUB)  # a SUB's only way to talk: (un)subscriptions, here garbage
            elif name in ROUTED:
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, rng.choice([b"fuzz-0.0", b"\xff" * 8, b"post-0", b"infer-9.0"]))
            else:
                s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 10000)
            s.connect(url)
            sockets.append((name, s))
        time.sleep(0.2)  # connected before the first send
        for _ in range(rounds):
            for name, s in sockets:
                if name == "control":
                    parts = [rng.choice([b"", b"\x00", b"\x01", os.urandom(rng.randint(1, 40))])]
                elif token is None or rng.random() < 0.2:
                    parts = [mutate_bytes(rng, TOKEN)] + fuzz_message(rng, good_headers())
                else:
                    templates = templates_for(name)
                    header = harmless(mutate_header(rng, rng.choice(templates)))
                    parts = [token, pack({**header, "arrays": []})] if rng.random() < 0.7 else \
                        [token, *fuzz_message(rng, templates)]
                try:
                    s.send_multipart(parts, flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
        for name, s in sockets:  # and the extremes: too many parts, a part over the receiver's limit
            if name != "control":
                for parts in ([token or TOKEN] + [b"x"] * 40, [token or TOKEN, b"\x80" * (2 << 20)]):
                    try:
                        s.send_multipart(parts, flags=zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        pass
        time.sleep(0.3)  # LINGER 0: let the queued messages leave before closing
    finally:
        for _, s in sockets:
            s.close()
    return sent


def read_token(ctx, control_url: str, run) -> bytes:
    """The run's token as a process of the run receives it: from the runner's broadcast, which a
    worker's death triggers (a peer-gone notice). Reachable only for the user who owns the ipc folder."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(control_url)
    try:
        time.sleep(0.3)  # subscribed before the broadcast
        run.wait_for_stage("post-0").send_signal(signal.SIGKILL)
        assert sub.poll(10000), "no broadcast after a worker died"
        token, header = sub.recv_multipart()[:2]
        assert msgpack.unpackb(header)["type"] == PEER_GONE
        return token
    finally:
        sub.close()


@pytest.fixture(scope="module")
def fuzzed_run(tmp_path_factory):
    from tests.live_run import SMALL_RUN, start_run
    tmp_path = tmp_path_factory.mktemp("fuzzed")
    run = start_run(tmp_path, *SMALL_RUN, "--preset", "none", "--frames", str(LIVE_FRAMES), "--save-images", "1",
                    env={TEST_SLOW_ENV: "post:30"})
    try:
        run.wait_for_images(3)
        (ipc_dir,) = run.ipc_dirs()
        endpoints = {p.stem: f"ipc://{p}" for p in ipc_dir.glob("*.ipc")}
        assert set(endpoints) == {"pre-0", "pre-0-returns", "infer-0", "collector", "control", "progress", "health"}
        rng = random.Random(FUZZ_SEED + 7)
        ctx = zmq.Context()
        try:
            sent = throw_at(ctx, endpoints, None, rng, rounds=150)  # strangers: no token
            token = read_token(ctx, endpoints["control"], run)
            sent += throw_at(ctx, endpoints, token, rng, rounds=150)  # the run's token, then mutated content
        finally:
            ctx.term()
        code = run.wait()
        yield run, code, sent
    finally:
        run.close()


@pytest.mark.slow
def test_a_run_under_random_and_mutated_messages_still_ends_with_every_frame(fuzzed_run):
    run, code, sent = fuzzed_run
    assert sent > 1000
    assert code == 0, run.stderr()
    report = run.report()
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["lost"]) == (LIVE_FRAMES, LIVE_FRAMES, 0, 0)
    assert [r["name"] for r in report["restarts"]] == ["post-0"]  # the kill that made the runner broadcast
    dropped = report["dropped_messages"]
    for process in ("pre-0", "infer-0", "collector"):
        counts = dropped.get(process, {})
        assert any(k.endswith(":token") for k in counts) and any(k.endswith(":schema") for k in counts), dropped
    for process in ("pre-0", "infer-0"):  # a well-formed credit or ack from no consumer of theirs
        assert dropped[process].get("link:stranger"), dropped
    # each kind of drop is logged once per process, then only counted
    lines = [line.split(" ", 2)[2] for line in run.log().splitlines() if "dropped a bad message on" in line]
    keys = [(line.split()[0], line.split("dropped a bad message on ")[1].split(":")[0]) for line in lines]
    assert keys and len(keys) == len(set(keys)), sorted(keys)
    assert any(k[0].startswith("runner[") for k in keys)  # the runner's own sockets drop and log too
    run.assert_clean()


@pytest.mark.slow
def test_the_runners_dropped_messages_are_counted_in_the_report(fuzzed_run):
    run, _, _ = fuzzed_run
    assert any(name.startswith("runner") for name in run.report()["dropped_messages"])


def test_a_heartbeat_from_no_process_of_the_run_does_not_drain_it():
    from types import SimpleNamespace

    from supervisor.run import _on_beat
    from supervisor.signals import Interrupts
    watch = SimpleNamespace(health=Health(timeout_s=5.0), interrupts=Interrupts())
    watch.health.expect("pre-0", 0)
    _on_beat(watch, {"type": HEARTBEAT, "name": "pre-0", "incarnation": 7, "pid": 1, "loop_age_s": 0.0,
                     "position": 0, "signal": "SIGTERM"})  # a replaced incarnation, or no worker at all
    assert watch.interrupts.count == 0
