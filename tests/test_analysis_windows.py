"""analysis.windows: which frames count, where the measured window starts, fps per window and
the stability verdict, by hand; and how a run without measured frames is reported."""

import pytest

from analysis.report import build_report
from analysis.terminal import format_summary
from analysis.markdown import markdown
from analysis.windows import (STABILITY_TOLERANCE, MeasuredWindow, measured_window, stability,
                              throughput_windows)
from tests.analysis_runs import steady_run


def frames_ending_at(*ends, cold=(), infer=None):
    """Frame i completes at ends[i]; its forward starts 30 ms before; ``infer`` names its process."""
    return [{"id": i, "cold": i in cold, "workers": {"infer": (infer or {}).get(i, "infer-0")},
             "t": {"infer_start": end - 0.03, "post_end": end}} for i, end in enumerate(ends)]


def test_without_warmup_the_window_starts_at_the_run_start():
    window = measured_window(frames_ending_at(11.0, 12.0, 13.0, 15.0), 0, 10.0)
    assert window == MeasuredWindow(10.0, 15.0, 4, 4)
    assert window.fps == pytest.approx(0.8) and window.seconds == 5.0


def test_window_starts_at_the_last_warmup_completion():
    # frame 1 (warm-up) finishes last of the warm-up at 12.5; frame 2 finished before it and is not counted
    window = measured_window(frames_ending_at(11.0, 12.5, 12.0, 13.0, 14.5), 2, 10.0)
    assert (window.start_s, window.end_s, window.measured, window.completed) == (12.5, 14.5, 2, 2)


def test_all_warmup_or_no_frames():
    window = measured_window(frames_ending_at(11.0, 12.0), 5, 10.0)
    assert (window.start_s, window.end_s, window.measured) == (12.0, 12.0, 0) and window.fps is None
    assert measured_window([], 0, 10.0) == MeasuredWindow(10.0, 10.0, 0, 0)


def test_each_processes_cold_first_forward_opens_the_window_after_it():
    # infer-0 does frames 0, 2, 4, 5; infer-1 does 1 and 3. Frames 0 and 1 are each process's first,
    # cold, forward; frame 1 ends at 12.4, after frame 2 (12.1). Frame 5 is cold too (a new input
    # shape later on): left out of the count, but it does not move the window.
    frames = frames_ending_at(11.5, 12.4, 12.1, 13.0, 14.0, 15.0, cold=(0, 1, 5),
                              infer={1: "infer-1", 3: "infer-1"})
    window = measured_window(frames, 0, 10.0)
    assert window.start_s == 12.4 and window.end_s == 15.0
    assert window.measured == 2 and window.completed == 3  # frames 3 and 4 count; 5 completed but is cold


def test_throughput_windows_by_hand():
    window = MeasuredWindow(10.0, 17.0, 0, 0)  # 7 s: three 2 s windows aligned to the end, 1 s left over
    ends = [10.5, 11.5, 11.9, 13.0, 13.5, 15.0, 15.5, 16.0, 17.0]
    got = throughput_windows(ends, window)
    assert [(w["start_s"], w["end_s"]) for w in got] == [(11.0, 13.0), (13.0, 15.0), (15.0, 17.0)]
    # (11, 13] holds 11.5, 11.9, 13.0; (13, 15] holds 13.5, 15.0; (15, 17] holds 15.5, 16.0, 17.0
    assert [w["frames"] for w in got] == [3, 2, 3] and [w["fps"] for w in got] == [1.5, 1.0, 1.5]


def _slices(*fps_values):
    return [{"start_s": 2.0 * i, "end_s": 2.0 * i + 2, "frames": int(2 * f), "fps": f} for i, f in enumerate(fps_values)]


MEASURED = MeasuredWindow(0.0, 8.0, 100, 100)


def test_stable_within_the_tolerance():
    got = stability(_slices(5.0, 10.0, 10.5, 11.0), MEASURED, 100, 0)  # only the last three count
    assert got["stable"] and got["reason"] is None and got["spread"] == pytest.approx(0.1)
    assert got["tolerance"] == STABILITY_TOLERANCE == 0.10


def test_unstable_beyond_the_tolerance():
    got = stability(_slices(10.0, 10.0, 11.2), MEASURED, 100, 0)
    assert not got["stable"] and got["spread"] == pytest.approx(0.12)
    assert "10.0 to 11.2 fps, 12 % apart" in got["reason"]


def test_too_short_for_three_windows():
    got = stability(_slices(10.0, 10.0), MeasuredWindow(0.0, 5.0, 50, 50), 50, 0)
    assert not got["stable"] and got["reason"].startswith("too short: the measured window of 5.0 s holds 2 whole")


def test_a_window_without_frames_is_unstable():
    got = stability(_slices(10.0, 0.0, 10.0), MEASURED, 100, 0)
    assert not got["stable"] and "completed no frame" in got["reason"]


def test_steady_run_is_stable_and_its_windows_hold_its_rate():
    report = build_report(steady_run(frames=200, period_s=0.05))  # 20 fps for 10 s
    th = report["throughput"]
    assert th["stable"] and th["fps"] == pytest.approx(20.0)
    assert len(th["windows"]) == 4 and all(w["fps"] == pytest.approx(20.0) for w in th["windows"])


def test_zero_measured_frames_is_flagged_everywhere():
    report = build_report(steady_run(frames=8, warmup=8))
    summary = report["summary"]
    assert summary["fps"] is None and summary["measured_frames"] == 0 and summary["stable"] is False
    assert summary["stable_reason"].startswith("no measured frames: 8 frames processed, warm-up 8")
    assert "throughput  n/a: no measured frames" in format_summary(summary)
    text = markdown(report)
    assert "| n/a |" in text and "**Not stable**: no measured frames" in text
    assert summary["latency_p50_ms"] is None and summary["efficiency"] is None
