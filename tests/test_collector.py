"""The collector's loop: how long it waits when nothing comes (its fixed cost per second)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from collector.collector import (IDLE_WAKE_S, PROGRESS_INTERVAL_S, RESOURCE_INTERVAL_S, WRITE_EVERY_S, Collector)


def idle_collector(counts=(3, 0), sent=(3, 0), unwritten=()):
    now = time.perf_counter()
    return SimpleNamespace(last_sample=now, last_progress=now, progress_sent=sent, stop_deadline=None,
                           collected=SimpleNamespace(unwritten=list(unwritten), unwritten_since=now),
                           _counts=lambda: counts)


def test_an_idle_collector_wakes_for_its_next_sample_not_every_poll():
    waited_ms = Collector.poll_timeout_ms(idle_collector())
    assert 1e3 * min(RESOURCE_INTERVAL_S, IDLE_WAKE_S) - 50 <= waited_ms <= 1e3 * IDLE_WAKE_S + 1


def test_new_counts_wake_it_for_the_progress_report():
    waited_ms = Collector.poll_timeout_ms(idle_collector(counts=(4, 0)))
    assert waited_ms <= 1e3 * PROGRESS_INTERVAL_S + 1


def test_frames_not_yet_written_wake_it_for_the_write():
    waited_ms = Collector.poll_timeout_ms(idle_collector(unwritten=[{"id": 0}]))
    assert waited_ms <= 1e3 * WRITE_EVERY_S + 1


def test_a_stop_deadline_wakes_it():
    collector = idle_collector()
    collector.stop_deadline = time.perf_counter() + 0.02
    assert Collector.poll_timeout_ms(collector) <= 21
