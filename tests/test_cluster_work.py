"""The cluster's units, work queue and feed lead (cluster/work.py), and a simulated run of the
driver's rule: nodes of unequal speed, each fed its depth plus a lead of its measured work."""

from __future__ import annotations

from cluster.work import FIRST_LEAD_PER_READER, Unit, WorkQueue, lead_frames, pipeline_depth, units_of


def synthetic_units(count: int) -> list[Unit]:
    return [Unit(i, 1, "synthetic", "", f"synthetic/{i:05d}.jpg", i) for i in range(count)]


def test_units_of_a_file_plan_carry_each_items_first_id_and_kind():
    class Item:
        def __init__(self, kind, location, name, reason=""):
            self.kind, self.location, self.name, self.reason = kind, location, name, reason

    class Plan:
        items = (Item("video", "/a/clip.mp4", "clip.mp4"), Item("broken", "/a/x.jpg", "x.jpg", "cannot decode"),
                 Item("image", "/a/b.jpg", "b.jpg"))
        lengths = (5, 1, 1)
        total = 7

    units = units_of(Plan(), synthetic=False)
    assert [(u.first_id, u.frames, u.kind, u.name, u.item) for u in units] == [
        (0, 5, "video", "clip.mp4", 0), (5, 1, "broken", "x.jpg", 1), (6, 1, "image", "b.jpg", 2)]
    assert units[1].entry().reason == "cannot decode"
    assert [u.entry().scene for u in units_of(type("P", (), {"total": 3})(), synthetic=True)] == [0, 1, 2]


def test_the_queue_hands_out_about_the_frames_asked_and_takes_units_back_first():
    queue = WorkQueue(synthetic_units(30))
    first = queue.take(4)
    assert [u.first_id for u in first] == [0, 1, 2, 3]
    second = queue.take(0)
    assert [u.first_id for u in second] == [4]  # at least one unit
    queue.hand_back(first)
    assert [u.first_id for u in queue.take(2)] == [0, 1]
    rest = queue.drain()
    assert [u.first_id for u in rest] == [2, 3] + list(range(5, 30)) and not queue


def test_a_video_that_was_partly_read_goes_back_as_its_rest():
    video = Unit(10, 6, "video", "/a/clip.mp4", "clip.mp4", 3, start=2)
    assert video.rest(set()) == video
    assert video.rest(set(range(10, 16))) is None
    rest = video.rest({10, 11})
    assert (rest.first_id, rest.frames, rest.start, rest.name) == (12, 4, 4, "clip.mp4")
    assert rest.entry().start == 4 and rest.entry().frames == 4
    assert video.rest({11}).first_id == 12, "a frame done after a gap: only the tail runs again"


def test_the_lead_is_the_pipelines_depth_plus_seconds_of_measured_work():
    config = {"batch_size": 1, "prefetch": 2, "infer_workers": 2, "post_workers": 1, "pre_workers": 2}
    depth = pipeline_depth(config)
    assert depth == 2 * 3 + 2 + 4
    assert lead_frames(None, depth, 2, 1.0) == depth + FIRST_LEAD_PER_READER * 2
    assert lead_frames(100.0, depth, 2, 1.0) == depth + 100
    assert lead_frames(100.0, depth, 2, 2.0) == depth + 200
    assert lead_frames(0.5, depth, 2, 1.0) == depth + 2  # a frame per reader at least


def simulate(fps: dict[str, float], frames: int, lead_s: float, poll_s: float = 0.25, start_s: float = 5.0,
             depth: int = 8) -> dict[str, tuple[int, float]]:
    """The driver's rule on nodes of known, steady speed, polled every ``poll_s``: (frames done,
    the time the last finished) per node. A runner starts ``start_s`` after its first feed."""
    queue = WorkQueue(synthetic_units(frames))
    fed = {name: 0 for name in fps}
    last = {name: 0.0 for name in fps}
    now = 0.0
    while True:
        busy = False
        for name, speed in fps.items():
            done = min(fed[name], max(0.0, (now - start_s) * speed))
            measured = speed if now - start_s > 1.0 else None
            short = lead_frames(measured, depth, 1, lead_s) - (fed[name] - int(done))
            if queue and short > 0:
                fed[name] += sum(u.frames for u in queue.take(short))
                last[name] = start_s + fed[name] / speed
            busy = busy or done < fed[name]
        if not queue and not busy:
            return {name: (fed[name], last[name]) for name in fps}
        now += poll_s


def test_a_node_twice_as_fast_gets_about_twice_the_frames_and_they_finish_within_a_lead():
    done = simulate({"fast": 40.0, "slow": 20.0}, frames=6_000, lead_s=1.0)
    (fast, fast_end), (slow, slow_end) = done["fast"], done["slow"]
    assert fast + slow == 6_000
    assert 1.9 < fast / slow < 2.1
    assert abs(fast_end - slow_end) < 1.0 + 8 / 20 + 0.25  # the lead, the depth at the slow pace, a poll
