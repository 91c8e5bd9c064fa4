"""Frames by reference: pixels cross process boundaries in shared memory, messages carry slot ids.

A producer owns a :class:`SlotRing`: one file in ``/dev/shm`` split into equal slots. To send a
frame it takes a free slot, copies the frame's arrays into it and puts their references (segment,
slot, offset, dtype, shape) in the message header; the slot is lent to the frame until the last
reader sends a release naming the slot and the frame id. A consumer reads the arrays through
:class:`SlotViews`, which maps a segment once and checks every reference against the run's
segment names and the segment's size. Who lends and who returns stays explicit, as in PyTorch's
DataLoader workers or Ray's object store: the owner alone reuses a slot, and only for a release
that names the frame the slot was lent to. Each slot starts with a stamp, the id of the frame it
is lent to (-1 when free), so a reader handed a reference again after the slot went back (a
frame sent again because its reader died after releasing it) can tell its pixels are gone.

An array too big for a slot (a source frame larger than planned), and every array on a transport
that crosses hosts (tcp), travels as bytes in the message instead: its reference is
``{"inline": k}``, the k-th array of the message. Stages never compute offsets themselves.

Segment names start with ``yolo-pipeline-<runner pid>-``, so a runner can remove what a killed
run left behind (:func:`remove_stale_segments`) and its own leftovers at exit.
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import re
import tempfile
from collections.abc import Sequence

import numpy as np

from wire.ipc_dirs import pid_alive
from wire.transport import plain_dtype

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
SEGMENT_PREFIX = "yolo-pipeline-"
ALIGN_BYTES = 64
MAX_MAPPED_SEGMENTS = 64  # a consumer keeps this many producers' segments mapped
MAX_DIM = 1 << 40  # largest dimension or offset a reference may name
STAMP_BYTES = ALIGN_BYTES  # a slot's first bytes: the int64 id of the frame it is lent to, -1 when free
FREE_STAMP = -1
_NAME_PART = re.compile(r"^[A-Za-z0-9_.-]+$")


class SlotError(RuntimeError):
    """A slot reference that does not name a valid region of this run's shared memory."""


def segment_name(run_tag: str, owner: str, incarnation: int) -> str:
    """``yolo-pipeline-<run_tag>-<owner>-<incarnation>``; run_tag starts with the runner's pid."""
    name = f"{SEGMENT_PREFIX}{run_tag}-{owner}-{incarnation}"
    if not _NAME_PART.match(name):
        raise ValueError(f"expected a segment name of letters, digits, '_', '.', '-', got {name!r}")
    return name


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the alignment every array in a slot starts on."""
    return (nbytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def free_bytes(directory: str = SHM_DIR) -> int:
    """Bytes free for new segments in ``directory`` (a tmpfs: Docker's /dev/shm is 64 MB)."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def _map_file(path: str, size: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            # fallocate, not ftruncate: a tmpfs too small for the ring fails here with ENOSPC, where a
            # sparse file would kill the process with SIGBUS at the first write past the free space
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError:
                os.unlink(path)
                raise
        else:
            size = os.fstat(fd).st_size
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def ring_slot_bytes(slot_bytes: int) -> int:
    """The bytes a ring gives each slot with room for ``slot_bytes`` of arrays: its stamp, and the room aligned."""
    return STAMP_BYTES + aligned(slot_bytes)


class SlotRing:
    """The owner's side: ``count`` slots with room for ``slot_bytes`` of arrays each (after the
    slot's stamp) in the file ``directory/name``."""

    def __init__(self, name: str, slot_bytes: int, count: int, directory: str = SHM_DIR):
        if slot_bytes <= 0 or count <= 0:
            raise ValueError(f"expected slot_bytes > 0 and count > 0, got {slot_bytes} and {count}")
        self.name = name
        self.slot_bytes = ring_slot_bytes(slot_bytes)
        self.count = count
        self.path = os.path.join(directory, name)
        self._map = _map_file(self.path, self.slot_bytes * count, create=True)
        self._stamps = np.ndarray((count,), np.int64, buffer=self._map, strides=(self.slot_bytes,))
        self._stamps[:] = FREE_STAMP
        self._free: collections.deque[int] = collections.deque(range(count))
        self._lent: dict[int, int] = {}  # slot -> the frame id it is lent to
        self.inline_arrays = 0  # arrays that did not fit a slot and went as bytes

    def free_slots(self) -> int:
        return len(self._free)

    def acquire(self, frame_id: int) -> int | None:
        """A free slot, now lent to ``frame_id``; None when every slot is lent."""
        if not self._free:
            return None
        slot = self._free.popleft()
        self._lent[slot] = frame_id
        self._stamps[slot] = frame_id
        return slot

    def store(self, slot: int, arrays: Sequence[np.ndarray]) -> tuple[list[dict], list[np.ndarray]]:
        """Copy ``arrays`` into ``slot`` (which the caller acquired); returns their references and
        the arrays that must travel in the message (those that did not fit), in order."""
        refs, places = self.reserve(slot, [(array.shape, array.dtype) for array in arrays])
        inline = []
        for ref, place, array in zip(refs, places, arrays):
            if "inline" in ref:
                inline.append(array)
            else:
                np.copyto(place, array, casting="no")
        return refs, inline

    def reserve(self, slot: int, specs: Sequence[tuple[tuple[int, ...], np.dtype]]
                ) -> tuple[list[dict], list[np.ndarray]]:
        """Room in ``slot`` (which the caller acquired) for arrays of these ``(shape, dtype)``, for
        the caller to write in place (no copy): their references, and per array its view of the
        slot, or, for one that does not fit, a new array that travels in the message
        (``{"inline": k}``: the k-th of those, in order)."""
        if self._lent.get(slot) is None:
            raise ValueError(f"expected a lent slot, got slot {slot} which is free")
        refs, places = [], []
        offset, inlined = STAMP_BYTES, 0
        for shape, dtype in specs:
            dtype = np.dtype(dtype)
            nbytes = aligned(math.prod(shape) * dtype.itemsize)
            if offset + nbytes > self.slot_bytes:
                refs.append({"inline": inlined})
                places.append(np.empty(shape, dtype))
                inlined += 1
                self.inline_arrays += 1
                continue
            start = slot * self.slot_bytes + offset
            places.append(np.ndarray(shape, dtype, buffer=self._map, offset=start))
            refs.append({"seg": self.name, "slot": slot, "off": start, "dtype": dtype.str, "shape": list(shape),
                         "stamp": slot * self.slot_bytes})
            offset += nbytes
        return refs, places

    def release(self, slot: int, frame_id: int) -> bool:
        """Return ``slot`` if it is lent to ``frame_id``; False (nothing changes) otherwise: a
        release for an earlier lending, or from a stranger, must not free a slot in use."""
        if self._lent.get(slot) != frame_id:
            return False
        del self._lent[slot]
        self._stamps[slot] = FREE_STAMP
        self._free.append(slot)
        return True

    def release_frame(self, frame_id: int) -> bool:
        """Return the slot lent to ``frame_id``, if any (a frame that failed before sending)."""
        for slot, lent_to in self._lent.items():
            if lent_to == frame_id:
                return self.release(slot, frame_id)
        return False

    def close(self, unlink: bool = True) -> None:
        """Unmap, and remove the file unless ``unlink`` is False: a stage that finishes while
        readers may still map its slots leaves the file to the runner, which removes every
        segment of the run when the run ends. Mappings already made stay valid either way."""
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._stamps = None
        try:
            self._map.close()
        except BufferError:  # numpy views over the map are still alive; unmapped when they go
            pass


class SlotViews:
    """A consumer's side: read (or write) arrays that references name, in segments of this run."""

    def __init__(self, run_tag: str, directory: str = SHM_DIR):
        self.prefix = f"{SEGMENT_PREFIX}{run_tag}-"
        self.directory = directory
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()

    def arrays(self, refs: Sequence[dict], inline: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self.array(ref, inline) for ref in refs]

    def array(self, ref: dict, inline: Sequence[np.ndarray] = ()) -> np.ndarray:
        """The array ``ref`` names: a view into shared memory, or ``inline[k]`` for an inline one."""
        if not isinstance(ref, dict):
            raise SlotError(f"expected a slot reference dict, got {type(ref).__name__}")
        if "inline" in ref:
            k = ref["inline"]
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(inline):
                raise SlotError(f"expected an inline index in [0, {len(inline)}), got {k!r}")
            return inline[k]
        seg, off, dtype, shape = ref.get("seg"), ref.get("off"), ref.get("dtype"), ref.get("shape")
        self._check_segment(seg)
        dtype = plain_dtype(dtype, "biuf")
        if dtype is None:
            raise SlotError(f"expected a numeric dtype in slot reference, got {ref.get('dtype')!r}")
        if not isinstance(shape, list) or len(shape) > 4 or not all(_is_size(n) for n in shape):
            raise SlotError(f"expected a shape of up to 4 ints in [0, {MAX_DIM}), got {shape!r}")
        mapped = self._mapped(seg)
        nbytes = math.prod(shape) * dtype.itemsize
        if not _is_size(off) or off % ALIGN_BYTES or off + nbytes > len(mapped):
            raise SlotError(f"expected offset and size inside segment {seg} ({len(mapped)} bytes), "
                            f"got offset {off!r} and {nbytes} bytes")
        return np.ndarray(shape, dtype, buffer=mapped, offset=off)

    def still_lent_to(self, ref: dict, frame_id: int) -> bool:
        """Whether the slot ``ref`` names is still lent to ``frame_id`` (its stamp); True for an
        inline array, which no one else can reuse. False means the slot went back to its owner,
        and may hold another frame's pixels by now."""
        if not isinstance(ref, dict) or "inline" in ref:
            return True
        seg, stamp, off = ref.get("seg"), ref.get("stamp"), ref.get("off")
        self._check_segment(seg)
        mapped = self._mapped(seg)
        if not _is_size(stamp) or stamp % ALIGN_BYTES or stamp + 8 > len(mapped) or not (_is_size(off) and stamp < off):
            raise SlotError(f"expected a slot stamp's offset inside the segment, before the array's, got {stamp!r}")
        return int(np.ndarray((), np.int64, buffer=mapped, offset=stamp)) == frame_id

    def _check_segment(self, seg) -> None:
        if not isinstance(seg, str) or not seg.startswith(self.prefix) or not _NAME_PART.match(seg):
            raise SlotError(f"expected a segment of this run ({self.prefix}...), got {seg!r}")

    def _mapped(self, seg: str) -> mmap.mmap:
        mapped = self._maps.get(seg)
        if mapped is not None:
            self._maps.move_to_end(seg)
            return mapped
        try:
            mapped = _map_file(os.path.join(self.directory, seg), 0, create=False)
        except (FileNotFoundError, ValueError, OSError) as exc:
            raise SlotError(f"cannot map shared-memory segment {seg}: {exc}") from None
        self._maps[seg] = mapped
        if len(self._maps) > MAX_MAPPED_SEGMENTS:
            _, oldest = self._maps.popitem(last=False)
            _close_quietly(oldest)
        return mapped

    def close(self) -> None:
        for mapped in self._maps.values():
            _close_quietly(mapped)
        self._maps.clear()


def _is_size(n: object) -> bool:
    """An int numpy takes as a dimension or offset (a zero elsewhere in a shape lets a huge one
    pass the size check, and numpy refuses it with a TypeError)."""
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_DIM


def _close_quietly(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:  # arrays over it are still referenced; it is unmapped when they go
        pass


def remove_segments(run_tag: str, directory: str = SHM_DIR) -> list[str]:
    """Remove every segment of one run (after it ended, however it ended); returns their names."""
    prefix = f"{SEGMENT_PREFIX}{run_tag}-"
    removed = []
    for name in _segment_files(directory):
        if name.startswith(prefix):
            _unlink_quietly(os.path.join(directory, name))
            removed.append(name)
    return removed


def remove_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Remove segments of runs whose runner process is gone (a killed run leaves them)."""
    removed = []
    for name in _segment_files(directory):
        pid_text = name[len(SEGMENT_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            _unlink_quietly(os.path.join(directory, name))
            removed.append(name)
    return removed


def _segment_files(directory: str) -> list[str]:
    try:
        return [n for n in os.listdir(directory) if n.startswith(SEGMENT_PREFIX)]
    except OSError:
        return []


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
