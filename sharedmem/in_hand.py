"""What a worker holds, kept in a tiny file beside the run's shared-memory segments, where the
runner reads it after the worker died: a preprocess worker the position in its share of the frame
it reads, an inference worker the ids of the batch it runs, a postprocess worker the id of the
frame it finishes. A frame that kills its worker twice is then failed with the reason, not handed
to a worker a third time (each try would cost a restart, and the run would abort when they ran
out). The file goes with the run's segments (sharedmem.slots.remove_segments)."""

from __future__ import annotations

import os
import struct

from sharedmem.slots import SHM_DIR, segment_name

NOTHING = -1  # no frame in hand: waiting for credit or input
_COUNT = "<q"  # how many values follow, each a signed 64-bit position or frame id


def in_hand_path(run_tag: str, name: str, directory: str = SHM_DIR) -> str:
    return os.path.join(directory, segment_name(run_tag, f"{name}-hand", 0))


class InHand:
    """The writer's side: one pwrite of a few bytes per frame or batch (the page cache keeps it
    when the process dies; nothing needs to reach the disk). The count is written with the values
    in one call, so a reader never sees a count with the values of another write."""

    def __init__(self, run_tag: str, name: str, directory: str = SHM_DIR):
        self._fd = os.open(in_hand_path(run_tag, name, directory), os.O_RDWR | os.O_CREAT, 0o600)
        self.hold(NOTHING)

    def hold(self, *values: int) -> None:
        """Hold ``values`` (a position, or frame ids); ``hold(NOTHING)`` or ``hold()``: nothing."""
        values = tuple(v for v in values if v != NOTHING)
        os.pwrite(self._fd, struct.pack(f"<{len(values) + 1}q", len(values), *values), 0)

    def close(self) -> None:
        os.close(self._fd)


def read_held(run_tag: str, name: str, directory: str = SHM_DIR) -> tuple[int, ...]:
    """The values the worker ``name`` held when it last wrote; () for none or no file."""
    try:
        with open(in_hand_path(run_tag, name, directory), "rb") as marker:
            data = marker.read()
    except OSError:
        return ()
    size = struct.calcsize(_COUNT)
    count = struct.unpack_from(_COUNT, data)[0] if len(data) >= size else 0
    if count <= 0 or len(data) < size * (count + 1):
        return ()
    return tuple(v for v in struct.unpack_from(f"<{count}q", data, size) if v >= 0)


def read_in_hand(run_tag: str, name: str, directory: str = SHM_DIR) -> int | None:
    """The position (or first id) the worker ``name`` held when it last wrote; None for none or no file."""
    held = read_held(run_tag, name, directory)
    return held[0] if held else None


def poison_named(notice: dict, role: str) -> dict[int, str | None]:
    """{frame id: reason} of the frames a peer-gone notice names as having killed a worker of
    ``role`` twice: failed by whichever worker of that stage they reach next, not processed; and
    {frame id: None} of those a worker died holding once: suspects, each run alone in a batch of
    its own, so that if one kills again it alone is named."""
    if notice["name"].rsplit("-", 1)[0] != role or not isinstance(notice.get("poison"), list):
        return {}
    return {pair[0]: pair[1] for pair in notice["poison"] if isinstance(pair, list) and len(pair) == 2
            and isinstance(pair[0], int) and not isinstance(pair[0], bool) and isinstance(pair[1], (str, type(None)))}
