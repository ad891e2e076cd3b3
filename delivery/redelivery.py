"""Records waiting for redelivery, as small refs ordered by ready time.

PROTOCOL §2 `retry_backoff`: a record whose deadline passed or that was nacked waits
out its delay here. Only (partition, offset, sends so far, epoch) is kept — the engine
re-reads the record from the log when it is due (STYLE: read from the log by offset
instead of copying into memory).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RedeliveryRef:
    partition: int
    offset: int
    prior: int  # sends so far; the next send has attempt prior + 1
    epoch: int  # the partition's seek epoch when it was scheduled
    key: str | None = None  # for ordered_by_key: released if the record is gone


class RedeliveryQueue:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, RedeliveryRef]] = []
        self._seq = itertools.count()  # ties keep scheduling order

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, ready_at: float, ref: RedeliveryRef) -> None:
        heapq.heappush(self._heap, (ready_at, next(self._seq), ref))

    def pop_ready(self, now: float) -> list[RedeliveryRef]:
        heap = self._heap
        ready: list[RedeliveryRef] = []
        while heap and heap[0][0] <= now:
            ready.append(heapq.heappop(heap)[2])
        return ready

    def next_ready(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def refs(self) -> list[RedeliveryRef]:
        return [item[2] for item in self._heap]
