"""Producer message-id deduplication (PROTOCOL §2 Publish, `id`).

A record whose producer id was first published less than ``window_ms`` ago is not
appended again; its publish answers with the original partition and offset. The
index lives in memory only: the record framing stores ``producer_id``, so
:class:`storage.topic.Topic` rebuilds it on open by re-reading the last window of
each partition. The log stays the single truth and a kill loses nothing.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from storage.record import slot_constructor


@dataclass(frozen=True, slots=True)
class DedupEntry:
    """Where the first publish of a producer id landed."""

    partition: int
    offset: int
    timestamp_ms: int  # append time of the FIRST publish: the window counts from it


_entry = slot_constructor(DedupEntry)  # one per published id: the fast constructor


class DedupIndex:
    """Producer id -> first publish, forgetting ids once their window has passed.

    Memory is bounded by what was published within the window: every entry also sits
    in a min-heap by timestamp, so expiry pops only the entries that are due instead
    of scanning. A heap rather than an insertion-ordered deque because entries do not
    arrive in timestamp order: partitions append concurrently and a rebuild reads the
    partitions one after another.
    """

    __slots__ = ("_by_time", "_entries", "window_ms")

    def __init__(self, window_ms: int) -> None:
        if window_ms <= 0:
            raise ValueError("window_ms must be positive")
        self.window_ms = window_ms
        self._entries: dict[str, DedupEntry] = {}
        self._by_time: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, entry: DedupEntry, now_ms: int) -> bool:
        return now_ms - entry.timestamp_ms < self.window_ms

    def lookup(self, producer_id: str, now_ms: int) -> DedupEntry | None:
        """The first publish of ``producer_id`` if it is still within the window."""
        entry = self._entries.get(producer_id)
        if entry is None or not self._live(entry, now_ms):
            return None
        return entry

    def add(self, producer_id: str, partition: int, offset: int, timestamp_ms: int) -> None:
        """Remember a publish. An id already known with an earlier or equal timestamp keeps
        its first publish (a rebuild may meet the same id again in a later partition)."""
        current = self._entries.get(producer_id)
        # Unless the known publish had expired by the time of this one: then this one is
        # a new first publish.
        if (
            current is not None
            and current.timestamp_ms <= timestamp_ms
            and self._live(current, timestamp_ms)
        ):
            return
        self._entries[producer_id] = _entry(partition, offset, timestamp_ms)
        heapq.heappush(self._by_time, (timestamp_ms, producer_id))

    def forget(self, partition: int, from_offset: int) -> int:
        """Drop the ids whose first publish landed in ``partition`` at or after
        ``from_offset`` (a replica truncated its log there: those records are gone, and
        a retry must append them again). Returns how many were dropped. Their heap items
        stay until due; expire() skips them as stale."""
        gone = [
            producer_id
            for producer_id, entry in self._entries.items()
            if entry.partition == partition and entry.offset >= from_offset
        ]
        for producer_id in gone:
            del self._entries[producer_id]
        return len(gone)

    def expire(self, now_ms: int) -> int:
        """Drop every entry whose window has passed; returns how many were dropped."""
        dropped = 0
        heap = self._by_time
        cutoff = now_ms - self.window_ms  # expired when timestamp <= cutoff
        while heap and heap[0][0] <= cutoff:
            timestamp_ms, producer_id = heapq.heappop(heap)
            entry = self._entries.get(producer_id)
            # A heap item is stale when its id was re-added later with another timestamp;
            # only the item matching the live entry may remove it.
            if entry is not None and entry.timestamp_ms == timestamp_ms:
                del self._entries[producer_id]
                dropped += 1
        return dropped
