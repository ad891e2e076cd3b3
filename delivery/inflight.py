"""The in-flight table of one subscription: record id -> consumer, attempt, deadline.

Every send of a subscription gets the same ack deadline (now + ack_deadline_ms) and the
clock never goes back, so entries sorted by send time are sorted by deadline: an
insertion-ordered dict is the deadline queue, O(1) per send, ack and expiry. Only
extended entries (PROTOCOL §3 `extend`) have arbitrary deadlines; they move to a heap
with lazy deletion.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator

from storage.record import Record


class InFlight:
    """One sent, unacked record (mutable: ``extend`` moves its deadline)."""

    __slots__ = ("attempt", "consumer", "deadline", "id", "record")

    def __init__(
        self, id: str, record: Record, consumer: str, attempt: int, deadline: float
    ) -> None:
        self.id = id
        self.record = record
        self.consumer = consumer
        self.attempt = attempt
        self.deadline = deadline


class InFlightTable:
    __slots__ = ("_by_send", "_extended", "_heap", "_seq")

    def __init__(self) -> None:
        self._by_send: OrderedDict[str, InFlight] = OrderedDict()
        self._extended: dict[str, InFlight] = {}
        self._heap: list[tuple[float, int, InFlight]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._by_send) + len(self._extended)

    def add(self, entry: InFlight) -> None:
        """A fresh send; its deadline is not earlier than any other fresh send's."""
        self._by_send[entry.id] = entry

    def pop(self, id: str) -> InFlight | None:
        entry = self._by_send.pop(id, None)
        if entry is None and self._extended:
            entry = self._extended.pop(id, None)
        return entry

    def extend(self, id: str, deadline: float) -> bool:
        entry = self._by_send.pop(id, None)
        if entry is None:
            entry = self._extended.get(id)
            if entry is None:
                return False
        entry.deadline = deadline
        self._extended[id] = entry
        heapq.heappush(self._heap, (deadline, next(self._seq), entry))
        if len(self._heap) > 2 * len(self._extended) + 64:
            self._compact()
        return True

    def unorder(self) -> None:
        """The ack deadline got shorter (PROTOCOL §8 change in place): fresh sends would
        now expire before earlier ones, so every entry so far moves to the heap, keeping
        its deadline. O(n), once per such change."""
        for entry in self._by_send.values():
            self._extended[entry.id] = entry
            heapq.heappush(self._heap, (entry.deadline, next(self._seq), entry))
        self._by_send.clear()

    def pop_expired(self, now: float) -> list[InFlight]:
        """Remove and return entries whose deadline is ≤ now, earliest first per queue."""
        expired: list[InFlight] = []
        by_send = self._by_send
        while by_send:
            entry = next(iter(by_send.values()))
            if entry.deadline > now:
                break
            by_send.popitem(last=False)
            expired.append(entry)
        heap, extended = self._heap, self._extended
        while heap and heap[0][0] <= now:
            deadline, _, entry = heapq.heappop(heap)
            if extended.get(entry.id) is entry and entry.deadline == deadline:
                del extended[entry.id]
                expired.append(entry)
        return expired

    def next_deadline(self) -> float | None:
        """The nearest deadline; may be a stale (earlier) heap entry, which only costs a
        spurious wake-up."""
        best: float | None = None
        if self._by_send:
            best = next(iter(self._by_send.values())).deadline
        if self._heap and (best is None or self._heap[0][0] < best):
            best = self._heap[0][0]
        return best

    def remove_where(self, predicate: Callable[[InFlight], bool]) -> list[InFlight]:
        """O(n): for detach, seek and retention, which are rare."""
        removed = [e for e in self._by_send.values() if predicate(e)]
        for entry in removed:
            del self._by_send[entry.id]
        extended = [e for e in self._extended.values() if predicate(e)]
        for entry in extended:
            del self._extended[entry.id]
        if extended:
            self._compact()
        return removed + extended

    def __iter__(self) -> Iterator[InFlight]:
        yield from self._by_send.values()
        yield from self._extended.values()

    def _compact(self) -> None:
        extended = self._extended
        self._heap = [
            item
            for item in self._heap
            if extended.get(item[2].id) is item[2] and item[2].deadline == item[0]
        ]
        heapq.heapify(self._heap)
