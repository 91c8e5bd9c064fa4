"""Random and mutated messages for the fuzz tests: values, headers, bytes, and a socket pair to send them through."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import msgpack
import zmq

from wire.messages import (ACK, CREDIT, DRAIN, END, FAILED, FRAME, HEARTBEAT, PEER_GONE,
                              PROGRESS, RELEASE, RESULT, SCHEMAS, STATS, STOP)
from wire.transport import Limits, make_socket

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
