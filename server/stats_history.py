"""A short history of the stats counters (docs/protocol.md "Stats"): one sample a
second for the last 15 minutes, kept in memory, so a console opens with its charts
already drawn instead of empty until it has watched for a while.

The samples are the two counters the console charts (records published, records
delivered); rates are left to the reader, as for the snapshots. Bounded: a deque of
``HISTORY_SAMPLES`` (STYLE 3).
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from delivery.engine import DeliveryEngine
from storage.engine import Storage
from storage.errors import SubscriptionNotFound
from storage.topic import wall_clock_ms

SAMPLE_INTERVAL_S = 1.0  # the console's charts move once a second
HISTORY_SAMPLES = 900  # 15 minutes at that resolution


@dataclass(frozen=True, slots=True)
class StatsSample:
    now_ms: int
    published_records_total: int
    delivered_total: int


class StatsHistory:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int = HISTORY_SAMPLES) -> None:
        self._samples: deque[StatsSample] = deque(maxlen=capacity)

    def record(self, storage: Storage, engine: DeliveryEngine) -> None:
        """Take one sample of this node's counters (the same sums as GET /v1/stats)."""
        delivered = 0
        for name in engine.names():
            with contextlib.suppress(SubscriptionNotFound):  # deleted meanwhile
                delivered += engine.stats(name)["delivered_total"]
        published = sum(topic.messages_total for topic in storage.topics())
        self._samples.append(StatsSample(wall_clock_ms(), published, delivered))

    def body(self) -> dict[str, Any]:
        return {
            "interval_ms": int(SAMPLE_INTERVAL_S * 1000),
            "samples": [asdict(sample) for sample in self._samples],
        }
