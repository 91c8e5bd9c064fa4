"""analysis.samples: exact against numpy while everything is kept, a flat-memory uniform
reservoir beyond RESERVOIR_SIZE, and lossless plain-data round trips."""

import json
import math
import tracemalloc

import msgpack
import numpy as np
import pytest

from analysis.samples import RESERVOIR_SIZE, Samples, as_samples, pooled, summarise_ms

SMALL = [5.5, 0.25, 8.0, 3.0, 3.0, 12.5, 7.0]


def test_small_series_matches_numpy():
    s = Samples(SMALL)
    a = np.array(SMALL)
    assert (s.count, s.sum, s.min, s.max) == (7, pytest.approx(a.sum()), 0.25, 12.5)
    assert s.mean == pytest.approx(a.mean())
    qs = (0, 10, 50, 90, 95, 99, 100)
    assert s.percentiles(qs) == pytest.approx({f"p{q}": float(np.percentile(a, q)) for q in qs})
    np.testing.assert_array_equal(s.values, a)


def test_add_and_extend_agree():
    one = Samples()
    for x in SMALL:
        one.add(x)
    assert one.to_dict() == Samples(SMALL).to_dict()


def test_round_trip_through_msgpack_with_the_values_packed():
    s = Samples(SMALL)
    back = Samples.from_dict(msgpack.unpackb(msgpack.packb(s.to_dict())))
    assert back.to_dict() == s.to_dict()
    assert back.summary() == s.summary()
    assert isinstance(s.to_dict()["values"], bytes)


def test_values_as_a_plain_list_read_the_same():
    """A JSON copy (the values as a list, as older workers sent them) gives the same series."""
    s = Samples(SMALL)
    as_list = {**s.to_dict(), "values": s.values.tolist()}
    back = Samples.from_dict(json.loads(json.dumps(as_list)))
    assert back.to_dict() == s.to_dict() and back.summary() == s.summary()


def test_a_summary_costs_eight_bytes_a_value_on_the_wire_and_in_the_receiver():
    """The collector holds every worker's summary: up to RESERVOIR_SIZE values per series each."""
    s = Samples(float(i) / 7 for i in range(5000))
    received = msgpack.unpackb(msgpack.packb(s.to_dict()))
    assert len(received["values"]) == 8 * 5000
    assert len(msgpack.packb(s.to_dict())) < 8 * 5000 + 64


def test_packed_values_of_a_broken_length_are_refused():
    with pytest.raises(ValueError, match="multiple of 8 bytes, got 7"):
        Samples.from_dict({"count": 1, "sum": 1.0, "min": 1.0, "max": 1.0, "values": b"1234567"})


def test_empty_series():
    s = Samples()
    assert s.to_dict() == {"count": 0, "sum": 0.0, "min": None, "max": None, "values": b""}
    assert s.mean == 0.0 and s.summary()["count"] == 0 and s.summary()["p99"] == 0.0
    assert Samples.from_dict(s.to_dict()).count == 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="expected a finite value, got nan"):
        Samples([1.0, math.nan])
    with pytest.raises(ValueError, match="expected keys"):
        Samples.from_dict({"count": 1, "values": [1.0]})
    with pytest.raises(ValueError, match="expected at most count=1 values, got 2"):
        Samples.from_dict({"count": 1, "sum": 3.0, "min": 1.0, "max": 2.0, "values": [1.0, 2.0]})
    with pytest.raises(ValueError, match="expected a capacity >= 1"):
        Samples(capacity=0)


def test_reservoir_keeps_exact_totals_and_a_uniform_sample():
    n = 200_000
    s = Samples(range(n))
    assert s.count == n and s.sum == n * (n - 1) / 2 and (s.min, s.max) == (0, n - 1)
    assert s.values.size == RESERVOIR_SIZE
    # a uniform sample of 0..n-1: its quantiles are near q * n (standard error ~ 0.0035 n at K = 20000)
    got = s.percentiles((10, 50, 90))
    for q in (10, 50, 90):
        assert got[f"p{q}"] == pytest.approx(q / 100 * n, abs=0.015 * n)


def test_memory_stays_flat_over_a_million_adds():
    s = Samples(range(RESERVOIR_SIZE))  # full already
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(1_000_000):
            s.add(i * 0.001)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.count == RESERVOIR_SIZE + 1_000_000 and s.values.size == RESERVOIR_SIZE
    assert after - before < 10_000 and peak - before < 10_000  # bytes: nothing grows with the adds
    assert len(s.to_dict()["values"]) == 8 * RESERVOIR_SIZE  # packed float64


def test_merge_is_exact_while_everything_fits():
    a, b = Samples([1.0, 2.0]), Samples([3.0, 10.0])
    a.merge(b)
    assert a.to_dict() == Samples([1.0, 2.0, 3.0, 10.0]).to_dict()
    a.merge(Samples())
    assert a.count == 4


def test_merge_of_sampled_series_weighs_them_by_their_counts():
    big = Samples(np.zeros(300_000))  # 300 000 zeros
    small = Samples(np.ones(100_000))  # 100 000 ones
    big.merge(small)
    assert big.count == 400_000 and big.sum == 100_000 and (big.min, big.max) == (0.0, 1.0)
    assert big.values.size == RESERVOIR_SIZE
    # a quarter of the merged series are ones; the hypergeometric draw has sd ~ 0.003
    assert big.values.mean() == pytest.approx(0.25, abs=0.02)


def test_as_samples_reads_every_form():
    s = Samples(SMALL)
    assert as_samples(s) is s
    assert as_samples(s.to_dict()).to_dict() == s.to_dict()
    assert as_samples(SMALL).to_dict() == s.to_dict()  # a plain list from an older worker
    assert as_samples(None).count == 0


def test_pooled_merges_workers():
    got = pooled([[1.0, 2.0], Samples([3.0]).to_dict(), None])
    assert got.count == 3 and got.mean == 2.0


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
