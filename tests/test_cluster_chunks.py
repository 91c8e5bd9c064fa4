"""The cluster's work queue and chunk sizes (cluster/chunks.py), and a simulated run of the
driver's hand-out rule: nodes of unequal speed, each chunk paying a start-up."""

from __future__ import annotations

import heapq

from cluster.chunks import FIRST_CHUNK_FRAMES, Unit, WorkQueue, chunk_frames, units_of


def synthetic_units(count: int) -> list[Unit]:
    return [Unit(i, 1, "", f"synthetic/{i:05d}.jpg") for i in range(count)]


def test_a_first_chunk_is_small_then_sizes_follow_speed_and_shrink_at_the_end():
    assert chunk_frames(1000, None, 0.5, 20) == FIRST_CHUNK_FRAMES
    assert chunk_frames(3, None, 0.5, 20) == 3
    assert chunk_frames(100_000, 10.0, 0.5, 20) == 200  # at most chunk_s of work
    assert chunk_frames(100_000, 20.0, 0.5, 20) == 2 * chunk_frames(100_000, 10.0, 0.5, 20)
    assert chunk_frames(200, 10.0, 0.5, 20) == 50  # a quarter of chunk_s at the end, not less
    assert chunk_frames(7, 10.0, 0.5, 20) == 7


def test_every_unit_goes_out_once_and_a_returned_chunk_goes_out_first_whole():
    queue = WorkQueue(synthetic_units(30), chunk_s=1)
    first = queue.take(None, 0.5)
    second = queue.take(5.0, 0.5)
    queue.hand_back(first)
    assert queue.take(5.0, 0.5) == first
    rest = []
    while queue:
        rest.append(queue.take(5.0, 0.5))
    ids = [u.first_id for c in (first, second, *rest) for u in c.units]
    assert sorted(ids) == list(range(30))


def test_units_of_a_file_plan_carry_each_items_first_id():
    class Item:
        def __init__(self, location, name):
            self.location, self.name = location, name

    class Plan:
        items = (Item("/a/clip.mp4", "clip.mp4"), Item("/a/b.jpg", "b.jpg"))
        lengths = (5, 1)
        total = 6

    units = units_of(Plan(), synthetic=False)
    assert [(u.first_id, u.frames, u.name) for u in units] == [(0, 5, "clip.mp4"), (5, 1, "b.jpg")]


def simulate(fps: dict[str, float], frames: int, start_s: float, chunk_s: float) -> dict[str, tuple[int, float]]:
    """The driver's rule on nodes of known speed: (frames, finish time) per node."""
    queue = WorkQueue(synthetic_units(frames), chunk_s)
    measured: dict[str, float | None] = {name: None for name in fps}
    done = {name: (0, 0.0) for name in fps}
    events = [(0.0, name) for name in sorted(fps)]
    while events:
        now, name = heapq.heappop(events)
        if not queue:
            continue
        known = [v for v in measured.values() if v]
        mean = sum(known) / len(known) if known else 1.0
        speed = {n: measured[n] or mean for n in fps}
        chunk = queue.take(measured[name], speed[name] / sum(speed.values()))
        finish = now + start_s + chunk.frames / fps[name]
        measured[name] = fps[name]
        done[name] = (done[name][0] + chunk.frames, finish)
        heapq.heappush(events, (finish, name))
    return done


def test_a_node_twice_as_fast_gets_about_twice_the_frames_and_they_finish_together():
    done = simulate({"fast": 40.0, "slow": 20.0}, frames=12_000, start_s=8.0, chunk_s=20.0)
    (fast, fast_end), (slow, slow_end) = done["fast"], done["slow"]
    assert fast + slow == 12_000
    assert 1.6 < fast / slow < 2.4
    assert abs(fast_end - slow_end) < 20.0  # within one chunk of each other
