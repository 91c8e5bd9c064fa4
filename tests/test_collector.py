"""The collector's loop: how long it waits when nothing comes (its fixed cost per second)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from collector import collector as collector_module
from collector.collector import (IDLE_WAKE_S, PROGRESS_INTERVAL_S, RESOURCE_INTERVAL_S, WRITE_EVERY_S, Collector)

NOW_S = 1000.0


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """The loop's clock stands still: what is measured is the wait chosen, not this machine's speed."""
    monkeypatch.setattr(collector_module.time, "perf_counter", lambda: NOW_S)


def idle_collector(counts=(3, 0), sent=(3, 0), unwritten=()):
    return SimpleNamespace(last_sample=NOW_S, last_progress=NOW_S, progress_sent=sent, stop_deadline=None,
                           collected=SimpleNamespace(unwritten=list(unwritten), unwritten_since=NOW_S),
                           _counts=lambda: counts)


def test_an_idle_collector_wakes_for_its_next_sample_not_every_poll():
    assert Collector.poll_timeout_ms(idle_collector()) == pytest.approx(1e3 * min(RESOURCE_INTERVAL_S, IDLE_WAKE_S),
                                                                        abs=1.5)


def test_new_counts_wake_it_for_the_progress_report():
    assert Collector.poll_timeout_ms(idle_collector(counts=(4, 0))) == pytest.approx(1e3 * PROGRESS_INTERVAL_S, abs=1.5)


def test_frames_not_yet_written_wake_it_for_the_write():
    assert Collector.poll_timeout_ms(idle_collector(unwritten=[{"id": 0}])) == pytest.approx(1e3 * WRITE_EVERY_S,
                                                                                             abs=1.5)


def test_a_stop_deadline_wakes_it():
    collector = idle_collector()
    collector.stop_deadline = NOW_S + 0.02
    assert Collector.poll_timeout_ms(collector) == pytest.approx(20.0, abs=1.5)
