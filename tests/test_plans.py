import numpy as np
import pytest

from inputs.plans import FramePlan, SourceItem, plan_lengths


def plan_of(spec: str, frames: int | None = None) -> FramePlan:
    """A plan from a spec without files: 'i' an image, 'b' a broken entry, 'vN' a video of N
    frames, 's' a live stream."""
    items = []
    for n, token in enumerate(spec.split()):
        if token[0] == "v":
            items.append(SourceItem("video", f"/v{n}.mp4", f"v{n}.mp4", int(token[1:])))
        elif token == "s":
            items.append(SourceItem("stream", str(n), f"camera{n}", None))
        else:
            items.append(SourceItem("image" if token == "i" else "broken", f"/{n}.jpg", f"{n}.jpg", 1))
    lengths, total = plan_lengths(items, frames)
    return FramePlan("spec", tuple(items), tuple(lengths), total)


SPECS = ["i", "i i i i i i i", "v30", "v7 i i i v20 b i", "i v5 v5 v5 i i", "v3 v300 i " * 3, "i s i s s v4",
         "s", "i " * 50]


FINITE_PLANS = [(spec, frames) for spec in SPECS for frames in (None, 1, 64, 301) if frames or "s" not in spec.split()]


@pytest.mark.parametrize("spec, frames", FINITE_PLANS)
@pytest.mark.parametrize("workers", [1, 2, 3, 5, 16])
def test_worker_ids_partition_the_plan(spec, frames, workers):
    plan = plan_of(spec, frames)
    shares = [plan.worker_ids(w, workers) for w in range(workers)]
    assert sorted(i for share in shares for i in share) == list(range(plan.total))
    assignment = plan.assignment(workers)
    for worker, share in enumerate(shares):
        refs = [plan.ref(i) for i in share]
        assert all(assignment[r.item] in (worker, -1) for r in refs)
        finite = [r.frame_id for r in refs if r.kind != "stream"]
        assert finite == sorted(finite) and share[:len(finite)] == finite  # non-live ids first, ascending
        for item in {r.item for r in refs if r.kind in ("video", "stream")}:
            mine = [(r.cycle, r.index) for r in refs if r.item == item]
            assert mine == sorted(mine)  # a video or stream is read in order, by this worker alone
            assert assignment[item] == worker


def test_images_only_round_robin_as_before():
    for total in (1, 7, 64, 101):
        plan = plan_of("i i i i i", frames=total)
        for workers in (1, 2, 3, 8):
            for worker in range(workers):
                assert plan.worker_ids(worker, workers) == list(range(worker, total, workers))


def test_videos_whole_and_balanced():
    plan = plan_of("v100 v60 v50 v10 " + "i " * 40)
    assert plan.assignment(2)[:4] == (0, 1, 1, 0)  # longest first, each to the lightest worker
    loads = [len(plan.worker_ids(w, 2)) for w in range(2)]
    assert loads == [130, 130]  # images even out the video frames
    plan = plan_of("v90 i i i i i i")
    assert [len(plan.worker_ids(w, 3)) for w in range(3)] == [90, 3, 3]


def test_live_streams_spread_first_and_alternate():
    plan = plan_of("i s v8 s s", frames=19)  # 10 live frames: 4, 3, 3
    assert plan.lengths == (1, 4, 8, 3, 3)
    assert plan.assignment(2) == (-1, 0, 0, 1, 1)  # streams first, longest first; the video to fewer streams
    share = plan.worker_ids(1, 2)
    live = [(plan.ref(i).item, plan.ref(i).index) for i in share if plan.ref(i).kind == "stream"]
    assert live == [(3, 0), (4, 0), (3, 1), (4, 1), (3, 2), (4, 2)]


def test_open_ended_ids():
    plan = plan_of("i i s v3 s")
    assert plan.open_ended and plan.pass_len == 5
    shares = [plan.worker_ids(w, 2) for w in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(5))
    assert plan.worker_streams(0, 2) == (2,) and plan.worker_streams(1, 2) == (4,)
    assert [plan.open_stream_id(1, 2, k) for k in range(3)] == [6, 8, 10]
    with pytest.raises(IndexError, match="given when read"):
        plan.ref(5)
    with pytest.raises(ValueError, match="open-ended"):
        plan_of("s", frames=3).open_stream_id(0, 1, 0)


@pytest.mark.parametrize("worker, workers", [(0, 0), (-1, 2), (2, 2), (0, 1.5), (True, 2)])
def test_worker_ids_rejects_bad_arguments(worker, workers):
    with pytest.raises(ValueError, match="expected worker"):
        plan_of("i i i i").worker_ids(worker, workers)


def test_worker_ids_of_a_large_plan_are_balanced():
    plan = plan_of("v500 " + "i " * 1500, frames=200_000)  # the video holds a quarter of the frames
    shares = [plan.worker_ids(w, 4) for w in range(4)]
    assert list(map(len, shares)) == [50_000] * 4
    assert all(plan.ref(i).kind == "video" for i in shares[0])
    assert np.unique(np.concatenate(shares)).size == 200_000
