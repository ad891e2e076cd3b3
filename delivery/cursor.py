"""The per-partition cursor of one subscription: ack floor, done offsets above it, and
the read position for first deliveries.

PROTOCOL §5: every offset below the ack floor is acked or dead-lettered. "Done" here is
acked, dead-lettered, sent at-most-once, or expired by retention: offsets that will
never be sent again. Snapshots use storage/cursors.py's half-open ranges.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable

from storage.cursors import PartitionCursor, Range
from storage.record import Record


class OffsetRuns:
    """A set of offsets kept as sorted, disjoint, non-adjacent half-open runs.

    The done offsets above an ack floor: usually a few gaps, but a record that stays
    unacked for long (a delayed record waiting days for its deliver_at, PROTOCOL §8)
    keeps the floor below it while everything after it is acked — one run, however many
    offsets, instead of a set of millions of ints (and of a sort per cursor flush).
    """

    __slots__ = ("_count", "_ends", "_starts")

    def __init__(self, runs: Iterable[Range] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for start, end in runs:
            if end > start:
                self._starts.append(start)
                self._ends.append(end)
                self._count += end - start

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self._starts, offset)
        return i > 0 and offset < self._ends[i - 1]

    def add(self, offset: int) -> bool:
        """Add ``offset``; False if it was there already."""
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, offset)
        if i > 0 and offset < ends[i - 1]:
            return False
        joins_left = i > 0 and ends[i - 1] == offset
        joins_right = i < len(starts) and starts[i] == offset + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = offset + 1
        elif joins_right:
            starts[i] = offset
        else:
            starts.insert(i, offset)
            ends.insert(i, offset + 1)
        self._count += 1
        return True

    def take_run_at(self, offset: int) -> int:
        """If a run starts at ``offset``, remove it and return its end; else ``offset``.
        For an ack floor: nothing is stored below ``offset``."""
        if self._starts and self._starts[0] == offset:
            end = self._ends[0]
            del self._starts[0], self._ends[0]
            self._count -= end - offset
            return end
        return offset

    def remove_below(self, offset: int) -> int:
        """Remove every offset below ``offset``; returns how many there were."""
        starts, ends = self._starts, self._ends
        removed = 0
        i = 0
        while i < len(starts) and ends[i] <= offset:
            removed += ends[i] - starts[i]
            i += 1
        del starts[:i], ends[:i]
        if starts and starts[0] < offset:
            removed += offset - starts[0]
            starts[0] = offset
        self._count -= removed
        return removed

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self._count = 0

    def runs(self) -> tuple[Range, ...]:
        return tuple(zip(self._starts, self._ends, strict=True))


class PartitionState:
    """Cursor and first-delivery buffer of one partition (mutable, owned by the core)."""

    __slots__ = (
        "ack_floor",
        "buffer",
        "done",
        "end_offset",
        "epoch",
        "fetch_offset",
        "partition",
        "reading",
        "start_offset",
    )

    def __init__(self, partition: int, cursor: PartitionCursor) -> None:
        self.partition = partition
        self.ack_floor = cursor.ack_floor
        # Done offsets above the floor: only the gaps left by records still in flight or
        # waiting, so this stays small; the floor swallows runs as they close.
        self.done = OffsetRuns(cursor.acked)
        self.done.remove_below(self.ack_floor)
        self.ack_floor = self.done.take_run_at(self.ack_floor)
        # Next offset to read for a first delivery; everything in [floor, fetch_offset)
        # not done is in flight, waiting for redelivery, held by key or buffered.
        self.fetch_offset = self.ack_floor
        # Read, not yet sent; offsets ascending. None while empty: an empty deque holds
        # 760 bytes, and an idle tail has a partition state per partition (issue 27 §3).
        self.buffer: deque[Record] | None = None
        self.start_offset = 0
        self.end_offset = self.ack_floor
        self.reading = False  # a ReadRequest is out
        # Bumped by a seek: reads, redelivery refs and dead letters of an older epoch
        # are stale and dropped when they come back.
        self.epoch = 0

    def mark_done(self, offset: int) -> bool:
        """Record that ``offset`` will never be sent again; False if it already was."""
        floor = self.ack_floor
        if offset == floor:
            done = self.done
            self.ack_floor = done.take_run_at(floor + 1) if done else floor + 1
            return True
        if offset < floor:
            return False
        return self.done.add(offset)

    def is_done(self, offset: int) -> bool:
        return offset < self.ack_floor or offset in self.done

    def backlog(self) -> int:
        """Records not yet done, in flight included (PROTOCOL §5 `backlog`)."""
        return max(0, self.end_offset - self.ack_floor - len(self.done))

    def has_unread(self) -> bool:
        return self.fetch_offset < self.end_offset

    def snapshot(self) -> PartitionCursor:
        return PartitionCursor(self.ack_floor, self.done.runs())

    def reset(self, offset: int) -> int:
        """Seek: replay from ``offset`` (PROTOCOL §2 seek). Returns buffered records dropped."""
        dropped = len(self.buffer or ())
        self.ack_floor = offset
        self.done.clear()
        self.fetch_offset = offset
        self.buffer = None
        self.reading = False
        self.epoch += 1
        return dropped

    def expire_below(self, start: int) -> tuple[int, int]:
        """Retention moved the log start past the cursor (PROTOCOL §1 Retention): skip
        forward. Returns (records expired, buffered records dropped)."""
        self.start_offset = max(self.start_offset, start)
        if start <= self.ack_floor:
            return 0, 0
        below = self.done.remove_below(start)
        expired = start - self.ack_floor - below
        self.ack_floor = self.done.take_run_at(start)
        dropped = 0
        buffer = self.buffer
        if self.fetch_offset < start:
            # A read still out returns records from the log start; feed() skips what is
            # below fetch_offset, so it needs no new epoch.
            dropped = len(buffer or ())
            self.buffer = None
            self.fetch_offset = start
        elif buffer is not None:
            while buffer and buffer[0].offset < start:
                buffer.popleft()
                dropped += 1
            if not buffer:
                self.buffer = None
        self.end_offset = max(self.end_offset, start)
        return expired, dropped
