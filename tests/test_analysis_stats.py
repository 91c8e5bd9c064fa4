"""analysis.stats against hand computations."""

import pytest

from analysis.stats import fps, percentiles, ratio, utilisation


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


def test_percentiles_of_nothing_are_zeros():
    assert percentiles([]) == {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0}


def test_fps_is_none_without_a_rate():
    assert fps(4, 10.0, 15.0) == pytest.approx(0.8)
    assert fps(0, 12.0, 14.0) is None  # no frame: no rate, not 0 fps
    assert fps(3, 12.0, 12.0) is None


def test_utilisation_guards_zero_wall():
    assert utilisation(1.5, 6.0) == 0.25
    assert utilisation(1.0, 0.0) == 0.0


def test_ratio():
    assert ratio(3.0, 4.0) == 0.75
    assert ratio(None, 4.0) is None and ratio(3.0, 0.0) is None and ratio(3.0, None) is None
