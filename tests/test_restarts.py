"""Workers killed, stopped, or restarted too often on live runs: each is restarted (or the run
stops), the frames it held are sent again, every frame is accounted for, and nothing of the run
is left behind."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.live_run import SMALL_RUN, frame_counts
from process.faults import TEST_SLOW_ENV

pytestmark = pytest.mark.slow


def kill_in_turn(run, names, images_between: int) -> None:
    """SIGKILL each named worker in turn, once ``images_between`` more images are saved, and wait
    for its restart before the next."""
    seen = 3
    for name in names:
        run.wait_for_images(seen)
        victim = run.wait_for_stage(name)
        victim.send_signal(signal.SIGKILL)
        run.wait_until(lambda: (p := run.stage(name)) is not None and p.pid != victim.pid, 30, f"{name} restarted")
        seen = run.images() + images_between


def test_killed_workers_are_restarted_and_every_frame_is_processed_once(live):
    """SIGKILL to the preprocess, then the inference, then the postprocess worker mid-run: each is
    restarted, the frames it held are sent again, every frame is processed once, exit 0, and the
    report lists each restart with its signal, time and frames re-sent."""
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "90", "--save-images", "1",
               env={TEST_SLOW_ENV: "infer:10,post:30"})
    # a sender's count of frames it re-sent dies with it: senders last
    kill_in_turn(run, ("pre-0", "infer-0", "post-0"), images_between=4)
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert frame_counts(report) == (90, 90, 0, 0) and report["frames"]["accounted"]
    assert report["frames"]["lost"] == 0
    assert run.images() == 90  # one image per frame: none written twice under two names, none missing
    restarts = report["restarts"]
    assert [r["name"] for r in restarts] == ["pre-0", "infer-0", "post-0"]
    assert all(r["signal"] == "SIGKILL" and r["at_s"] > 0 and not r["final"] for r in restarts), restarts
    resent = {r["name"]: r["frames_resent"] for r in restarts}
    assert resent["infer-0"] > 0 and resent["post-0"] > 0, resent  # both held frames when killed
    assert "restarting it (1 of 3 restarts for infer)" in run.log()
    run.assert_clean()


def test_a_postprocess_worker_killed_holding_finished_results_loses_none_and_redraws_none(live):
    """Postprocess holds finished results for the collector's next message (workers.onward) and
    has given their slots back; killed holding some, their frames go again to its next
    incarnation: each image is written once and equals an undisturbed run's (a frame sent again
    must not be drawn from the pixels of another frame that reused its slot since)."""
    flags = (*SMALL_RUN, "--preset", "none", "--frames", "40", "--save-images", "all", "--prefetch", "1")
    calm = live(*flags, name="calm")
    assert calm.wait() == 0, calm.stderr()
    run = live(*flags, env={TEST_SLOW_ENV: "post:30"})
    kill_in_turn(run, ("post-0",), images_between=0)
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert frame_counts(report) == (40, 40, 0, 0) and report["frames"]["lost"] == 0
    [restart] = report["restarts"]
    assert restart["name"] == "post-0" and restart["frames_resent"] > 0, restart  # it held finished frames

    def images(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    written, reference = images(run.run_dir / "images"), images(calm.run_dir / "images")
    assert len(reference) == 40 and written.keys() == reference.keys()
    assert [name for name in written if written[name] != reference[name]] == []
    run.assert_clean()


def test_slots_held_by_killed_consumers_come_back_to_a_small_ring(live):
    """A ring of 5 slots (one worker per stage, --prefetch 1) and four deaths of the consumers
    holding its slots: had the slots of a dead consumer not come back, the ring would run dry and
    the run would never end. Every frame is processed, each through a slot."""
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "60", "--save-images", "1", "--prefetch", "1",
               env={TEST_SLOW_ENV: "infer:10,post:30"})
    kill_in_turn(run, ("infer-0", "post-0", "infer-0", "post-0"), images_between=3)
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert frame_counts(report) == (60, 60, 0, 0) and len(report["restarts"]) == 4
    [pre] = report["stages"]["pre"]["per_worker"]
    assert pre["slots"] == 5, "expected the ring this test is sized for"
    assert pre["inline_arrays"] == 0, "a frame went in its message: it did not need the ring"
    run.assert_clean()


def test_a_stopped_worker_is_named_killed_and_its_frames_sent_again(live):
    """SIGSTOP to the inference worker: the heartbeat names it, it is handled as dead and
    restarted, its frames are sent again, and the run ends with every frame processed."""
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "40", "--save-images", "1", "--heartbeat-timeout-s", "1.5",
               env={TEST_SLOW_ENV: "post:30"})
    run.wait_for_images(3)
    victim = run.wait_for_stage("infer-0")
    victim.send_signal(signal.SIGSTOP)
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert frame_counts(report) == (40, 40, 0, 0)
    assert re.search(r"infer-0 has not answered for \d+ s: killed it", run.log()), run.log()[-2000:]
    (restart,) = report["restarts"]
    assert restart["name"] == "infer-0" and restart["signal"] == "SIGKILL" and "has not answered" in restart["reason"]
    (worker,) = report["stages"]["infer"]["per_worker"]  # the new incarnation: the stopped one is nobody's busy time
    assert worker["incarnation"] == 1 and worker["busy_s"] <= worker["wall_s"]
    assert report["stages"]["infer"]["utilisation"] <= 1.0
    run.assert_clean()


def test_more_deaths_than_max_restarts_abort_with_a_partial_report(live):
    """--max-restarts 0 and the only inference worker killed: the run stops, exit 1, and the
    partial report names who held each lost frame and counts the never-read ones as cancelled."""
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "200", "--save-images", "1", "--max-restarts", "0",
               env={TEST_SLOW_ENV: "infer:30"})
    run.wait_for_images(2)
    run.wait_for_stage("infer-0").send_signal(signal.SIGKILL)
    assert run.wait() == 1, run.stderr()
    assert "killed by SIGKILL: no infer worker can take its frames; stopping the run" in run.stderr()
    report = run.report()
    frames_in, processed, failed, cancelled = frame_counts(report)
    lost = [f for f in report["frames"]["failures"] if f["kind"] == "lost"]
    assert frames_in == 200 and processed >= 2 and cancelled > 0 and report["frames"]["accounted"]
    assert failed == 0 and report["frames"]["lost"] == len(lost) > 0  # lost is not failed, nor cancelled
    assert processed + len(lost) + cancelled == frames_in
    (restart,) = report["restarts"]
    assert restart["name"] == "infer-0" and restart["final"]
    for frame in lost:  # frames the dead worker held are named after it, not after who waits to resend them
        assert frame["stage"] == "infer" and frame["worker"] == "infer-0", frame
    run.assert_clean()
