"""TailCache: the newest records of one partition, decoded, in memory.

Caught-up consumers read from it with no thread hop and no decode (the
:class:`storage.partition.Partition` facade asks it first, then the files). It holds
whole appended batches as chunks, bounded by bytes (oldest dropped first), stops at the
partition's visible end, and is cut in place when the log is truncated. Event loop only.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from storage.batch import make_records
from storage.record import NewRecord, Record

DEFAULT_CACHE_BYTES = 32 * 1024 * 1024
_RECORD_OVERHEAD = 160  # rough bytes of a Record object beyond its value, for the cache bound
_COMPACT_AT = 1024  # dropped cache chunks before the lists are compacted


@dataclass(slots=True, eq=False)
class _Chunk:
    """One appended batch in the cache; its Record objects are made on the first read
    that touches it and kept, so appends nobody reads cost no Record construction."""

    first_offset: int
    timestamp: int
    items: Sequence[NewRecord] | list[Record]
    size: int
    materialized: bool = False

    def records(self, partition: int) -> list[Record]:
        if not self.materialized:
            self.items = make_records(partition, self.first_offset, self.timestamp, self.items)  # type: ignore[arg-type]
            self.materialized = True
        return self.items  # type: ignore[return-value]


class TailCache:
    """The most recent batches of a partition, contiguous, bounded by bytes."""

    def __init__(self, partition: int, max_bytes: int, end_offset: int) -> None:
        self._partition = partition
        self._max_bytes = max_bytes
        self._chunks: list[_Chunk] = []
        self._starts: list[int] = []  # first offset of each chunk, for bisect
        self._head = 0  # index of the oldest live chunk
        self.start_offset = end_offset  # first cached offset, or the end when empty
        self.end_offset = end_offset
        self._bytes = 0

    def add(self, first: int, timestamp: int, records: Sequence[NewRecord]) -> None:
        if first != self.end_offset:  # not contiguous (never expected): start over
            self._chunks, self._starts, self._head, self._bytes = [], [], 0, 0
            self.start_offset = first
        size = sum(len(r.value) for r in records) + _RECORD_OVERHEAD * len(records)
        self._chunks.append(_Chunk(first, timestamp, records, size))
        self._starts.append(first)
        self._bytes += size
        self.end_offset = first + len(records)
        while self._bytes > self._max_bytes and self._head < len(self._chunks):
            self._drop_oldest()

    def drop_below(self, offset: int) -> None:
        """Forget whole batches below ``offset`` (deleted by retention)."""
        while self._head < len(self._chunks) and self._next_start(self._head) <= offset:
            self._drop_oldest()
        if self._head == len(self._chunks) and offset > self.end_offset:
            self.start_offset = self.end_offset = offset

    def _next_start(self, i: int) -> int:
        return self._starts[i + 1] if i + 1 < len(self._starts) else self.end_offset

    def _drop_oldest(self) -> None:
        chunk = self._chunks[self._head]
        self._bytes -= chunk.size
        # Its records go now, not when the list is compacted: up to _COMPACT_AT dropped
        # chunks of 500 records each would otherwise keep ~0.5 GB alive past the bound
        # (and in front of every full GC pass).
        chunk.items = ()
        self._head += 1
        self.start_offset = self._next_start(self._head - 1)
        if self._head >= _COMPACT_AT and self._head * 2 >= len(self._chunks):
            del self._chunks[: self._head], self._starts[: self._head]
            self._head = 0

    def read(self, offset: int, max_records: int, max_bytes: int, end: int) -> list[Record] | None:
        """Records from ``offset`` below ``end`` (the partition's visible end) as
        Partition.read would return them; None when ``offset`` is below the cache."""
        if offset < self.start_offset:
            return None
        if offset >= self.end_offset or offset >= end:
            return []
        max_records = min(max_records, end - offset)
        i = bisect.bisect_right(self._starts, offset, lo=self._head) - 1
        out: list[Record] = []
        budget = max_bytes
        while i < len(self._chunks) and len(out) < max_records:
            chunk = self._chunks[i]
            records = chunk.records(self._partition)
            skip = offset - chunk.first_offset if not out else 0
            for record in records[skip : skip + max_records - len(out)]:
                budget -= len(record.value)
                if budget < 0 and out:
                    return out  # at least one record, even a large one
                out.append(record)
            i += 1
        return out

    def truncate(self, offset: int) -> None:
        """Forget every record at or after ``offset`` (the log was cut there)."""
        if offset >= self.end_offset:
            return
        while len(self._chunks) > self._head and self._starts[-1] >= offset:
            chunk = self._chunks.pop()
            self._starts.pop()
            self._bytes -= chunk.size
        if len(self._chunks) > self._head:
            chunk = self._chunks[-1]
            kept = chunk.items[: offset - chunk.first_offset]
            size = sum(len(r.value) for r in kept) + _RECORD_OVERHEAD * len(kept)
            self._bytes += size - chunk.size
            chunk.items, chunk.size = kept, size
        else:
            self.start_offset = min(self.start_offset, offset)
        self.end_offset = offset

    def reset(self, offset: int) -> None:
        """Empty, from ``offset`` on (the records below it are left to file reads)."""
        for chunk in self._chunks[self._head :]:
            chunk.items = ()
        self._chunks, self._starts, self._head, self._bytes = [], [], 0, 0
        self.start_offset = self.end_offset = offset

    def find_timestamp(self, timestamp: int) -> int | None:
        """The first cached offset with a timestamp >= ``timestamp``, or the end; None
        when an earlier record, not cached, might be the answer."""
        if self._head == len(self._chunks) or self._chunks[self._head].timestamp >= timestamp:
            return None
        i = bisect.bisect_left(self._chunks, timestamp, lo=self._head, key=_chunk_timestamp)
        return self._starts[i] if i < len(self._chunks) else self.end_offset


def _chunk_timestamp(chunk: _Chunk) -> int:
    return chunk.timestamp
