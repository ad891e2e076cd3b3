"""Sparse segment indexes (Kafka's OffsetIndex and TimeIndex).

Both are derived from the log: entries are appended after the batch they point at is
written, and recovery drops or rebuilds them when they disagree with the log. An entry
is added for a batch roughly every ``index_interval_bytes`` of log, and the two indexes
always get their entries together, for the same batches — which lets recovery check one
against the other.

The entries live in memory too (lists searched with bisect); the files only spare
recovery a full scan of the segments.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

from storage.errors import CorruptLog

_OFFSET_ENTRY = struct.Struct("<II")  # relative offset, file position of the batch
_TIME_ENTRY = struct.Struct("<qI")  # first timestamp of the batch, relative offset


class _IndexFile:
    """An append-only file of fixed-size entries. Its descriptor is opened on first use
    and may be closed between uses (storage/open_files.py): the entries are in memory."""

    def __init__(self, path: Path, entry: struct.Struct) -> None:
        self.path = path
        self.entry = entry
        self._fd: int | None = None
        self._descriptor()  # creates the file

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def load(self) -> list[tuple[int, ...]]:
        """Every entry in the file; raises CorruptLog when its size is not whole entries."""
        data = _read_all(self._descriptor())
        if len(data) % self.entry.size:
            raise CorruptLog(f"{self.path.name}: truncated entry")
        return list(self.entry.iter_unpack(data))

    def write(self, *fields: int) -> None:
        os.write(self._descriptor(), self.entry.pack(*fields))

    def reset(self, entries: list[tuple[int, ...]]) -> None:
        fd = self._descriptor()
        os.ftruncate(fd, 0)
        if entries:
            os.write(fd, b"".join(self.entry.pack(*e) for e in entries))

    def truncate(self, count: int) -> None:
        os.ftruncate(self._descriptor(), count * self.entry.size)

    def fsync(self) -> None:
        if self._fd is not None:  # closed: fsynced when it was closed (LogSegment.release)
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


class OffsetIndex:
    """Relative offset → file position of the batch starting there."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.base_offset = base_offset
        self.path = path
        self._file = _IndexFile(path, _OFFSET_ENTRY)
        self.offsets: list[int] = []  # relative offsets, strictly increasing
        self.positions: list[int] = []  # file positions, strictly increasing

    def load(self, log_size: int) -> None:
        """Load the file; CorruptLog when it is not a plausible index of this log."""
        entries = self._file.load()
        offsets = [e[0] for e in entries]
        positions = [e[1] for e in entries]
        for i in range(1, len(entries)):
            if offsets[i] <= offsets[i - 1] or positions[i] <= positions[i - 1]:
                raise CorruptLog(f"{self._file.path.name}: entries out of order")
        if positions and positions[-1] >= log_size:
            raise CorruptLog(f"{self._file.path.name}: entry beyond the log end")
        self.offsets, self.positions = offsets, positions

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        self._file.write(rel, position)
        self.offsets.append(rel)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or before ``offset``; the segment
        start when there is none."""
        i = bisect.bisect_right(self.offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.offsets[i], self.positions[i]

    def last(self) -> tuple[int, int]:
        if not self.offsets:
            return self.base_offset, 0
        return self.base_offset + self.offsets[-1], self.positions[-1]

    def __len__(self) -> int:
        return len(self.offsets)

    def truncate_to_position(self, position: int) -> int:
        """Drop the entries at or after ``position``; returns how many remain."""
        keep = bisect.bisect_left(self.positions, position)
        del self.offsets[keep:], self.positions[keep:]
        self._file.truncate(keep)
        return keep

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry with ``entries`` of (offset, position)."""
        self.offsets = [o - self.base_offset for o, _ in entries]
        self.positions = [p for _, p in entries]
        self._file.reset(list(zip(self.offsets, self.positions, strict=True)))

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()

    @property
    def is_open(self) -> bool:
        return self._file.is_open


class TimeIndex:
    """First timestamp of a batch → its offset, for the same batches as the OffsetIndex."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.base_offset = base_offset
        self.path = path
        self._file = _IndexFile(path, _TIME_ENTRY)
        self.timestamps: list[int] = []  # non-decreasing
        self.offsets: list[int] = []  # relative, as the OffsetIndex's

    def load(self, offset_index: OffsetIndex) -> None:
        """Load the file; CorruptLog unless it pairs entry for entry with ``offset_index``."""
        entries = self._file.load()
        timestamps = [e[0] for e in entries]
        offsets = [e[1] for e in entries]
        if offsets != offset_index.offsets:
            raise CorruptLog(f"{self._file.path.name}: disagrees with the offset index")
        if any(timestamps[i] < timestamps[i - 1] for i in range(1, len(timestamps))):
            raise CorruptLog(f"{self._file.path.name}: timestamps out of order")
        self.timestamps, self.offsets = timestamps, offsets

    def append(self, timestamp: int, offset: int) -> None:
        rel = offset - self.base_offset
        self._file.write(timestamp, rel)
        self.timestamps.append(timestamp)
        self.offsets.append(rel)

    def lookup(self, timestamp: int) -> int:
        """Offset of the last indexed batch whose first timestamp is < ``timestamp`` —
        where a scan for the first record at or after ``timestamp`` may start."""
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.base_offset + self.offsets[i]

    def last_timestamp(self) -> int | None:
        return self.timestamps[-1] if self.timestamps else None

    def truncate(self, count: int) -> None:
        del self.timestamps[count:], self.offsets[count:]
        self._file.truncate(count)

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry with ``entries`` of (timestamp, offset)."""
        self.timestamps = [t for t, _ in entries]
        self.offsets = [o - self.base_offset for _, o in entries]
        self._file.reset(list(zip(self.timestamps, self.offsets, strict=True)))

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()

    @property
    def is_open(self) -> bool:
        return self._file.is_open
