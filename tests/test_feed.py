"""A feed source (inputs/feed.py): frames written while the run goes on, one file per reader."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import cv2
import numpy as np
import pytest

from inputs.feed import END, FEED_PREFIX, FeedEntry, FeedReader, FeedWaiting, feed_path
from inputs.frames import FrameReadError
from inputs.reader import open_share
from inputs.sources import plan_frames
from supervisor.prepare import plan_source
from tests.media import grey_level, write_video
from settings.config import ConfigError, RunConfig


def make_feed(tmp_path, readers: int = 1):
    folder = tmp_path / "feed"
    folder.mkdir()
    for reader in range(readers):
        open(feed_path(str(folder), reader), "wb").close()
    return folder, plan_frames(FEED_PREFIX + str(folder))


def append(folder, reader: int, data: bytes) -> None:
    with open(feed_path(str(folder), reader), "ab") as f:
        f.write(data)


def test_a_feed_plans_one_open_ended_live_item_per_file_and_needs_its_first_file(tmp_path):
    folder, plan = make_feed(tmp_path, readers=3)
    assert plan.open_ended and [item.kind for item in plan.items] == ["feed"] * 3
    assert [plan.worker_streams(w, 3) for w in range(3)] == [(0,), (1,), (2,)]
    with pytest.raises(ValueError, match="0.jsonl"):
        plan_frames(FEED_PREFIX + str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="--pre-workers 3"):
        open_share(plan, 0, 2)


def test_frames_come_as_lines_arrive_with_the_writers_names_and_the_open_ended_ids(tmp_path):
    folder, plan = make_feed(tmp_path, readers=2)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.full((20, 30, 3), 7, np.uint8))
    with closing(open_share(plan, 1, 2)) as reader:
        assert isinstance(reader, FeedReader)  # the feed kind's own reader
        with pytest.raises(FeedWaiting):
            reader.next()
        append(folder, 1, FeedEntry("image", str(image), "x/a.png", 1, 4).line())
        line = FeedEntry("synthetic", "", "synthetic/00009.jpg", 1, 9, scene=9).line()
        append(folder, 1, line[:10])  # a line being written is not read half
        frame = reader.next()
        assert (frame.ref.frame_id, frame.ref.name, frame.image.shape) == (1, "x/a.png", (20, 30, 3))
        with pytest.raises(FeedWaiting):
            reader.next()
        append(folder, 1, line[10:] + FeedEntry("broken", "/gone.jpg", "gone.jpg", 1, 10, reason="cannot decode").line())
        synthetic = reader.next()
        assert (synthetic.ref.frame_id, synthetic.ref.name, synthetic.ref.source_index) == (3, "synthetic/00009.jpg", 9)
        with pytest.raises(FrameReadError, match="cannot decode") as failed:
            reader.next()
        assert failed.value.ref.frame_id == 5 and reader.position == 3
        append(folder, 1, END)
        assert reader.next() is None and reader.next() is None


def test_a_video_entry_yields_its_frames_from_its_start_and_a_restart_resumes(tmp_path):
    folder, plan = make_feed(tmp_path)
    clip = write_video(tmp_path / "clip.mp4", 6)
    append(folder, 0, FeedEntry("video", str(clip), "clip.mp4", 4, 2, start=2).line()
           + FeedEntry("image", "/missing.jpg", "missing.jpg", 1, 3).line() + END)
    with closing(open_share(plan)) as reader:
        frames = [reader.next() for _ in range(2)]
    assert [f.ref.name for f in frames] == ["clip.mp4:000003", "clip.mp4:000004"]
    assert [grey_level(f.image) for f in frames] == [2, 3]  # frame i of the test video is grey i
    assert frames[0].ref.item == 2 and [f.ref.index for f in frames] == [0, 1]  # a video of its own
    with closing(open_share(plan, start=2)) as restarted:  # a successor of a reader that handed on two frames
        third = restarted.next()
        assert (third.ref.frame_id, third.ref.name) == (2, "clip.mp4:000005")
        restarted.next()
        with pytest.raises(FrameReadError):
            restarted.next()
        assert restarted.next() is None


def test_a_bad_line_or_entry_is_refused_by_name():
    with pytest.raises(ValueError, match="feed line"):
        FeedEntry.parse(b"not json")
    with pytest.raises(ValueError, match="kind"):
        FeedEntry("stream", "0", "camera0", 1, 0)
    with pytest.raises(ValueError, match="frames"):
        FeedEntry("image", "/a.jpg", "a.jpg", 0, 0)
    assert FeedEntry.parse(END) is None
    entry = FeedEntry("video", "/v.mp4", "v.mp4", 3, 1, start=2)
    assert FeedEntry.parse(entry.line()) == entry


def test_a_run_on_a_feed_needs_a_reader_per_file():
    with tempfile.TemporaryDirectory() as folder:
        for reader in range(2):
            open(feed_path(folder, reader), "wb").close()
        with pytest.raises(ConfigError, match="--pre-workers 2"):
            plan_source(RunConfig(source=FEED_PREFIX + folder, pre_workers=1))
        assert plan_source(RunConfig(source=FEED_PREFIX + folder, pre_workers=2)).open_ended


def test_a_pipeline_reads_its_feed_as_it_is_written_and_ends_at_the_end_lines(tmp_path):
    """The runner waits on an empty feed, takes lines written later,
    names the outputs as the lines do, and ends when every file has its end line."""
    folder, _plan = make_feed(tmp_path, readers=2)
    clip = write_video(tmp_path / "clip.mp4", 12)
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(repo / "runner.py"), "--source", FEED_PREFIX + str(folder),
                             "--pre-workers", "2", "--workers", "1", "--preset", "none", "--imgsz", "64",
                             "--results", str(tmp_path / "results"), "--name", "run", "--json", "--no-progress",
                             "--save-images", "all"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for first in (0, 6):
            for i in range(first, first + 6):
                append(folder, i % 2, FeedEntry("synthetic", "", f"s/{i:03d}.jpg", 1, i, scene=i).line())
            time.sleep(1.0)
        # the rest of a video another node left (its frames 3..12): a video of its own here, kept
        # whole (more frames than reader 0's ring has slots: a writer waiting for frame 1 stalls)
        append(folder, 0, FeedEntry("video", str(clip), "clip.mp4", 10, 99, start=2).line())
        for reader in range(2):
            append(folder, reader, END)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # a failed test: SIGTERM drains and removes the run's shared memory
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out)["processed"] == 22
    run_dir = tmp_path / "results" / "run"
    report = json.loads((run_dir / "report.json").read_text())
    ids = [i for first, last in report["frames"]["processed_ids"] for i in range(first, last + 1)]
    assert ids == sorted({2 * k for k in range(16)} | {2 * k + 1 for k in range(6)})  # reader w's k-th: 2k + w
    assert sorted(p.name for p in (run_dir / "images" / "s").iterdir()) == [f"{i:03d}.jpg" for i in range(12)]
    assert [(v["video"], v["frames"]) for v in report["sources"]["videos"]] == [("videos/clip.mp4", 10)], report["sources"]


def test_a_process_that_writes_feed_lines_knows_the_registered_kinds():
    """A cluster node's actor writes lines naming any finite registered kind (an image in object
    storage): the module that writes them loads the registry, which tells the feed (a fresh
    interpreter, as a Ray worker is)."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT
    code = ("import cluster.node\nfrom inputs.feed import FeedEntry\n"
            "FeedEntry('stored', 's3://b/a.jpg', 'a.jpg', 1, 0)\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_feed_line_tells_the_frames_run_wide_number_that_save_images_counts(tmp_path):
    """A cluster node is fed frames 10, 11, 12 and 30 of the run: --save-images 3 keeps the run's
    every third (12 and 30), not every third of the node's own ids."""
    from types import SimpleNamespace

    from workers.preprocess import _read_next
    folder, plan = make_feed(tmp_path)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    for first_id in (10, 11, 12, 30):
        append(folder, 0, FeedEntry("image", str(image), f"f{first_id}.png", 1, first_id, first_id=first_id).line())
    append(folder, 0, FeedEntry("image", str(image), "mine.png", 1, 99).line() + END)  # no run-wide id: its own
    cfg = RunConfig(save_images="3", imgsz=64)
    kept = {}

    class Slots:
        def prepare(self, frame, t_read, cfg, keep, pre, releaser):
            kept[frame.ref.name] = (frame.ref.save_number, keep)
            return {}, []
    args = SimpleNamespace(poison_position=-1, name="pre-0")
    with closing(open_share(plan, 0, 1)) as reader:
        for _ in range(5):
            _read_next(reader, Slots(), cfg, args, None, None, [], SimpleNamespace(on_frames=lambda names: None))
    assert kept == {"f10.png": (10, False), "f11.png": (11, False), "f12.png": (12, True), "f30.png": (30, True),
                    "mine.png": (-1, False)}  # its own id here is 4
    with pytest.raises(ValueError, match="first_id"):
        FeedEntry("image", "/a.jpg", "a.jpg", 1, 0, first_id=-2)
