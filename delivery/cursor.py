"""The per-partition cursor of one subscription: ack floor, done offsets above it, and
the read position for first deliveries.

PROTOCOL §5: every offset below the ack floor is acked or dead-lettered. "Done" here is
acked, dead-lettered, sent at-most-once, or expired by retention: offsets that will
never be sent again. Snapshots use storage/cursors.py's half-open ranges.
"""

from __future__ import annotations

from collections import deque

from storage.cursors import PartitionCursor, offsets_to_ranges, ranges_to_offsets
from storage.record import Record


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
        self.done: set[int] = set(ranges_to_offsets(cursor.acked))
        # Next offset to read for a first delivery; everything in [floor, fetch_offset)
        # not done is in flight, waiting for redelivery, held by key or buffered.
        self.fetch_offset = cursor.ack_floor
        self.buffer: deque[Record] = deque()  # read, not yet sent; offsets ascending
        self.start_offset = 0
        self.end_offset = cursor.ack_floor
        self.reading = False  # a ReadRequest is out
        # Bumped by a seek: reads, redelivery refs and dead letters of an older epoch
        # are stale and dropped when they come back.
        self.epoch = 0

    def mark_done(self, offset: int) -> bool:
        """Record that ``offset`` will never be sent again; False if it already was."""
        floor = self.ack_floor
        if offset == floor:
            floor += 1
            done = self.done
            if done:
                while floor in done:
                    done.remove(floor)
                    floor += 1
            self.ack_floor = floor
            return True
        if offset < floor or offset in self.done:
            return False
        self.done.add(offset)
        return True

    def is_done(self, offset: int) -> bool:
        return offset < self.ack_floor or offset in self.done

    def backlog(self) -> int:
        """Records not yet done, in flight included (PROTOCOL §5 `backlog`)."""
        return max(0, self.end_offset - self.ack_floor - len(self.done))

    def has_unread(self) -> bool:
        return self.fetch_offset < self.end_offset

    def snapshot(self) -> PartitionCursor:
        return PartitionCursor(self.ack_floor, offsets_to_ranges(sorted(self.done)))

    def reset(self, offset: int) -> int:
        """Seek: replay from ``offset`` (PROTOCOL §2 seek). Returns buffered records dropped."""
        dropped = len(self.buffer)
        self.ack_floor = offset
        self.done.clear()
        self.fetch_offset = offset
        self.buffer.clear()
        self.reading = False
        self.epoch += 1
        return dropped

    def expire_below(self, start: int) -> tuple[int, int]:
        """Retention moved the log start past the cursor (PROTOCOL §1 Retention): skip
        forward. Returns (records expired, buffered records dropped)."""
        self.start_offset = max(self.start_offset, start)
        if start <= self.ack_floor:
            return 0, 0
        below = [offset for offset in self.done if offset < start]
        expired = start - self.ack_floor - len(below)
        self.done.difference_update(below)
        self.ack_floor = start
        while self.ack_floor in self.done:
            self.done.remove(self.ack_floor)
            self.ack_floor += 1
        dropped = 0
        buffer = self.buffer
        if self.fetch_offset < start:
            # A read still out returns records from the log start; feed() skips what is
            # below fetch_offset, so it needs no new epoch.
            dropped = len(buffer)
            buffer.clear()
            self.fetch_offset = start
        else:
            while buffer and buffer[0].offset < start:
                buffer.popleft()
                dropped += 1
        self.end_offset = max(self.end_offset, start)
        return expired, dropped
