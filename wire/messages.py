"""The messages the pipeline's processes exchange, and the one check each gets on arrival.

A header is a msgpack map with a ``"type"``; :data:`SCHEMAS` lists, per type, the fields a
receiver relies on and their types. :func:`validate` raises :class:`ProtocolError` (kind
``schema``) for an unknown type, a missing field or a field of the wrong type, so a receiver
never meets a KeyError or a bad value deep in its loop. Extra fields are allowed (a sender
may add timing or debug fields), and nested values a stage only passes on are checked by shape.
"""

from __future__ import annotations

from typing import Any

from wire.transport import ProtocolError

# Link protocol (credit-based ROUTER/DEALER, see wire/links.py).
CREDIT = "credit"  # consumer -> producer: you may send me n more frames
ACK = "ack"  # consumer -> producer: these frame ids are passed on (returns their credit)
FRAME = "frame"  # producer -> consumer
END = "end"  # producer -> consumer: no more frames from me
RELEASE = "release"  # last reader -> owner of a shared-memory slot: the slot may be reused
# Results and reports (PUSH -> the collector's PULL).
RESULT = "result"
FAILED = "failed"
STATS = "stats"
# Runner <-> processes.
HEARTBEAT = "heartbeat"  # every process -> runner, from a thread, every HEARTBEAT_INTERVAL_S
PROGRESS = "progress"  # collector -> runner
FINISHED = "finished"  # collector -> runner: the run folder is written (or could not be)
DRAIN = "drain"  # runner -> all: stop reading new frames, finish the ones in flight
STOP = "stop"  # runner -> all: stop now, report what you hold
PEER_GONE = "peer_gone"  # runner -> all: a process died or hung; resend what it held

INT, FLOAT, STR, BOOL, LIST, DICT = "int", "float", "str", "bool", "list", "dict"
OPTIONAL = "?"  # prefix: the field may be absent or None

_TIMES = DICT  # {"read_start": float, ...}: checked by _check_times
SCHEMAS: dict[str, dict[str, str]] = {
    CREDIT: {"n": INT},
    ACK: {"ids": LIST, "n": INT, "to": STR, "release": "?list"},
    FRAME: {"id": INT, "src": STR},  # what the link needs; the receiving stage checks the rest (wire.frame_header)
    END: {},
    RELEASE: {"seg": STR, "items": LIST},
    # The optional fields of results and failures are what the collector acts on (a video frame to
    # write, a slot to give back): checked here too, so a malformed one is dropped, not a crash.
    RESULT: {"id": INT, "name": STR, "t": _TIMES, "detections": LIST, "workers": DICT, "batch": INT,
             "image_saved": BOOL, "cold": BOOL, "cycle": "?int", "video": "?dict", "px": "?dict", "pre": "?str",
             "draw": "?list", "predictions": "?list", "image_error": "?str"},
    FAILED: {"id": INT, "name": STR, "stage": STR, "worker": STR, "reason": STR, "cycle": "?int", "video": "?dict"},
    STATS: {"name": STR, "role": STR, "incarnation": INT, "pid": INT, "frames": INT, "wall_s": FLOAT,
            "busy_s": FLOAT, "busy_cpu_s": FLOAT, "cpu_s": FLOAT, "wait_in_s": FLOAT, "blocked_out_s": FLOAT,
            "frame_ms": DICT, "frame_cpu_ms": DICT, "substages_ms": DICT, "exit_usage": "?dict"},
    HEARTBEAT: {"name": STR, "incarnation": INT, "pid": INT, "loop_age_s": FLOAT, "position": INT,
                "signal": "?str"},
    PROGRESS: {"processed": INT, "failed": INT},
    FINISHED: {"summary": DICT, "written": LIST, "write_error": "?str"},
    DRAIN: {"reason": STR, "cancel": "?bool", "signal": "?str"},
    STOP: {"reason": STR, "signal": "?str"},
    PEER_GONE: {"name": STR, "incarnation": INT, "final": BOOL, "reason": STR, "poison": "?list"},
}



def is_number(value: Any) -> bool:
    """An int or a float, never a bool (msgpack gives True for true, and True == 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_CHECKS = {INT: lambda v: isinstance(v, int) and not isinstance(v, bool), FLOAT: is_number,
           STR: lambda v: isinstance(v, str), BOOL: lambda v: isinstance(v, bool),
           LIST: lambda v: isinstance(v, list), DICT: lambda v: isinstance(v, dict)}


def validate(header: dict, expected: frozenset[str] | set[str]) -> dict:
    """``header`` if its type is one of ``expected`` and its fields match :data:`SCHEMAS`."""
    kind = header.get("type")
    if not isinstance(kind, str) or kind not in expected:  # a list or map as type is not even hashable
        raise ProtocolError("schema", f"expected a message of type {sorted(expected)}, got {kind!r}")
    return check_fields(header, SCHEMAS[kind], kind)


def check_fields(header: dict, fields: dict[str, str], kind: str) -> dict:
    """``header`` if it has ``fields`` of their types (a ``?`` type may be absent or None)."""
    for name, spec in fields.items():
        optional = spec.startswith(OPTIONAL)
        value = header.get(name)
        if value is None:
            if optional:
                continue
            raise ProtocolError("schema", f"expected field {name!r} in a {kind!r} message, got none")
        if not _CHECKS[spec.lstrip(OPTIONAL)](value):
            raise ProtocolError("schema", f"expected field {name!r} of a {kind!r} message to be {spec.lstrip('?')}, "
                                          f"got {type(value).__name__}")
    if "t" in fields:
        _check_times(header["t"], kind)
    if "video" in fields and header.get("video") is not None:
        _check_video(header["video"], kind)
    for name in ("ids", "release"):  # id lists go into sets and dict lookups: unhashable items must not
        if name in fields and header.get(name) is not None:
            _check_ints(header[name], name, kind)
    return header


def _check_times(times: dict[str, Any], kind: str) -> None:
    if not all(isinstance(k, str) and _CHECKS[FLOAT](v) for k, v in times.items()):
        raise ProtocolError("schema", f"expected field 't' of a {kind!r} message to map names to seconds")


def _check_video(video: dict, kind: str) -> None:
    """A video frame's place: which planned item and which frame index in it."""
    if not all(_CHECKS[INT](video.get(k)) and video[k] >= 0 for k in ("item", "index")):
        raise ProtocolError("schema", f"expected field 'video' of a {kind!r} message to hold ints 'item' and "
                                      f"'index' >= 0, got {sorted(map(str, video))}")


def _check_ints(values: list, name: str, kind: str) -> None:
    if not all(_CHECKS[INT](v) for v in values):
        raise ProtocolError("schema", f"expected field {name!r} of a {kind!r} message to be a list of ints")
