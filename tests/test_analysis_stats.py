"""analysis.stats against hand computations."""

import pytest

from analysis.stats import fps, measured_window, percentiles, summarise_ms, utilisation


def linear_percentile(values, q):
    """The textbook definition numpy's "linear" method follows: rank q/100 * (n - 1), interpolated."""
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    below = int(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (rank - below) * (ordered[above] - ordered[below])


def test_percentiles_by_hand():
    # sorted 1, 2, 3, 4, 10: p50 is the middle value; p90 at rank 3.6 is 4 + 0.6 * 6 = 7.6
    got = percentiles([4.0, 1.0, 10.0, 3.0, 2.0])
    assert got == pytest.approx({"p50": 3.0, "p90": 7.6, "p95": 8.8, "p99": 9.76})


@pytest.mark.parametrize("q", [0, 25, 50, 73, 90, 95, 99, 100])
def test_percentiles_match_reference(q):
    values = [5.5, 0.25, 8.0, 3.0, 3.0, 12.5, 7.0]
    assert percentiles(values, qs=(q,))[f"p{q}"] == pytest.approx(linear_percentile(values, q))


def test_percentiles_rejects_out_of_range_q():
    with pytest.raises(ValueError, match="expected qs in"):
        percentiles([1.0], qs=(50, 101))


def test_summarise_ms():
    got = summarise_ms([1.0, 2.0, 3.0, 4.0])
    assert got["count"] == 4 and got["mean"] == 2.5 and got["min"] == 1.0 and got["max"] == 4.0
    assert got["p50"] == 2.5 and got["p90"] == pytest.approx(3.7)
    assert set(got) == {"count", "mean", "p50", "p90", "p95", "p99", "max", "min"}
    assert all(type(v) is float for k, v in got.items() if k != "count")


def test_summarise_ms_empty_is_zeros():
    got = summarise_ms([])
    assert got["count"] == 0 and all(v == 0.0 for v in got.values())
    assert set(got) == {"count", "mean", "p50", "p90", "p95", "p99", "max", "min"}


def frames_ending_at(*ends):
    return [{"id": i, "t": {"post_end": end}} for i, end in enumerate(ends)]


def test_measured_window_without_warmup_starts_at_run_start():
    frames = frames_ending_at(11.0, 12.0, 13.0, 15.0)
    assert measured_window(frames, 0, 10.0) == (10.0, 15.0, 4)
    assert fps(4, 10.0, 15.0) == pytest.approx(0.8)


def test_measured_window_starts_at_last_warmup_completion():
    # frame 1 (warm-up) finishes last of the warm-up at 12.5; frame 2 finished before it and is not counted
    frames = frames_ending_at(11.0, 12.5, 12.0, 13.0, 14.5)
    assert measured_window(frames, 2, 10.0) == (12.5, 14.5, 2)


def test_measured_window_all_warmup_or_empty():
    assert measured_window(frames_ending_at(11.0, 12.0), 5, 10.0) == (12.0, 12.0, 0)
    assert measured_window([], 0, 10.0) == (10.0, 10.0, 0)
    assert fps(0, 12.0, 12.0) == 0.0


def test_utilisation_guards_zero_wall():
    assert utilisation(1.5, 6.0) == 0.25
    assert utilisation(1.0, 0.0) == 0.0
