"""The per-topic and per-subscription history (server/stats_history.py) stays bounded:
a ring of the last samples for each, at most ``max_tracked`` of each kind."""

from __future__ import annotations

from array import array

from herald.protocol.snapshot import SubscriptionSample, TopicSample
from server.stats_history import SeriesSet


def times(capacity: int, last_tick: int) -> array[int]:
    ring = array("q", bytes(8 * capacity))
    for tick in range(max(0, last_tick - capacity + 1), last_tick + 1):
        ring[tick % capacity] = 1000 * tick
    return ring


def test_a_series_keeps_only_the_last_capacity_samples_oldest_first() -> None:
    series = SeriesSet(TopicSample, capacity=4, max_tracked=10)
    for tick in range(10):
        series.record(tick, {"orders": (tick * 3,)})
    found = series.samples("orders", 9, times(4, 9))
    assert found == [
        TopicSample(now_ms=1000 * t, published_records_total=t * 3) for t in (6, 7, 8, 9)
    ]


def test_a_series_starts_at_its_first_sample() -> None:
    series = SeriesSet(SubscriptionSample, capacity=5, max_tracked=2)
    series.record(0, {})
    series.record(1, {"workers": (1, 2, 3)})
    assert series.samples("workers", 1, times(5, 1)) == [
        SubscriptionSample(now_ms=1000, delivered_total=1, acked_total=2, backlog=3)
    ]


def test_past_the_cap_a_name_gets_no_samples_until_one_is_deleted() -> None:
    series = SeriesSet(TopicSample, capacity=3, max_tracked=2)
    series.record(0, {"a": (1,), "b": (1,), "c": (1,)})
    assert len(series) == 2
    assert series.samples("c", 0, times(3, 0)) == []
    series.record(1, {"b": (2,), "c": (2,)})  # "a" was deleted: "c" takes its place
    assert len(series) == 2
    assert series.samples("a", 1, times(3, 1)) == []
    assert series.samples("c", 1, times(3, 1)) == [
        TopicSample(now_ms=1000, published_records_total=2)
    ]
