"""Records waiting for their `deliver_at` (PROTOCOL §8 delayed delivery), as small refs
ordered by that time.

A delayed record is read from the log like any other; when its deliver_at is still
ahead, only a ref is kept here (partition, offset, sends so far, epoch, key) and the
record is re-read from the log once it is due, as a redelivery is (STYLE: read from the
log by offset instead of copying into memory). The queue is a look-ahead of bounded
size: the core stops reading a partition at a delayed record it has no room for
(delivery/core.py MAX_DELAYED), and the record stays in the log until room comes back.
Times are wall-clock ms since the epoch, as deliver_at is.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from delivery.redelivery import RedeliveryRef


class DelayQueue:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, RedeliveryRef]] = []
        self._seq = itertools.count()  # ties keep offset order

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, deliver_at: int, ref: RedeliveryRef) -> None:
        heapq.heappush(self._heap, (deliver_at, next(self._seq), ref))

    def pop_due(self, wall_ms: int) -> list[RedeliveryRef]:
        """The refs whose deliver_at is at or before ``wall_ms``, earliest first."""
        heap = self._heap
        due: list[RedeliveryRef] = []
        while heap and heap[0][0] <= wall_ms:
            due.append(heapq.heappop(heap)[2])
        return due

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def refs(self) -> list[RedeliveryRef]:
        return [item[2] for item in self._heap]

    def remove_where(self, gone: Callable[[RedeliveryRef], bool]) -> list[RedeliveryRef]:
        """Drop the refs ``gone`` selects (a seek, retention); returns them."""
        removed = [item[2] for item in self._heap if gone(item[2])]
        if removed:
            self._heap = [item for item in self._heap if not gone(item[2])]
            heapq.heapify(self._heap)
        return removed
