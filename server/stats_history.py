"""A short history of the stats counters (docs/protocol.md "Stats"): one sample a
second for the last 15 minutes, kept in memory, so a console opens with its charts
already drawn instead of empty until it has watched for a while.

The overview's samples are the two counters it charts (records published, records
delivered); each topic's, its records published; each subscription's, its records
delivered and acked and its backlog. Rates are left to the reader, as for the
snapshots. Bounded (STYLE 3): ``HISTORY_SAMPLES`` samples of each, and at most
``MAX_TRACKED`` topics and as many subscriptions (the first seen keep their slots; a
deleted one frees its slot at the next sample). A topic's series costs 8 bytes a
sample (7.2 kB), a subscription's 24 (21.6 kB): 14.4 MB with both caps reached.
"""

from __future__ import annotations

import contextlib
from array import array
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

from delivery.engine import DeliveryEngine
from herald.protocol.errors import SubscriptionNotFound
from herald.protocol.snapshot import (
    ServerHistory,
    ServerSample,
    SubscriptionHistory,
    SubscriptionSample,
    TopicHistory,
    TopicSample,
)
from storage.engine import Storage
from storage.writer import wall_clock_ms

SAMPLE_INTERVAL_S = 1.0  # the console's charts move once a second
HISTORY_SAMPLES = 900  # 15 minutes at that resolution
MAX_TRACKED = 500  # topics with a history, and subscriptions with one
INTERVAL_MS = int(SAMPLE_INTERVAL_S * 1000)

Sample = TypeVar("Sample", TopicSample, SubscriptionSample)


class _Series:
    """One topic's or subscription's samples: a ring of ``capacity`` rows of members,
    row ``tick % capacity`` written at each tick since ``first_tick``."""

    __slots__ = ("first_tick", "values")

    def __init__(self, first_tick: int, capacity: int, width: int) -> None:
        self.first_tick = first_tick
        self.values = array("q", bytes(8 * capacity * width))


class SeriesSet(Generic[Sample]):
    """The series of one kind of thing (topics or subscriptions), by name: its samples
    are ``sample`` (herald/protocol/snapshot.py), whose members after ``now_ms`` are
    the numbers kept."""

    def __init__(self, sample: type[Sample], capacity: int, max_tracked: int) -> None:
        self.sample: type[Sample] = sample
        self.members = sample.__struct_fields__[1:]
        self.capacity = capacity
        self.max_tracked = max_tracked
        self._series: dict[str, _Series] = {}

    def __len__(self) -> int:
        return len(self._series)

    def record(self, tick: int, rows: Mapping[str, Iterable[int]]) -> None:
        for gone in self._series.keys() - rows.keys():  # deleted: its slot is free again
            del self._series[gone]
        width = len(self.members)
        for name, row in rows.items():
            series = self._series.get(name)
            if series is None:
                if len(self._series) >= self.max_tracked:
                    continue
                series = self._series[name] = _Series(tick, self.capacity, width)
            at = (tick % self.capacity) * width
            series.values[at : at + width] = array("q", row)

    def samples(self, name: str, last_tick: int, times: array[int]) -> list[Sample]:
        """Oldest first; empty for a name not tracked."""
        series = self._series.get(name)
        if series is None:
            return []
        width = len(self.members)
        first = max(series.first_tick, last_tick - self.capacity + 1)
        found = []
        for tick in range(first, last_tick + 1):
            slot = tick % self.capacity
            values = series.values[slot * width : (slot + 1) * width]
            found.append(self.sample(times[slot], *values))
        return found


class StatsHistory:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int = HISTORY_SAMPLES, max_tracked: int = MAX_TRACKED) -> None:
        self._samples: deque[ServerSample] = deque(maxlen=capacity)
        self._capacity = capacity
        self._tick = -1  # the last sample's number
        self._times = array("q", bytes(8 * capacity))
        self.topics = SeriesSet(TopicSample, capacity, max_tracked)
        self.subscriptions = SeriesSet(SubscriptionSample, capacity, max_tracked)

    def record(self, storage: Storage, engine: DeliveryEngine) -> None:
        """Take one sample of this node's counters (the same numbers as GET /v1/stats)."""
        subscriptions: dict[str, tuple[int, int, int]] = {}
        for name in engine.names():
            with contextlib.suppress(SubscriptionNotFound):  # deleted meanwhile
                stats = engine.stats_of(name)
                subscriptions[name] = (stats.delivered_total, stats.acked_total, stats.backlog)
        topics = {topic.name: (topic.messages_total,) for topic in storage.topics()}
        now_ms = wall_clock_ms()
        published = sum(row[0] for row in topics.values())
        delivered = sum(row[0] for row in subscriptions.values())
        self._samples.append(ServerSample(now_ms, published, delivered))
        self._tick += 1
        self._times[self._tick % self._capacity] = now_ms
        self.topics.record(self._tick, topics)
        self.subscriptions.record(self._tick, subscriptions)

    def body(self) -> ServerHistory:
        return ServerHistory(INTERVAL_MS, list(self._samples))

    def topic_body(self, name: str) -> TopicHistory:
        return TopicHistory(INTERVAL_MS, name, self.topics.samples(name, self._tick, self._times))

    def subscription_body(self, name: str) -> SubscriptionHistory:
        samples = self.subscriptions.samples(name, self._tick, self._times)
        return SubscriptionHistory(INTERVAL_MS, name, samples)
