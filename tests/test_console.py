"""What the runner says of a run: the start line's frame count, model and precision in words,
and a frame bar that counts up when the run has no known length and ends on the figure the
summary prints, or none."""

import io
import time
from types import SimpleNamespace

from supervisor.console import Console
import pytest

from supervisor.console import model_words
from supervisor.run import frames_planned
from settings.config import RunConfig
from yolo.precision import has_native_bf16, read_cpu_flags


def _bar_after(fps, total=8):
    stream = io.StringIO()
    console = Console(show_progress=True, total=total, log_path="/nonexistent/run.log", stream=stream)
    for done in (2, 5, 8):
        console.progress(processed=done, failed=0)
    console.finish(fps)
    return stream.getvalue().split("\r")[-1]


def test_the_bar_ends_on_the_measured_fps():
    last = _bar_after(22.98)
    assert "8/8" in last and "23.0 fps measured" in last, last


def test_without_measured_frames_the_bar_gives_no_rate():
    last = _bar_after(None)
    assert "fps n/a" in last and "measured" not in last and "failed" not in last, last


def test_a_finite_run_shows_the_time_left_and_a_count_up_run_does_not():
    for total, shown in ((100, True), (None, False)):
        stream = io.StringIO()
        console = Console(show_progress=True, total=total, log_path="/nonexistent/run.log", stream=stream)
        console.progress(processed=1, failed=0)
        time.sleep(0.01)  # a rate needs time to pass; its value does not matter here
        console.progress(processed=2, failed=0)
        console.bar.refresh()
        assert ("ETA " in stream.getvalue().split("\r")[-1]) is shown, stream.getvalue()
        console.finish(None)


def test_a_run_without_a_known_length_counts_up():
    last = _bar_after(9.5, total=None)
    assert "8/?" in last and "9.5 fps measured" in last, last


def test_the_start_line_says_what_the_run_will_read():
    assert frames_planned(RunConfig(), SimpleNamespace(total=64)) == "64 frames"
    # a --duration run plans a frame ceiling it will not reach: the line gives the time instead
    assert frames_planned(RunConfig(duration=8.0), SimpleNamespace(total=8000)) == "frames for 8 s"
    assert frames_planned(RunConfig(), SimpleNamespace(total=None)).startswith("frames until the stream ends")


def test_the_start_line_names_the_model_precision_and_backend():
    assert model_words(RunConfig(devices=("cpu",))) == "random-weight yolov5n in fp32 (PyTorch eager)"
    assert model_words(RunConfig(weights="w/yolov5s.pt", devices=("cpu",))) == "yolov5s.pt in fp32 (PyTorch eager)"
    assert model_words(RunConfig(preset="none", devices=("cpu",))) == "no model (--preset none)"


@pytest.mark.skipif(not has_native_bf16(read_cpu_flags()), reason="this CPU has no native bf16: --half is refused")
def test_the_start_line_says_bf16_autocast_for_half_on_a_cpu():
    assert model_words(RunConfig(half=True, devices=("cpu",))) == "random-weight yolov5n in bf16 autocast (PyTorch eager)"
