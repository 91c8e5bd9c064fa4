"""analysis.plots: every plot is a whole PNG of real content, linked from report.md; without
matplotlib the plots are skipped with a warning and the other files are still written."""

import logging
import sys

import pytest

from analysis.plots import MIB, memory_series, render_plots
from analysis.report import build_report, write_run_folder
from tests.analysis_runs import steady_run
from tests.test_analysis_markdown import yolo_like_module_rows

PLOTS = ("plots.png", "latency.png", "timeline.png", "modules.png", "resources.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"
MIN_PNG_BYTES = 5_000  # an empty 80 dpi figure is about 2 kB


@pytest.fixture(scope="module")
def run_and_report():
    run = steady_run(frames=400, period_s=0.025, module_rows=yolo_like_module_rows(),
                     forward={"forwards": 3, "total_ms": 90.0, "mean_ms": 30.0, "p50_ms": 30.0, "p95_ms": 31.0})
    return run, build_report(run)


def test_every_plot_is_a_whole_png(run_and_report):
    rendered = render_plots(*run_and_report)
    assert tuple(rendered) == PLOTS
    for name, data in rendered.items():
        assert data.startswith(PNG_SIGNATURE) and data.endswith(PNG_END), name
        assert len(data) > MIN_PNG_BYTES, (name, len(data))


def test_plots_without_data_are_left_out():
    rendered = render_plots(*(lambda run: (run, build_report(run)))(steady_run(frames=8, warmup=8, resources=False)))
    assert set(rendered) == {"plots.png", "timeline.png"}  # no measured latency, no modules, no resources


def test_run_folder_writes_and_links_the_plots(tmp_path, run_and_report):
    run, _ = run_and_report
    summary = write_run_folder(str(tmp_path), run)
    text = (tmp_path / "report.md").read_text()
    for name in PLOTS:
        assert (tmp_path / name).read_bytes().startswith(PNG_SIGNATURE)
        assert f"[{name}]({name})" in text
    assert summary["files"]["failed"] == {}


def test_missing_matplotlib_only_skips_the_plots(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with caplog.at_level(logging.WARNING, logger="analysis.plots"):
        summary = write_run_folder(str(tmp_path), steady_run())
    assert "no plots: matplotlib unavailable" in caplog.text
    assert not list(tmp_path.glob("*.png")) and "## Plots" not in (tmp_path / "report.md").read_text()
    assert {"report.json", "report.md", "trace.json"} <= set(summary["files"]["written"])


def test_a_memory_line_never_mixes_pss_and_rss():
    pss_sometimes = [[0.0, 0.0, 400 * MIB, 100 * MIB], [0.5, 0.1, 410 * MIB, None], [1.0, 0.2, 420 * MIB, 120 * MIB]]
    assert memory_series(pss_sometimes) == ("PSS", [(0.0, 100 * MIB), (1.0, 120 * MIB)])
    rss_only = [[0.0, 0.0, 400 * MIB, None], [0.5, 0.1, None, None], [1.0, 0.2, 420 * MIB, None]]
    assert memory_series(rss_only) == ("RSS", [(0.0, 400 * MIB), (1.0, 420 * MIB)])
    assert memory_series([[0.0, 0.0, None, None]]) == ("PSS", [])


def test_module_rows_are_labelled_with_their_type():
    from analysis.plots import module_label
    from yolo.module_stats import RESIDUAL_NAME
    assert module_label({"name": "model.24", "type": "Detect"}) == "model.24 (Detect)"
    assert module_label({"name": RESIDUAL_NAME, "type": "residual"}) == RESIDUAL_NAME


def test_a_run_of_many_workers_plots_without_a_warning_on_the_terminal(caplog):
    """64 pre and 64 post workers: a figure too crowded for tight margins keeps matplotlib's
    layout, and the warning goes to the log (run.log), not to stderr as a UserWarning."""
    import warnings
    run = steady_run(frames=400, workers={"pre": 64, "infer": 2, "post": 64})
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="analysis.plots"):
        warnings.simplefilter("always")
        rendered = render_plots(run, build_report(run))
    assert not caught, [str(w.message) for w in caught]
    assert "timeline.png" in rendered and "matplotlib's default layout" in caplog.text
