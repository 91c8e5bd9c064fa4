"""Frames whose file names are not valid UTF-8 travel byte for byte (surrogate escapes) and are
shown safely; a frame that keeps killing its reader is failed with its reason."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from analysis.printable import printable
from tests.conftest import fixture_path
from tests.live_run import SMALL_RUN
from process.faults import TEST_CRASH_ENV
from sharedmem.in_hand import NOTHING, InHand, poison_named, read_held, read_in_hand

pytestmark = pytest.mark.slow

BAD_NAME = b"bad\xff\xfename.jpg"


def test_printable_shows_bytes_that_are_not_utf8_and_keeps_the_rest():
    assert printable(os.fsdecode(BAD_NAME) + " ü") == "bad\\xff\\xfename.jpg ü"
    assert printable("lone \ud800") == "lone \\ud800"


def test_a_file_name_that_is_not_utf8_is_carried_byte_for_byte_and_shown_safely(live, tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    shutil.copy(fixture_path("zidane.jpg"), folder / "ok.jpg")
    shutil.copy(fixture_path("zidane.jpg"), os.path.join(os.fsencode(folder), BAD_NAME))
    with open(os.path.join(os.fsencode(folder), b"broken\xff.jpg"), "wb") as f:
        f.write(b"not a jpeg")  # a failed frame: its name goes into report.md and onto the terminal
    run = live(*SMALL_RUN, "--preset", "none", "--source", str(folder), "--allow-failures")
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert report["frames"]["processed"] == 2 and report["frames"]["failed"] == 1 and not report["restarts"]
    (failure,) = report["frames"]["failures"]
    assert os.fsencode(failure["name"]).startswith(b"broken\xff")  # lossless in report.json
    assert "broken\\xff.jpg" in run.stderr(), run.stderr()
    saved = [os.fsencode(p.name) for p in (run.run_dir / "images").iterdir()]
    assert any(b"bad\xff\xfename" in name for name in saved), saved  # the bytes of the name, not a lookalike
    assert "broken\\xff.jpg" in (run.run_dir / "report.md").read_text(encoding="utf-8")
    json.loads((run.run_dir / "detections.json").read_text(encoding="ascii"))
    assert "Traceback" not in run.stderr() and "Logging error" not in run.stderr() + run.log()
    run.assert_clean()


def test_in_hand_keeps_a_position_or_a_batch_of_ids_for_the_runner(tmp_path):
    hand = InHand("tag", "infer-0", str(tmp_path))
    assert read_held("tag", "infer-0", str(tmp_path)) == () and read_in_hand("tag", "infer-0", str(tmp_path)) is None
    hand.hold(4, 5, 6)
    hand.hold(9)  # a shorter write after a longer one: the count says where it ends
    assert read_held("tag", "infer-0", str(tmp_path)) == (9,) and read_in_hand("tag", "infer-0", str(tmp_path)) == 9
    hand.hold(NOTHING)
    assert read_held("tag", "infer-0", str(tmp_path)) == ()
    hand.close()
    assert read_held("tag", "post-0", str(tmp_path)) == ()  # no file


def test_poison_frames_of_a_notice_go_to_the_workers_of_its_stage_only():
    notice = {"name": "infer-1", "poison": [[7, "infer-1 died twice holding it"], ["x", "y"], [True, "z"], [8]]}
    assert poison_named(notice, "infer") == {7: "infer-1 died twice holding it"}
    assert poison_named(notice, "post") == {} and poison_named({"name": "infer-0"}, "infer") == {}


def test_a_frame_that_kills_its_reader_twice_is_failed_with_the_reason_not_read_again(live, tmp_path):
    """pre-0 dies on poison.jpg (as in a decoder crash), is restarted, dies on it again: the next
    incarnation fails that frame with the reason and goes on; the other frames are processed and
    the run ends with restarts to spare (exit 3: one frame failed), not an abort."""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg", "poison.jpg", "c.jpg", "d.jpg"):
        shutil.copy(fixture_path("zidane.jpg"), folder / name)
    run = live(*SMALL_RUN, "--preset", "none", "--source", str(folder), "--save-images", "none",
               env={TEST_CRASH_ENV: "poison"})
    assert run.wait() == 3, run.stderr()
    report = run.report()
    assert report["frames"]["processed"] == 4 and report["frames"]["failed"] == 1, report["frames"]
    (failure,) = report["frames"]["failures"]
    assert failure["name"] == "poison.jpg" and failure["stage"] == "pre"
    assert failure["reason"].startswith("pre-0 died twice reading it (pre-0 exited with code 70"), failure
    assert [r["name"] for r in report["restarts"]] == ["pre-0", "pre-0"]
    assert "died twice holding the same frame" in run.log()
    run.assert_clean()


@pytest.mark.parametrize("stage, flags", [("infer", ()), ("infer", ("--batch-size", "4", "--max-wait-ms", "3000")),
                                          ("post", ())])
def test_a_frame_that_kills_an_inference_or_postprocess_worker_twice_is_failed_with_the_reason(live, tmp_path, stage,
                                                                                                 flags):
    """infer-0 (or post-0) dies on poison.jpg every time (a model or NMS crash): after the first
    restart the frame is sent to the new incarnation, which dies too; the runner then names the
    frame (each worker keeps the ids it holds in a tiny file) and the next incarnation fails it
    with the reason instead of running it. The other frames are processed, 2 restarts of 3 used,
    exit 3 (one frame failed), not an abort when the restarts run out. In batches of 4 (waiting
    for 4 frames), the frames held at the first death run alone next time: only the one that
    kills is failed, not the 3 batched with it."""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg", "c_poison.jpg", "d.jpg", "e.jpg"):  # read in this order: a batch of 4 holds it
        shutil.copy(fixture_path("zidane.jpg"), folder / name)
    run = live(*SMALL_RUN, "--preset", "none", "--source", str(folder), "--save-images", "1", *flags,
               env={TEST_CRASH_ENV: f"{stage}:poison"})
    assert run.wait() == 3, run.stderr()
    report = run.report()
    assert report["frames"]["processed"] == 4 and report["frames"]["failed"] == 1, report["frames"]
    (failure,) = report["frames"]["failures"]
    assert failure["name"] == "c_poison.jpg" and failure["stage"] == stage and failure["kind"] == "failed"
    assert failure["reason"].startswith(f"{stage}-0 died twice holding it ({stage}-0 exited with code 70"), failure
    assert [r["name"] for r in report["restarts"]] == [f"{stage}-0", f"{stage}-0"]
    assert "died twice holding the same frame" in run.log()
    assert run.images() == 4
    run.assert_clean()
