"""Which frame of its share a preprocess worker holds, kept in a tiny file beside the run's
shared-memory segments, where the runner reads it after the worker died. A frame that kills its
reader twice in a row is then failed with the reason, not read a third time (each read would
cost a restart, and the run would abort when they ran out). The file goes with the run's
segments (workers.slots.remove_segments)."""

from __future__ import annotations

import os
import struct

from workers.slots import SHM_DIR, segment_name

NOTHING = -1  # no frame in hand: waiting for credit or input
_FORMAT = "<q"  # one signed 64-bit position


def in_hand_path(run_tag: str, name: str, directory: str = SHM_DIR) -> str:
    return os.path.join(directory, segment_name(run_tag, f"{name}-hand", 0))


class InHand:
    """The writer's side: a pwrite of 8 bytes per frame (the page cache keeps it when the process
    dies; nothing needs to reach the disk)."""

    def __init__(self, run_tag: str, name: str, directory: str = SHM_DIR):
        self._fd = os.open(in_hand_path(run_tag, name, directory), os.O_RDWR | os.O_CREAT, 0o600)
        self.hold(NOTHING)

    def hold(self, position: int) -> None:
        os.pwrite(self._fd, struct.pack(_FORMAT, position), 0)

    def close(self) -> None:
        os.close(self._fd)


def read_in_hand(run_tag: str, name: str, directory: str = SHM_DIR) -> int | None:
    """The position the worker ``name`` held when it last wrote; None for none or no file."""
    try:
        with open(in_hand_path(run_tag, name, directory), "rb") as marker:
            data = marker.read(struct.calcsize(_FORMAT))
    except OSError:
        return None
    if len(data) != struct.calcsize(_FORMAT):
        return None
    position = struct.unpack(_FORMAT, data)[0]
    return position if position >= 0 else None
