"""The work of a cluster run cut into chunks, and how large each next chunk is.

A finite frame plan is a sequence of units: one per item of the source (an image, a video, a
broken entry; its frames are contiguous frame ids), or one per synthetic frame. A chunk is a
contiguous run of units, so its frames are contiguous global ids and a chunk's own run (ids
from 0) maps back by adding ``first_id``.

Chunk sizes follow guided self-scheduling weighted by speed: a node takes its share of what is
left divided by two (so chunks shrink at the end and nodes finish together), at most what it
does in ``chunk_s`` seconds and at least a quarter of that (each chunk pays one runner start,
seconds of imports), and a small first chunk while its speed is unknown.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass

from inputs.streams import is_url

FIRST_CHUNK_FRAMES = 8  # a node's first chunk, small, to measure its speed
SMALLEST_CHUNK_SHARE = 0.25  # chunks shrink at the end down to this share of chunk_s: each pays a runner start


@dataclass(frozen=True)
class Unit:
    """One item of the plan (``location`` for the chunk's list file) or one synthetic frame."""

    first_id: int
    frames: int
    location: str  # "" for a synthetic frame
    name: str  # the driver's name of the item (the run's names, as a normal run writes them)


@dataclass(frozen=True)
class Chunk:
    """Consecutive units handed to one node in one runner process."""

    index: int
    units: tuple[Unit, ...]

    @property
    def first_id(self) -> int:
        return self.units[0].first_id

    @property
    def frames(self) -> int:
        return sum(u.frames for u in self.units)

    @property
    def synthetic(self) -> bool:
        return not self.units[0].location

    def list_text(self) -> str:
        """The chunk's ``.txt`` source: one absolute path or URL per line."""
        return "".join(u.location + "\n" for u in self.units)

    def name_map(self) -> dict[str, str]:
        """Each unit's name in the chunk's own run -> its name in the merged run, without the
        extension (label and crop files are named from the stem)."""
        if self.synthetic:
            return {f"synthetic/{i:05d}": f"synthetic/{u.first_id:05d}" for i, u in enumerate(self.units)}
        return {os.path.splitext(local_name(u.location))[0]: os.path.splitext(u.name)[0] for u in self.units}


def local_name(location: str) -> str:
    """The name a chunk's run gives an item of its list: the list lives in a private folder, so a
    path is outside it and keeps its absolute form without the leading separator
    (inputs.sources._relative_name); a URL is named as in the driver's plan."""
    if is_url(location):
        from inputs.streams import url_name
        return url_name(location)
    return os.path.abspath(location).lstrip(os.sep)


def units_of(plan, synthetic: bool) -> list[Unit]:
    """The plan's units; a stream (open-ended or not) has no place in a chunk."""
    if synthetic:
        return [Unit(i, 1, "", f"synthetic/{i:05d}.jpg") for i in range(plan.total)]
    offsets = [0]
    for length in plan.lengths:
        offsets.append(offsets[-1] + length)
    return [Unit(first, length, item.location, item.name)
            for item, first, length in zip(plan.items, offsets, plan.lengths) if length]


class WorkQueue:
    """Units not yet handed out, and chunks handed back (their node died) that go out first, whole."""

    def __init__(self, units: list[Unit], chunk_s: float):
        self.units = deque(units)
        self.returned: deque[Chunk] = deque()
        self.chunk_s = chunk_s
        self.next_index = 0

    @property
    def frames_left(self) -> int:
        return sum(u.frames for u in self.units) + sum(c.frames for c in self.returned)

    def __bool__(self) -> bool:
        return bool(self.units or self.returned)

    def hand_back(self, chunk: Chunk) -> None:
        self.returned.append(chunk)

    def take(self, fps: float | None, share: float) -> Chunk:
        """The next chunk for a node running at ``fps`` (None: not measured yet) that does
        ``share`` of the alive nodes' work."""
        if self.returned:
            return self.returned.popleft()
        want = chunk_frames(self.frames_left, fps, share, self.chunk_s)
        units = [self.units.popleft()]
        while self.units and sum(u.frames for u in units) + self.units[0].frames <= want:
            units.append(self.units.popleft())
        chunk = Chunk(self.next_index, tuple(units))
        self.next_index += 1
        return chunk

    def drain(self) -> list[Unit]:
        """Every unit never run: the returned chunks' and those never handed out."""
        left = [u for c in self.returned for u in c.units] + list(self.units)
        self.units.clear()
        self.returned.clear()
        return left


def chunk_frames(left: int, fps: float | None, share: float, chunk_s: float) -> int:
    """Frames for the next chunk (at least 1): a first small chunk while the speed is unknown;
    then the node's share of half of what is left, between a quarter of ``chunk_s`` seconds of
    its work and ``chunk_s`` seconds."""
    if fps is None or fps <= 0:
        return max(1, min(FIRST_CHUNK_FRAMES, left))
    guided = max(math.ceil(left * share / 2), math.ceil(fps * chunk_s * SMALLEST_CHUNK_SHARE))
    return max(1, min(guided, math.ceil(fps * chunk_s), left))
