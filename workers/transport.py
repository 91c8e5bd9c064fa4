"""The wire format between pipeline processes, and socket set-up.

Every message is one multipart ZeroMQ message::

    [envelope frames ...] [msgpack header: dict] [array 0 bytes] [array 1 bytes] ...

The header carries ``"arrays": [[dtype_str, shape], ...]`` describing the raw frames that
follow, so arrays travel without pickling and are rebuilt as numpy views on the receiver.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import numpy as np
import zmq

LINGER_MS = 2000
IPC_PATH_MAX_BYTES = 103  # sun_path is 104 bytes on macOS, 108 on Linux, NUL included
ARRAYS_KEY = "arrays"
ARRAY_KINDS = frozenset("biufc")


class ProtocolError(RuntimeError):
    """A received message does not follow the header-plus-arrays format."""


@dataclass
class Message:
    """A received message.

    ``header`` is the sender's header, without the ``"arrays"`` key; ``arrays`` are
    read-only numpy views over the received frames (copy one before writing to it, and note
    that they may be unaligned); ``envelope`` holds the routing frames; ``nbytes`` counts
    header and array bytes, envelope excluded.
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
    packed = msgpack.packb({**header, ARRAYS_KEY: layout}, use_bin_type=True)
    socket.send_multipart([*envelope, packed, *payloads], flags=flags, copy=False)
    return len(packed) + sum(payload.nbytes for payload in payloads)


def _array_from_frame(frame: zmq.Frame, spec: object, position: int) -> np.ndarray:
    if not isinstance(spec, (list, tuple)) or len(spec) != 2:
        raise ProtocolError(f"expected arrays[{position}] to be [dtype, shape], got {spec!r}")
    dtype_str, shape = spec
    try:
        dtype = np.dtype(dtype_str)
    except TypeError as error:
        raise ProtocolError(
            f"expected arrays[{position}] dtype to be a numpy dtype, got {dtype_str!r}"
        ) from error
    if dtype.kind not in ARRAY_KINDS:
        raise ProtocolError(
            f"expected arrays[{position}] dtype to be bool/int/float/complex, got {dtype_str!r}"
        )
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ProtocolError(f"expected arrays[{position}] shape to be a list of ints >= 0, got {shape!r}")
    buffer = frame.buffer
    expected = math.prod(shape) * dtype.itemsize
    if len(buffer) != expected:
        raise ProtocolError(
            f"expected {expected} bytes for arrays[{position}] ({dtype_str}, {list(shape)}), "
            f"got a frame of {len(buffer)} bytes"
        )
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    array.flags.writeable = False  # zmq frame buffers are writable memoryviews; the frame is shared
    return array


def recv_message(socket: zmq.Socket, *, routed: bool = False, flags: int = 0) -> Message:
    """Receive one message sent by :func:`send_message`.

    With ``routed=True`` the first frame is taken as the envelope (a ROUTER socket's peer
    identity). Arrays are read-only views over the received frames, not copies.
    Raises :class:`ProtocolError` if the message is malformed.
    """
    frames = socket.recv_multipart(flags=flags, copy=False)
    envelope = [frames[0].bytes] if routed else []
    body = frames[1:] if routed else frames
    if not body:
        raise ProtocolError(f"expected a header frame after {len(envelope)} envelope frame(s), got none")
    raw = body[0].bytes
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise ProtocolError(
            f"expected a msgpack header frame, got {len(raw)} undecodable bytes ({error})"
        ) from error
    if not isinstance(header, dict):
        raise ProtocolError(f"expected the header to be a msgpack map, got {type(header).__name__}")
    layout = header.pop(ARRAYS_KEY, None)
    if not isinstance(layout, list):
        raise ProtocolError(f"expected header key {ARRAYS_KEY!r} to be a list, got {layout!r}")
    if len(layout) != len(body) - 1:
        raise ProtocolError(f"expected {len(layout)} array frame(s) as the header lists, got {len(body) - 1}")
    arrays = [_array_from_frame(frame, spec, i) for i, (frame, spec) in enumerate(zip(body[1:], layout))]
    return Message(header, arrays, envelope, len(raw) + sum(a.nbytes for a in arrays))


def make_socket(
    ctx: zmq.Context,
    kind: int,
    *,
    linger_ms: int = LINGER_MS,
    sndhwm: int | None = None,
    rcvhwm: int | None = None,
    identity: bytes | None = None,
) -> zmq.Socket:
    """A new socket of type ``kind`` with LINGER, high-water marks and identity set.

    Set ``identity`` on a DEALER (or REQ) that talks to a ROUTER: it must be set before
    connecting, which is why it is set here.
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
    except zmq.ZMQError:
        socket.close(linger=0)
        raise
    return socket


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
