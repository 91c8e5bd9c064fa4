"""The work of a cluster run: units, the queue of those no node has yet, and how far ahead of a
node its feed runs.

A finite frame plan is a sequence of units: one per item of the source (an image, a video, a
broken entry; its frames are contiguous global frame ids) or one per synthetic frame. A node's
pipeline reads a feed (inputs/feed.py); the driver keeps in it what the node's pipeline holds in
flight plus ``lead_s`` seconds of its measured work, and no more: a node that goes faster
finishes its feed sooner and is given more, and at the end each node has at most that lead left.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from inputs.feed import FeedEntry
from inputs.kinds import input_kind

FIRST_LEAD_PER_READER = 4  # frames per preprocess worker beyond its pipeline's depth, before its speed is known


@dataclass(frozen=True)
class Unit:
    """One item of the plan, or the rest of a video (``start`` frames of it done elsewhere)."""

    first_id: int
    frames: int
    kind: str  # "image", "video", "broken" or "synthetic"
    location: str  # "" for a synthetic frame
    name: str  # the item's name in the run's outputs
    item: int  # its index in the driver's plan
    start: int = 0
    reason: str = ""

    @property
    def ids(self) -> range:
        return range(self.first_id, self.first_id + self.frames)

    def entry(self) -> FeedEntry:
        scene = self.first_id if input_kind(self.kind).numbered_by_item else 0  # a synthetic scene: its id
        return FeedEntry(self.kind, self.location, self.name, self.frames, self.item, self.start, scene, self.reason,
                         self.first_id)

    def rest(self, done: set[int]) -> Unit | None:
        """What of this unit comes after its last frame in ``done``, or None. A reader goes
        through a unit in order, so what it never read is a tail; a frame missing before that
        (a report that does not account for it) is left for the ledger to show, not run twice."""
        last = max((i for i in self.ids if i in done), default=self.first_id - 1)
        skipped = last + 1 - self.first_id
        if skipped >= self.frames:
            return None
        return Unit(last + 1, self.frames - skipped, self.kind, self.location, self.name, self.item,
                    self.start + skipped, self.reason)


def undone_parts(unit: Unit, done: set[int]) -> list[Unit]:
    """The parts of ``unit`` holding its frames not in ``done``, each a unit of its own (the
    frames of a video between two done stretches keep their place in it)."""
    parts, first = [], None
    for frame_id in [*unit.ids, unit.first_id + unit.frames]:
        if frame_id < unit.first_id + unit.frames and frame_id not in done:
            first = frame_id if first is None else first
        elif first is not None:
            parts.append(Unit(first, frame_id - first, unit.kind, unit.location, unit.name, unit.item,
                              unit.start + first - unit.first_id, unit.reason))
            first = None
    return parts


def continued_videos(fed: list[Unit], unread: list[Unit]) -> list[Unit]:
    """The videos of which a runner fed ``fed`` read a part and left the rest (in ``unread``)."""
    starts = {unit.first_id for unit in fed}
    return [unit for unit in unread if unit.kind == "video" and unit.first_id not in starts]


def units_of(plan, synthetic: bool) -> list[Unit]:
    """The plan's units (a finite plan: a stream is one node's and has no place here)."""
    if synthetic:
        return [Unit(i, 1, "synthetic", "", f"synthetic/{i:05d}.jpg", i) for i in range(plan.total)]
    units, first = [], 0
    for index, (item, length) in enumerate(zip(plan.items, plan.lengths)):
        if length:
            units.append(Unit(first, length, item.kind, item.location, item.name, index, reason=item.reason))
        first += length
    return units


class WorkQueue:
    """Units no node has: never handed out, or handed back (their node died) ahead of the rest."""

    def __init__(self, units: list[Unit]):
        self.units = deque(units)

    def __bool__(self) -> bool:
        return bool(self.units)

    def take(self, frames: int) -> list[Unit]:
        """Units from the front holding about ``frames`` frames (at least one unit)."""
        taken = [self.units.popleft()]
        count = taken[0].frames
        while self.units and count + self.units[0].frames <= frames:
            count += self.units[0].frames
            taken.append(self.units.popleft())
        return taken

    def hand_back(self, units: list[Unit]) -> None:
        self.units.extendleft(reversed(units))

    def drain(self) -> list[Unit]:
        left = list(self.units)
        self.units.clear()
        return left


def lead_frames(fps: float | None, depth: int, readers: int, lead_s: float) -> int:
    """Frames a node's feed should hold beyond what it finished: its pipeline's depth (the frames
    its rings hold in flight) plus ``lead_s`` seconds at its measured ``fps`` (a few frames per
    reader while that is unknown)."""
    ahead = fps * lead_s if fps else FIRST_LEAD_PER_READER * readers
    return depth + max(readers, math.ceil(ahead))


def pipeline_depth(config: dict) -> int:
    """About how many frames a pipeline of these settings holds in flight when it runs flat out:
    each inference worker's credit and the batch it forms, each postprocess worker's prefetch,
    and a frame being made by each reader."""
    batches = config["batch_size"] * (config["prefetch"] + 1)
    return config["infer_workers"] * batches + config["post_workers"] * config["prefetch"] + 2 * config["pre_workers"]
