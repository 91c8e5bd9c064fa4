"""The wire format between pipeline processes, and socket set-up.

Every message is one multipart ZeroMQ message::

    [envelope frames ...] [run token] [msgpack header: dict] [array 0 bytes] [array 1 bytes] ...

The run token (random bytes made by the runner, given to each process at start, never on a
command line) comes first, so a message from anyone outside the run is dropped before any
decoding. The header carries ``"arrays": [[dtype_str, shape], ...]`` describing the raw frames
that follow, so arrays travel without pickling and are rebuilt as numpy views on the receiver.
Decoding is bounded (parts, header bytes, msgpack lengths, buffer length = shape x dtype): a bad
message raises :class:`ProtocolError` with a ``kind``, which receivers count and drop.

On tcp every socket also speaks ZeroMQ CURVE with keys made per run (:class:`CurveKeys`), so a
socket that does not hold the run's server key cannot even connect.
"""

from __future__ import annotations

import hmac
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack
import numpy as np
import zmq

LINGER_MS = 2000
# A file name that is not valid UTF-8 is a str with surrogate escapes in Python (os.listdir);
# strings travel with them, so such a name reaches every process, and the file, byte for byte.
NAME_ERRORS = "surrogateescape"
IPC_PATH_MAX_BYTES = 103  # sun_path is 104 bytes on macOS, 108 on Linux, NUL included
ARRAYS_KEY = "arrays"
ARRAY_KINDS = frozenset("biufc")
TOKEN_BYTES = 16


class ProtocolError(RuntimeError):
    """A received message does not follow the format; ``kind`` names what was wrong."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Limits:
    """What one received message may hold; sized per socket (frames, reports)."""

    header_bytes: int = 1 << 20
    parts: int = 8  # token, header and arrays (envelope excluded)
    array_bytes: int = 64 << 20
    str_len: int = 1 << 16
    bin_len: int = 1 << 16
    array_len: int = 1 << 17  # elements of one msgpack array
    map_len: int = 1 << 12  # keys of one msgpack map


FRAME_LIMITS = Limits()
REPORT_LIMITS = Limits(header_bytes=64 << 20, parts=4, array_bytes=1 << 20, str_len=1 << 20, array_len=1 << 20)


@dataclass(frozen=True)
class CurveKeys:
    """ZeroMQ CURVE keys of one run (z85 bytes): bound sockets are servers with the server key
    pair; connecting sockets make their own pair and need only the server's public key."""

    server_public: bytes
    server_secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> CurveKeys:
        if not zmq.has("curve"):
            raise RuntimeError("expected libzmq with CURVE support for the tcp transport, got none")
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


@dataclass
class Message:
    """A received message.

    ``header`` is the sender's header, without the ``"arrays"`` key; ``arrays`` are
    read-only numpy views over the received frames (copy one before writing to it, and note
    that they may be unaligned); ``envelope`` holds the routing frames; ``nbytes`` counts
    header and array bytes, envelope and token excluded.
    """

    header: dict
    arrays: list[np.ndarray]
    envelope: list[bytes]
    nbytes: int


def send_message(
    socket: zmq.Socket,
    header: dict,
    arrays: Sequence[np.ndarray] = (),
    *,
    token: bytes,
    envelope: Sequence[bytes] = (),
    flags: int = 0,
) -> int:
    """Send ``header`` and ``arrays`` as one multipart message; returns bytes sent.

    Arrays are sent zero-copy: the caller must not modify an array after sending it, since
    ZeroMQ may still be reading its memory. Non-contiguous arrays are copied to contiguous
    ones first. Only bool, integer, float and complex dtypes are accepted. ``envelope``
    frames (e.g. a ROUTER peer's identity) go first and are not counted in the result.
    """
    if not isinstance(header, dict):
        raise ValueError(f"expected header to be a dict, got {type(header).__name__}")
    if ARRAYS_KEY in header:
        raise ValueError(
            f"expected a header without the reserved key {ARRAYS_KEY!r}, got keys {sorted(map(str, header))}"
        )
    payloads = []
    layout = []
    for position, array in enumerate(arrays):
        if not isinstance(array, np.ndarray):
            raise ValueError(f"expected arrays[{position}] to be a numpy array, got {type(array).__name__}")
        if array.dtype.kind not in ARRAY_KINDS:
            raise ValueError(
                f"expected arrays[{position}] to have a bool/int/float/complex dtype, got {array.dtype}"
            )
        layout.append([array.dtype.str, list(array.shape)])
        payloads.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
    packed = msgpack.packb({**header, ARRAYS_KEY: layout}, use_bin_type=True, unicode_errors=NAME_ERRORS)
    socket.send_multipart([*envelope, token, packed, *payloads], flags=flags, copy=False)
    return len(packed) + sum(payload.nbytes for payload in payloads)


def plain_dtype(text: object, kinds: frozenset[str] | str) -> np.dtype | None:
    """The numpy dtype a received string names, if it is short and of one of ``kinds``; None for
    anything else. np.dtype raises TypeError, ValueError or even SyntaxError on strings a peer
    may send (``","``, ``"(1,)("``), and accepts structured and subarray types, which are refused."""
    if not isinstance(text, str) or len(text) > 8:
        return None
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        return None
    return dtype if dtype.kind in kinds and dtype.subdtype is None and dtype.names is None else None


def _array_from_frame(frame: zmq.Frame, spec: object, position: int, limits: Limits) -> np.ndarray:
    if not isinstance(spec, (list, tuple)) or len(spec) != 2:
        raise ProtocolError("arrays", f"expected arrays[{position}] to be [dtype, shape], got {spec!r}")
    dtype_str, shape = spec
    dtype = plain_dtype(dtype_str, ARRAY_KINDS)
    if dtype is None:
        raise ProtocolError("arrays", f"expected arrays[{position}] dtype to be a short bool/int/float/complex "
                                      f"numpy dtype string, got {dtype_str!r}")
    if not isinstance(shape, (list, tuple)) or len(shape) > 8 or not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**40 for n in shape
    ):
        raise ProtocolError("arrays", f"expected arrays[{position}] shape to be up to 8 ints >= 0, got {shape!r}")
    buffer = frame.buffer
    expected = math.prod(shape) * dtype.itemsize
    if expected > limits.array_bytes:
        raise ProtocolError("arrays", f"expected arrays[{position}] of at most {limits.array_bytes} bytes, "
                                      f"got {expected}")
    if len(buffer) != expected:
        raise ProtocolError("arrays", f"expected {expected} bytes for arrays[{position}] ({dtype_str}, "
                                      f"{list(shape)}), got a frame of {len(buffer)} bytes")
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    array.flags.writeable = False  # zmq frame buffers are writable memoryviews; the frame is shared
    return array


def _receive_parts(socket: zmq.Socket, flags: int, max_parts: int) -> list[zmq.Frame]:
    """The parts of one message, reading no more than ``max_parts`` into Python objects."""
    parts = [socket.recv(flags=flags, copy=False)]
    while parts[-1].more:
        if len(parts) >= max_parts:
            extra = 0
            while socket.getsockopt(zmq.RCVMORE):  # the rest of the message must still be read
                socket.recv(copy=False)
                extra += 1
            raise ProtocolError("parts", f"expected at most {max_parts} message parts, got {max_parts + extra}")
        parts.append(socket.recv(copy=False))
    return parts


def _unpack_header(raw: bytes, limits: Limits) -> dict:
    if len(raw) > limits.header_bytes:
        raise ProtocolError("header-size", f"expected a header of at most {limits.header_bytes} bytes, got {len(raw)}")
    try:
        header = msgpack.unpackb(raw, raw=False, unicode_errors=NAME_ERRORS, strict_map_key=True,
                                 max_str_len=limits.str_len,
                                 max_bin_len=limits.bin_len, max_array_len=limits.array_len,
                                 max_map_len=limits.map_len, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise ProtocolError("msgpack", f"expected a msgpack header frame, got {len(raw)} undecodable bytes "
                                       f"({error})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header-type", f"expected the header to be a msgpack map, got {type(header).__name__}")
    return header


def recv_message(
    socket: zmq.Socket, *, token: bytes, routed: bool = False, limits: Limits = FRAME_LIMITS, flags: int = 0
) -> Message:
    """Receive one message sent by :func:`send_message` with the same ``token``.

    With ``routed=True`` the first frame is taken as the envelope (a ROUTER socket's peer
    identity). Arrays are read-only views over the received frames, not copies.
    Raises :class:`ProtocolError` if the message is malformed or not from this run; the whole
    message has been read off the socket either way.
    """
    frames = _receive_parts(socket, flags, limits.parts + (1 if routed else 0))
    envelope = [frames[0].bytes] if routed else []
    body = frames[1:] if routed else frames
    if len(body) < 2:
        raise ProtocolError("parts", f"expected a token and a header frame after {len(envelope)} envelope "
                                     f"frame(s), got {len(body)} frame(s)")
    if not hmac.compare_digest(body[0].bytes, token):
        raise ProtocolError("token", "expected the run's token as the first frame, got other bytes")
    raw = body[1].bytes
    header = _unpack_header(raw, limits)
    layout = header.pop(ARRAYS_KEY, None)
    if not isinstance(layout, list):
        raise ProtocolError("arrays", f"expected header key {ARRAYS_KEY!r} to be a list, got {type(layout).__name__}")
    if len(layout) != len(body) - 2:
        raise ProtocolError("arrays", f"expected {len(layout)} array frame(s) as the header lists, "
                                      f"got {len(body) - 2}")
    arrays = [_array_from_frame(frame, spec, i, limits) for i, (frame, spec) in enumerate(zip(body[2:], layout))]
    return Message(header, arrays, envelope, len(raw) + sum(a.nbytes for a in arrays))


class DropCounter:
    """Counts messages dropped as malformed, per kind, and logs each kind once."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.counts: dict[str, int] = {}

    def note(self, error: ProtocolError, where: str) -> None:
        key = f"{where}:{error.kind}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] == 1:
            self.log.warning("dropped a bad message on %s (%s): %s; further ones of this kind are only counted",
                             where, error.kind, error)


def make_socket(
    ctx: zmq.Context,
    kind: int,
    *,
    linger_ms: int = LINGER_MS,
    sndhwm: int | None = None,
    rcvhwm: int | None = None,
    identity: bytes | None = None,
    max_message_bytes: int | None = None,
    curve: CurveKeys | None = None,
    curve_server: bool = False,
) -> zmq.Socket:
    """A new socket of type ``kind`` with LINGER, high-water marks, identity, the largest
    message part it accepts, and CURVE security when ``curve`` is given.

    Set ``identity`` on a DEALER (or REQ) that talks to a ROUTER: it must be set before
    connecting, which is why it is set here. With ``curve``, a socket that binds must pass
    ``curve_server=True``; one that connects makes its own key pair.
    """
    if linger_ms < -1:
        raise ValueError(f"expected linger_ms >= -1 (-1 waits forever), got {linger_ms}")
    for option, value in (("sndhwm", sndhwm), ("rcvhwm", rcvhwm)):
        if value is not None and value < 0:
            raise ValueError(f"expected {option} >= 0 (0 means no limit), got {value}")
    if identity is not None and (
        not isinstance(identity, bytes) or not 1 <= len(identity) <= 255 or identity[:1] == b"\0"
    ):
        raise ValueError(
            f"expected identity to be 1-255 bytes not starting with a zero byte, got {identity!r}"
        )
    socket = ctx.socket(kind)
    try:
        socket.setsockopt(zmq.LINGER, linger_ms)
        if sndhwm is not None:
            socket.setsockopt(zmq.SNDHWM, sndhwm)
        if rcvhwm is not None:
            socket.setsockopt(zmq.RCVHWM, rcvhwm)
        if identity is not None:
            socket.setsockopt(zmq.IDENTITY, identity)
        if max_message_bytes is not None:
            socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # a peer sending more is disconnected
        if curve is not None:
            _set_curve(socket, curve, curve_server)
    except zmq.ZMQError:
        socket.close(linger=0)
        raise
    return socket


def _set_curve(socket: zmq.Socket, keys: CurveKeys, server: bool) -> None:
    if server:
        socket.curve_secretkey = keys.server_secret
        socket.curve_publickey = keys.server_public
        socket.curve_server = True
        return
    public, secret = zmq.curve_keypair()
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = keys.server_public


def ipc_endpoint(directory: str, name: str) -> str:
    """``ipc://{directory}/{name}.ipc``, checked against the unix socket path limit."""
    if not name or "/" in name:
        raise ValueError(f"expected an endpoint name without '/', got {name!r}")
    path = f"{directory.rstrip('/')}/{name}.ipc"
    size = len(os.fsencode(path))
    if size > IPC_PATH_MAX_BYTES:
        raise ValueError(
            f"expected an ipc socket path of at most {IPC_PATH_MAX_BYTES} bytes (unix socket "
            f"limit), got {size} bytes: {path!r}; use a shorter directory"
        )
    return f"ipc://{path}"


def check_endpoint(endpoint: str) -> str:
    """Return ``endpoint`` if it is ``ipc://PATH`` or ``tcp://HOST:PORT``, else raise.

    PORT is 1-65535, or ``*`` for an ephemeral port when binding.
    """
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if host and (port == "*" or (port.isdigit() and 1 <= int(port) <= 65535)):
            return endpoint
    raise ValueError(f"expected an endpoint 'ipc://PATH' or 'tcp://HOST:PORT', got {endpoint!r}")
