"""The runner's frame bar ends on the figure the summary prints, or on none."""

import io

from supervisor.console import Console


def _bar_after(fps):
    stream = io.StringIO()
    console = Console(show_progress=True, total=8, log_path="/nonexistent/run.log", stream=stream)
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
