"""Frame slots in shared memory: lend, read by reference, release, refuse what is not ours."""

import os
import subprocess
import sys

import numpy as np
import pytest

from wire.ipc_dirs import IPC_DIR_PREFIX, remove_stale_ipc_dirs
from sharedmem.slots import (SEGMENT_PREFIX, SlotError, SlotRing, SlotViews, remove_segments, remove_stale_segments,
                           segment_name)

TAG = f"{os.getpid()}-test"


@pytest.fixture
def ring(tmp_path):
    r = SlotRing(segment_name(TAG, "pre-0", 0), slot_bytes=4096, count=3, directory=str(tmp_path))
    yield r
    r.close()


@pytest.fixture
def views(tmp_path):
    v = SlotViews(TAG, directory=str(tmp_path))
    yield v
    v.close()


def test_arrays_travel_by_reference(ring, views):
    image = np.arange(3 * 10 * 12, dtype=np.uint8).reshape(3, 10, 12)
    boxes = np.linspace(0, 1, 12, dtype=np.float32).reshape(2, 6)
    slot = ring.acquire(frame_id=7)
    refs, inline = ring.store(slot, [image, boxes])
    assert inline == [] and all(r["seg"] == ring.name and r["slot"] == slot for r in refs)
    assert all(r["off"] % 64 == 0 for r in refs)
    got = views.arrays(refs, inline)
    np.testing.assert_array_equal(got[0], image)
    np.testing.assert_array_equal(got[1], boxes)
    assert got[0].dtype == np.uint8 and got[1].dtype == np.float32


def test_an_array_larger_than_a_slot_goes_inline(ring, views):
    small = np.ones((3, 4, 4), np.uint8)
    big = np.full((100, 100), 5, np.uint8)  # 10 kB > 4 kB slot
    slot = ring.acquire(frame_id=1)
    refs, inline = ring.store(slot, [small, big])
    assert "seg" in refs[0] and refs[1] == {"inline": 0} and inline[0] is big
    assert ring.inline_arrays == 1
    np.testing.assert_array_equal(views.array(refs[1], inline), big)


def test_room_reserved_in_a_slot_is_written_in_place_and_read_by_reference(ring, views):
    slot = ring.acquire(frame_id=4)
    refs, places = ring.reserve(slot, [((3, 8, 8), np.uint8), ((100, 100), np.uint8), ((2, 6), np.float32)])
    assert "seg" in refs[0] and refs[1] == {"inline": 0} and "seg" in refs[2]  # the big one alone does not fit
    places[0][:] = 9
    places[1][:] = 5
    places[2][:] = 0.5
    np.testing.assert_array_equal(views.array(refs[0]), np.full((3, 8, 8), 9, np.uint8))
    np.testing.assert_array_equal(views.array(refs[1], [places[1]]), np.full((100, 100), 5, np.uint8))
    np.testing.assert_array_equal(views.array(refs[2]), np.full((2, 6), 0.5, np.float32))
    with pytest.raises(ValueError, match="expected a lent slot"):
        ring.reserve(ring.acquire(frame_id=5) + 1, [((1,), np.uint8)])


def test_slots_return_only_for_the_frame_they_were_lent_to(ring):
    slots = [ring.acquire(frame_id=i) for i in range(3)]
    assert ring.acquire(frame_id=99) is None and ring.free_slots() == 0
    assert not ring.release(slots[0], frame_id=5)  # a stale or forged release
    assert ring.free_slots() == 0
    assert ring.release(slots[0], frame_id=0)
    assert not ring.release(slots[0], frame_id=0)  # twice is once
    assert ring.release_frame(2) and ring.free_slots() == 2
    assert ring.acquire(frame_id=10) is not None


@pytest.mark.parametrize("ref, match", [
    ({"seg": "yolo-pipeline-999-other-pre-0-0", "off": 0, "dtype": "|u1", "shape": [1]}, "this run"),
    ({"seg": f"{SEGMENT_PREFIX}{TAG}-../../etc/passwd", "off": 0, "dtype": "|u1", "shape": [1]}, "this run"),
    ({"seg": "SEG", "off": 64 * 1000, "dtype": "|u1", "shape": [10]}, "inside segment"),
    ({"seg": "SEG", "off": 3, "dtype": "|u1", "shape": [10]}, "inside segment"),
    ({"seg": "SEG", "off": 0, "dtype": "|O", "shape": [1]}, "numeric dtype"),
    ({"seg": "SEG", "off": 0, "dtype": "|u1", "shape": [-1]}, "shape"),
    ({"inline": 3}, "inline index"),
    ("not a dict", "dict"),
])
def test_bad_references_are_refused(ring, views, ref, match):
    if isinstance(ref, dict) and ref.get("seg") == "SEG":
        ref = {**ref, "seg": ring.name}
    with pytest.raises(SlotError, match=match):
        views.array(ref, [])


def test_a_consumer_keeps_reading_after_the_owner_closed(tmp_path, views):
    ring = SlotRing(segment_name(TAG, "pre-1", 0), 4096, 2, directory=str(tmp_path))
    refs, _ = ring.store(ring.acquire(0), [np.full((8,), 9, np.uint8)])
    first = views.array(refs[0])
    ring.close()
    assert not os.path.exists(ring.path)
    assert first.tolist() == [9] * 8  # mapped before the owner went: still valid


def test_removing_a_runs_segments_and_those_of_dead_runners(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = SlotRing(segment_name(f"{dead_pid}-x", "pre-0", 0), 64, 1, directory=str(tmp_path))
    mine = SlotRing(segment_name(TAG, "pre-0", 0), 64, 1, directory=str(tmp_path))
    other = tmp_path / "unrelated-file"
    other.write_text("keep")
    assert remove_stale_segments(str(tmp_path)) == [stale.name]
    assert os.path.exists(mine.path) and other.exists()
    assert remove_segments(TAG, str(tmp_path)) == [mine.name]
    assert not os.path.exists(mine.path) and other.exists()
    stale.close()
    mine.close()


def test_ipc_folders_of_runners_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{IPC_DIR_PREFIX}{gone.pid}-abc"
    mine = tmp_path / f"{IPC_DIR_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{IPC_DIR_PREFIX}notapid"
    for folder in (stale, mine, other):
        folder.mkdir()
    (stale / "collector").write_text("a socket file once")
    assert remove_stale_ipc_dirs(str(tmp_path)) == [stale.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])


def test_a_slot_stamp_says_whether_it_is_still_lent_to_the_frame(ring, views):
    """A frame sent again after its last reader gave the slot back must not read another frame's
    pixels: the slot's stamp names the frame it is lent to."""
    slot = ring.acquire(frame_id=11)
    refs, _ = ring.store(slot, [np.ones((3, 4, 4), np.uint8)])
    assert views.still_lent_to(refs[0], 11) and not views.still_lent_to(refs[0], 12)
    assert ring.release(slot, frame_id=11)
    assert not views.still_lent_to(refs[0], 11)  # given back
    reused_by = next(20 + k for k in range(ring.count) if ring.acquire(frame_id=20 + k) == slot)  # another frame's now
    assert not views.still_lent_to(refs[0], 11) and views.still_lent_to(refs[0], reused_by)
    assert views.still_lent_to({"inline": 0}, 11)  # nobody reuses a message's own bytes
    for bad in ({**refs[0], "stamp": 3}, {**refs[0], "stamp": 1 << 30}, {k: v for k, v in refs[0].items() if k != "stamp"},
                {**refs[0], "stamp": refs[0]["off"]},
                {**refs[0], "seg": "yolo-pipeline-999-x-pre-0-0"}):
        with pytest.raises(SlotError):
            views.still_lent_to(bad, 11)
