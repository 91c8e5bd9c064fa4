"""The messages the pipeline's processes exchange, and the one check each gets on arrival.

A header is a msgpack map with a ``"type"``; :data:`SCHEMAS` lists, per type, the fields a
receiver relies on and their types. :func:`validate` raises :class:`ProtocolError` (kind
``schema``) for an unknown type, a missing field or a field of the wrong type, so a receiver
never meets a KeyError or a bad value deep in its loop. Extra fields are allowed (a sender
may add timing or debug fields), and nested values a stage only passes on are checked by shape.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from analysis.jsontext import records_text
from wire.transport import ProtocolError

INT, FLOAT, STR, BOOL, LIST, DICT = "int", "float", "str", "bool", "list", "dict"
OPTIONAL = "?"  # prefix: the field may be absent or None
_WIRE_TYPES = {"int": INT, "float": FLOAT, "str": STR, "bool": BOOL, "list": LIST, "tuple": LIST, "dict": DICT}


def schema_of(cls, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """The wire schema of a message dataclass, from its fields' annotations: ``int`` -> "int",
    ``tuple[int, int]`` -> "list" (msgpack has no tuples), a nested dataclass -> "dict" (it
    travels as a map), ``X | None`` -> optional. The one place a message's fields are written
    is its dataclass."""
    schema = {}
    for f in dataclasses.fields(cls):
        if f.name in leave_out or f.metadata.get("wire") is False:
            continue
        annotation = str(f.type).replace(" ", "")
        optional = annotation.endswith("|None")
        base = annotation.removesuffix("|None").split("[")[0]
        schema[f.name] = (OPTIONAL if optional else "") + _WIRE_TYPES.get(base, DICT)
    return schema


class Message:
    """A message kind: a frozen dataclass with its ``TYPE``; ``to_message()`` is the msgpack map
    sent, ``from_message()`` the checked dataclass of one received (ProtocolError otherwise)."""

    TYPE: ClassVar[str]

    def to_message(self) -> dict:
        """The map sent: every field but an optional one that is None (absent reads the same)."""
        message = {"type": self.TYPE}
        message.update((name, value) for name in _field_names(type(self)) if (value := getattr(self, name)) is not None)
        return message

    @classmethod
    def from_message(cls, header: dict):
        check_fields(header, SCHEMAS[cls.TYPE], cls.TYPE)
        return cls(**{name: header[name] for name in _field_names(cls) if name in header})


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    """Once per class, not per message (dataclasses.fields costs microseconds, a frame sends several)."""
    return tuple(f.name for f in dataclasses.fields(cls))


# Link protocol (credit-based ROUTER/DEALER, see wire/links.py).
@dataclass(frozen=True)
class Credit(Message):
    """consumer -> producer: you may send me n more frames."""
    TYPE: ClassVar[str] = "credit"
    n: int


@dataclass(frozen=True)
class Ack(Message):
    """consumer -> producer incarnation ``to``: these frame ids are passed on (returns their
    credit); those in ``release`` also give their shared-memory slot back."""
    TYPE: ClassVar[str] = "ack"
    ids: list
    n: int
    to: str
    release: list | None = None


@dataclass(frozen=True)
class Taken(Message):
    """consumer -> producer incarnation ``to``: these frames are finished here and held for a
    batched send (the last stage's results wait for the collector's next message): their credit
    comes back now, and they stay on the producer's ledger, to be sent again if this consumer
    dies, until their ack (which then returns no credit for them)."""
    TYPE: ClassVar[str] = "taken"
    ids: list
    to: str


@dataclass(frozen=True)
class FrameOnLink(Message):
    """producer -> consumer: one frame, its header's fields beside these (wire.frame_header)."""
    TYPE: ClassVar[str] = "frame"
    id: int
    src: str  # the producer's identity, whom the ack goes to


@dataclass(frozen=True)
class End(Message):
    """producer -> consumer: no more frames from me."""
    TYPE: ClassVar[str] = "end"


@dataclass(frozen=True)
class Release(Message):
    """last reader -> owner of a shared-memory slot: ``items`` ([slot, frame id] pairs) may be reused."""
    TYPE: ClassVar[str] = "release"
    seg: str
    items: list


# Results and reports (PUSH -> the collector's PULL). The optional fields of results and failures
# are what the collector acts on (a video frame to write, a slot to give back): checked too, so a
# malformed one is dropped, not a crash.
@dataclass(frozen=True)
class FinishedFrame(Message):
    """What a finished frame's messages carry beside its records (:class:`Result`, :class:`Done`)."""
    id: int
    name: str
    t: dict
    workers: dict
    batch: int
    image_saved: bool
    cold: bool
    cycle: int | None = None
    video: dict | None = None
    px: dict | None = None
    pre: str | None = None
    draw: list | None = None
    image_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Result(FinishedFrame):
    """A frame done, its detections and timestamps: what a frame stage after postprocess takes
    (and what the collector takes too, one at a time)."""
    TYPE: ClassVar[str] = "result"
    detections: list
    predictions: list | None = None


@dataclass(frozen=True, kw_only=True)
class Done(FinishedFrame):
    """A finished frame as the collector takes it, one item of a :class:`Results` batch: a
    result whose records the last frame stage already wrote as JSON text (the lines of a JSON
    list), so the one collector appends text and unpacks one string, not every record."""
    TYPE: ClassVar[str] = "done"
    detections: int  # how many records detections_json holds
    detections_json: str
    predictions: int
    predictions_json: str


def done_item(result: dict) -> dict:
    """A result map as a :class:`Done` map: its records written as JSON text (by the stage that
    calls this: the last frame stage's parallel processes, not the one collector)."""
    detections, found = records_text(result["detections"])
    predictions, predicted = records_text(result.get("predictions") or ())
    item = {k: v for k, v in result.items() if k not in _LEFT_FOR_TEXT}
    item.update(detections=found, detections_json=detections, predictions=predicted, predictions_json=predictions)
    return item


_LEFT_FOR_TEXT = frozenset({"type", "src", "detections", "predictions"})


@dataclass(frozen=True)
class Results(Message):
    """last frame stage -> collector: the frames it finished since its last batch (each a
    :class:`Done` map), one message for many: the collector's cost is per message as much as
    per frame."""
    TYPE: ClassVar[str] = "results"
    items: list


@dataclass(frozen=True)
class Failed(Message):
    """any frame stage -> collector: a frame that failed there, and why."""
    TYPE: ClassVar[str] = "failed"
    id: int
    name: str
    stage: str
    worker: str
    reason: str
    cycle: int | None = None
    video: dict | None = None


@dataclass(frozen=True)
class Stats(Message):
    """every process -> collector, as it ends: its clocks and counts (``extra``: the stage's own
    fields, sent beside these)."""
    TYPE: ClassVar[str] = "stats"
    name: str
    role: str
    incarnation: int
    pid: int
    frames: int
    wall_s: float
    busy_s: float
    busy_cpu_s: float
    cpu_s: float
    wait_in_s: float
    blocked_out_s: float
    frame_ms: dict
    frame_cpu_ms: dict
    substages_ms: dict
    exit_usage: dict | None = None
    extra: dict = field(default_factory=dict, metadata={"wire": False})

    def to_message(self) -> dict:
        message = super().to_message()
        message.update(message.pop("extra"))
        return message


# Runner <-> processes.
@dataclass(frozen=True)
class Beat(Message):
    """every process -> runner, from a thread, every HEARTBEAT_INTERVAL_S."""
    TYPE: ClassVar[str] = "heartbeat"
    name: str
    incarnation: int
    pid: int
    loop_age_s: float
    position: int
    signal: str | None = None


@dataclass(frozen=True)
class Progress(Message):
    """collector -> runner: frames done so far."""
    TYPE: ClassVar[str] = "progress"
    processed: int
    failed: int
    total: int | None = None


@dataclass(frozen=True)
class Finished(Message):
    """collector -> runner: the run folder is written (or could not be)."""
    TYPE: ClassVar[str] = "finished"
    summary: dict
    written: list
    write_error: str | None = None
    missing_workers: list | None = None


@dataclass(frozen=True)
class Drain(Message):
    """runner -> all: stop reading new frames, finish the ones in flight."""
    TYPE: ClassVar[str] = "drain"
    reason: str
    cancel: bool | None = None
    signal: str | None = None


@dataclass(frozen=True)
class Stop(Message):
    """runner -> all: stop now, report what you hold."""
    TYPE: ClassVar[str] = "stop"
    reason: str
    signal: str | None = None


@dataclass(frozen=True)
class PeerGone(Message):
    """runner -> all: a process died or hung; resend what it held."""
    TYPE: ClassVar[str] = "peer_gone"
    name: str
    incarnation: int
    final: bool
    reason: str
    poison: list | None = None
    signal: str | None = None
    exit_code: int | None = None
    t_s: float | None = None
    position: int | None = None


MESSAGES = (Credit, Ack, FrameOnLink, End, Release, Result, Done, Results, Failed, Stats, Beat, Progress, Finished,
            Drain, Stop, PeerGone, Taken)
SCHEMAS: dict[str, dict[str, str]] = {kind.TYPE: schema_of(kind) for kind in MESSAGES}
(CREDIT, ACK, FRAME, END, RELEASE, RESULT, DONE, RESULTS, FAILED, STATS, HEARTBEAT, PROGRESS, FINISHED, DRAIN, STOP,
 PEER_GONE, TAKEN) = (kind.TYPE for kind in MESSAGES)


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
    for name, optional, check, type_name in _compiled(fields):
        value = header.get(name)
        if value is None:
            if optional:
                continue
            raise ProtocolError("schema", f"expected field {name!r} in a {kind!r} message, got none")
        if not check(value):
            raise ProtocolError("schema", f"expected field {name!r} of a {kind!r} message to be {type_name}, "
                                          f"got {type(value).__name__}")
    if "t" in fields:
        _check_times(header["t"], kind)
    if "video" in fields and header.get("video") is not None:
        _check_video(header["video"], kind)
    for name in ("ids", "release"):  # id lists go into sets and dict lookups: unhashable items must not
        if name in fields and header.get(name) is not None:
            _check_ints(header[name], name, kind)
    return header


_COMPILED: dict[int, tuple[dict, tuple]] = {}  # id(schema) -> (the schema, its fields as check_fields walks them)
_COMPILED_MAX = 256  # schemas kept; one made afresh per call is compiled every time instead


def _compiled(fields: dict[str, str]) -> tuple[tuple[str, bool, Any, str], ...]:
    """(name, optional, check, type name) per field: what check_fields would otherwise parse
    from each spec string for every message (the collector checks every frame's fields)."""
    kept = _COMPILED.get(id(fields))
    if kept is not None and kept[0] is fields and len(kept[1]) == len(fields):
        return kept[1]
    compiled = tuple((name, spec.startswith(OPTIONAL), _CHECKS[spec.lstrip(OPTIONAL)], spec.lstrip(OPTIONAL))
                     for name, spec in fields.items())
    if len(_COMPILED) < _COMPILED_MAX:
        _COMPILED[id(fields)] = (fields, compiled)
    return compiled


def _check_times(times: dict[str, Any], kind: str) -> None:
    for key, value in times.items():  # every frame's timestamps: floats are taken without a call
        if type(key) is not str or (type(value) is not float and not is_number(value)):
            raise ProtocolError("schema", f"expected field 't' of a {kind!r} message to map names to seconds")


def _check_video(video: dict, kind: str) -> None:
    """A video frame's place: which planned item and which frame index in it."""
    if not all(_CHECKS[INT](video.get(k)) and video[k] >= 0 for k in ("item", "index")):
        raise ProtocolError("schema", f"expected field 'video' of a {kind!r} message to hold ints 'item' and "
                                      f"'index' >= 0, got {sorted(map(str, video))}")


def _check_ints(values: list, name: str, kind: str) -> None:
    if not all(_CHECKS[INT](v) for v in values):
        raise ProtocolError("schema", f"expected field {name!r} of a {kind!r} message to be a list of ints")
