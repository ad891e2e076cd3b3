"""A log segment (Kafka's LogSegment): ``<base>.log`` plus its two sparse indexes.

The log file is the truth. Appends go through one descriptor owned by the writer
thread; reads open their own descriptor so that a segment
deleted by retention can never hand a reader a recycled file descriptor.

The writer's descriptors (the log's and the indexes') are opened on use: an idle
partition's are fsynced and closed (:meth:`LogSegment.release`, storage/open_files.py)
and open again at its next write, so a closed descriptor never holds unsynced bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from storage.batch import (
    HEADER_SIZE,
    BatchHeader,
    EncodedBatch,
    check_batch,
    decode_batch,
    read_header,
)
from storage.durable import fsync_dir
from storage.errors import CorruptLog
from storage.index import OffsetIndex, TimeIndex
from storage.record import Record

READ_CHUNK = 1 << 20  # bytes read ahead when scanning a segment
REWRITE_SUFFIX = ".rewrite"  # a log's copy while it is rewritten (LogSegment._rewrite)


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    """One segment: appends, recovery of its tail, and the numbers the log needs."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.base_offset = base_offset
        self.path = directory / segment_name(base_offset, ".log")
        self._interval = index_interval_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._log_fd: int | None = fd
        offset_index = None
        try:
            offset_index = OffsetIndex(directory / segment_name(base_offset, ".index"), base_offset)
            self.time_index = TimeIndex(
                directory / segment_name(base_offset, ".timeindex"), base_offset
            )
        except OSError:
            if offset_index is not None:
                offset_index.close()
            os.close(fd)
            raise
        self.offset_index = offset_index
        self.sealed = False  # takes no more appends: see seal()
        self.size = os.fstat(fd).st_size  # readers never look past this
        self.next_offset = base_offset
        self.first_timestamp: int | None = None  # of the first batch: segment age
        self.last_timestamp: int | None = None  # of the last batch: time retention
        self._since_index = 0  # log bytes since the last index entry
        # Every fsync of the log goes through _sync_log (see there: fsyncgate).
        self._sync_lock = threading.Lock()
        self._synced_size = 0  # the log's bytes an fsync is known to have put on disk
        self._unsynced_from: int | None = None  # a write-back failed past this position
        self._lost_at: int | None = None  # ... and its bytes were gone when rewritten
        self.lost_offset: int | None = None  # the offset of the batch boundary there

    # -- the writer's descriptors -------------------------------------------------------

    @property
    def _fd(self) -> int:
        """The log's descriptor, opened again if it was released."""
        if self._log_fd is None:
            self._log_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        return self._log_fd

    @property
    def open_descriptors(self) -> int:
        """How many of its three files have a descriptor open now."""
        return (self._log_fd is not None) + self.offset_index.is_open + self.time_index.is_open

    def release(self) -> None:
        """fsync and close the writer's descriptors, leaving the segment as it is: the
        next use opens them again. Raises OSError (the files stay open) if the fsync
        fails, so that the error is seen by the next flush."""
        if not self.open_descriptors:
            return
        self.flush_all()
        self._close_files()

    def _close_files(self) -> None:
        try:
            if self._log_fd is not None:
                fd, self._log_fd = self._log_fd, None
                os.close(fd)
        finally:
            self.offset_index.close()
            self.time_index.close()

    # -- appends (writer thread) -------------------------------------------------------

    def append(self, batch: EncodedBatch) -> None:
        """Write one batch; on an I/O error cut the segment back to what it was and raise."""
        if self._lost_at is not None:
            raise self._lost_error()
        position = self.size
        entries = len(self.offset_index)
        try:
            _write_all(self._fd, batch.data)
            if self._since_index >= self._interval:
                self.offset_index.append(batch.base_offset, position)
                self.time_index.append(batch.first_timestamp, batch.base_offset)
        except OSError:
            self._cut(position, entries)
            raise
        if self._since_index >= self._interval:
            self._since_index = 0
        self._since_index += len(batch.data)
        if self.first_timestamp is None:
            self.first_timestamp = batch.first_timestamp
        self.last_timestamp = batch.last_timestamp
        # size before next_offset: a reader that sees the new end offset sees the bytes.
        self.size = position + len(batch.data)
        self.next_offset = batch.base_offset + batch.record_count

    def _cut(self, position: int, entries: int) -> None:
        # Best effort: if even the truncate fails, recovery cuts the torn tail on reopen.
        self._synced_size = min(self._synced_size, position)
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, position)
            self.offset_index.truncate_to_position(position)
            self.time_index.truncate(entries)

    def flush(self) -> None:
        # A released log was fsynced before its descriptor closed: nothing to do.
        if self._log_fd is not None:
            self._sync_log(self._log_fd, self.size, os.fdatasync, rewrite=True)

    def duplicate_descriptor(self) -> tuple[int, int] | None:
        """A descriptor of the log file of its own, for an fsync off the writer thread
        (sync_duplicate): a roll may close ours meanwhile, never the duplicate. With it,
        the size its fsync will cover. None when the log's descriptor is released (it
        was fsynced then)."""
        return None if self._log_fd is None else (os.dup(self._log_fd), self.size)

    @property
    def needs_rewrite(self) -> bool:
        """A write-back failed: only a flush on the writer thread may sync the log now."""
        return self._unsynced_from is not None or self._lost_at is not None

    def sync_duplicate(self, fd: int, size: int) -> None:
        """fdatasync through a descriptor from duplicate_descriptor, on any thread. After
        a failed write-back it raises instead (EIO): only the writer, which rewrites the
        lost pages first, may then call the log synced."""
        self._sync_log(fd, size, os.fdatasync, rewrite=False)

    def flush_all(self) -> None:
        """fsync the log and both indexes: done when the segment is closed or rolled."""
        if self._log_fd is not None:
            self._sync_log(self._log_fd, self.size, os.fsync, rewrite=True)
        self.offset_index.fsync()
        self.time_index.fsync()

    def _sync_log(self, fd: int, size: int, sync: Callable[[int], None], rewrite: bool) -> None:
        """fsync the log, which then holds its first ``size`` bytes.

        Linux reports a failed write-back once, to the first fsync after it (fsyncgate),
        and marks the pages clean: they are never written again, and the next fsync
        succeeds over them. A later acks=all publish was then answered while records
        before it were not on disk, and after a power loss the log held zeros in their
        place. So after a failure the log is rewritten (see _rewrite) before an fsync
        may succeed again.
        """
        with self._sync_lock:
            if self._lost_at is not None:
                raise self._lost_error()
            if self._unsynced_from is not None:
                if not rewrite:
                    raise OSError(errno.EIO, "a write-back failed: waiting for its rewrite")
                self._rewrite(self._unsynced_from, size)
            else:
                try:
                    sync(fd)
                except OSError:
                    self._unsynced_from = self._synced_size
                    raise
            self._synced_size = max(self._synced_size, size)

    def _rewrite(self, unsynced_from: int, size: int) -> None:
        """Copy the log to a new file, fsync it and rename it over the old one (the writer
        thread, every append written). Writing the lost bytes again in place is not
        enough: on ext4 a failed write-back can leave their blocks' extents "unwritten"
        (read back as zeros) while the cache says written, and no later write-back mends
        them. A new file gets new blocks. Readers keep the file they opened, or open the
        new one; both hold the same bytes. The copy of the bytes past ``unsynced_from``
        comes from the page cache: their CRCs are checked in the copy, and if the kernel
        evicted them meanwhile they are gone. The segment then takes no more writes and
        its index is cut, so that the next start's recovery cuts the log there (nothing
        past it was acknowledged as on disk)."""
        copy = self.path.with_name(self.path.name + REWRITE_SUFFIX)
        out = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for at in range(0, size, READ_CHUNK):
                _write_all(out, os.pread(self._fd, min(READ_CHUNK, size - at), at))
            position = unsynced_from
            try:
                for position, header, buf, at in iter_batches(out, unsynced_from, size):  # noqa: B007
                    check_batch(buf, at, header)
            except CorruptLog:
                self._lose_from(position)
                raise self._lost_error() from None
            os.fsync(out)
            os.replace(copy, self.path)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                copy.unlink()
            raise
        old, self._log_fd = self._log_fd, None
        if old is not None:
            os.close(old)
        os.close(out)  # opened again with O_APPEND on use
        fsync_dir(self.path.parent)  # raises OSError: the rename may not be durable yet
        self._unsynced_from = None

    def _lose_from(self, position: int) -> None:
        self._lost_at = position
        with contextlib.suppress(OSError):  # best effort: the disk is failing
            kept = self.offset_index.truncate_to_position(position)
            self.time_index.truncate(kept)
            self.offset_index.fsync()
            self.time_index.fsync()
        # The batches before the hole are whole: the last of them ends at its offset.
        offset, at = self.offset_index.lookup(self.next_offset)
        with contextlib.suppress(OSError, CorruptLog):
            for _, header, _, _ in iter_batches(self._fd, at, position):
                offset = header.next_offset
        self.lost_offset = offset

    def _lost_error(self) -> OSError:
        return OSError(
            errno.EIO,
            f"{self.path.name}: a failed write-back lost its bytes from {self._lost_at} on; "
            "restart to recover the log up to there",
        )

    def close(self) -> None:
        self.sealed = True
        self._close_files()

    def seal(self) -> None:
        """fsync and close the files of a segment that takes no more appends: only the
        active segment of a partition keeps descriptors open (readers open their own)."""
        if not self.sealed:
            self.flush_all()
            self.close()

    def unseal(self) -> None:
        """Take appends again (a truncation made this segment active); the files open
        on use."""
        self.sealed = False

    def delete(self) -> None:
        self.close()
        for path in self.files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def files(self) -> list[Path]:
        return [self.path, self.offset_index.path, self.time_index.path]

    # -- reads (any thread: a private descriptor, bounded by the size seen at the start) --

    def read(
        self,
        offset: int,
        max_records: int,
        max_bytes: int,
        end_offset: int,
        partition: int,
        at_least_one: bool = True,
    ) -> list[Record]:
        """Records from ``offset`` (< ``end_offset``): at most ``max_records``, and values
        adding up to at most ``max_bytes`` — but ``at_least_one`` even if it alone is
        larger. Raises FileNotFoundError when retention deleted the segment."""
        size = self.size
        _, position = self.offset_index.lookup(offset)
        out: list[Record] = []
        budget = max_bytes
        chunk = min(max(max_bytes + HEADER_SIZE, 1 << 16), READ_CHUNK * 4)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for _pos, header, buf, at in iter_batches(fd, position, size, chunk):
                if header.next_offset <= offset:
                    continue
                check_batch(buf, at, header)
                for record in decode_batch(buf, at, header, partition, offset):
                    budget -= len(record.value)
                    if record.offset >= end_offset or (budget < 0 and (out or not at_least_one)):
                        return out
                    out.append(record)
                    if len(out) >= max_records:
                        return out
        finally:
            os.close(fd)
        return out

    def read_batches(
        self, offset: int, max_bytes: int, end_offset: int, at_least_one: bool = True
    ) -> list[bytes]:
        """The stored bytes of whole batches from the one holding ``offset`` on, none
        beginning at or past ``end_offset``, up to ``max_bytes`` in all — but
        ``at_least_one`` even if it alone is larger. Each batch's CRC is checked. Raises
        FileNotFoundError like read()."""
        size = self.size
        _, position = self.offset_index.lookup(offset)
        out: list[bytes] = []
        budget = max_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for _pos, header, buf, at in iter_batches(fd, position, size):
                if header.next_offset <= offset:
                    continue
                if header.base_offset >= end_offset or (
                    header.length > budget and (out or not at_least_one)
                ):
                    break
                check_batch(buf, at, header)
                out.append(bytes(buf[at : at + header.length]))
                budget -= header.length
        finally:
            os.close(fd)
        return out

    def last_header(self) -> BatchHeader | None:
        """The header of the last batch (hopping from the last index entry), if any."""
        _, position = self.offset_index.last()
        last = None
        for last in self.batch_headers(position):  # noqa: B007 (the loop finds the last)
            pass
        return last

    def batch_headers(self, position: int = 0) -> Iterator[BatchHeader]:
        """Every batch header from ``position`` on, hopping from one to the next (reads
        headers only)."""
        fd = os.open(self.path, os.O_RDONLY)  # sealed segments keep no descriptor
        try:
            while position < self.size:
                header = read_header(os.pread(fd, HEADER_SIZE, position))
                yield header
                position += header.length
        finally:
            os.close(fd)

    def find_timestamp(self, timestamp: int) -> int | None:
        """The first offset in this segment whose timestamp is >= ``timestamp``, if any."""
        if self.last_timestamp is None or self.last_timestamp < timestamp:
            return None
        start = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(start)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for _pos, header, buf, at in iter_batches(fd, position, self.size):
                if header.last_timestamp < timestamp:
                    continue
                check_batch(buf, at, header)
                for record in decode_batch(buf, at, header, 0):
                    if record.timestamp >= timestamp:
                        return record.offset
        finally:
            os.close(fd)
        return None

    # -- recovery ----------------------------------------------------------------------

    def recover(self, full: bool = False) -> int:
        """Load the indexes (rebuilding them if damaged), scan the log from the last index
        entry, and cut a torn or corrupt tail. Returns the bytes cut.

        ``full`` (the active segment after an unclean stop): every batch is checked, the
        indexes rebuilt, and the next fsync copies the log (_rewrite). What the page
        cache shows may not be on disk: a write-back that failed before the stop was
        reported to the old process's descriptor, never to this one's, so a plain fsync
        here would succeed over it (the storage tests found records acknowledged after
        such a restart lost in the next power cut)."""
        if full:
            self.offset_index.reset([])
            self.time_index.reset([])
            self._unsynced_from = 0
        else:
            try:
                self.offset_index.load(self.size)
                self.time_index.load(self.offset_index)
                self._check_last_entry()
            except CorruptLog:
                self.offset_index.reset([])
                self.time_index.reset([])
        self._read_first_timestamp()
        return self._scan_tail()

    def _check_last_entry(self) -> None:
        offset, position = self.offset_index.last()
        if not len(self.offset_index):
            return
        header = read_header(os.pread(self._fd, HEADER_SIZE, position))
        if header.base_offset != offset or header.first_timestamp != self.time_index.timestamps[-1]:
            raise CorruptLog(f"{self.offset_index.path.name}: last entry does not match the log")

    def _read_first_timestamp(self) -> None:
        with contextlib.suppress(CorruptLog):
            self.first_timestamp = read_header(os.pread(self._fd, HEADER_SIZE, 0)).first_timestamp

    def _scan_tail(self) -> int:
        start_size = self.size
        while True:
            expected, position = self.offset_index.last()
            scanned = self._scan_from(expected, position)
            if scanned is not None or position == 0:
                break
            # The batch the last index entry points at is itself torn: drop that entry and
            # scan again from the one before, so the tail's last timestamp is known.
            self.truncate_to_position(position, expected)
        end_offset, end_position = scanned if scanned is not None else (expected, position)
        if end_position < self.size:
            self.truncate_to_position(end_position, end_offset)
            os.fsync(self._fd)
        self.next_offset = end_offset
        if end_position == 0:
            self.first_timestamp = self.last_timestamp = None
        return start_size - self.size

    def _scan_from(self, expected: int, position: int) -> tuple[int, int] | None:
        """Check batches from ``position`` on, indexing as appends would. Returns the
        (next offset, position) after the last whole batch; None when not even the first
        batch is whole."""
        self._since_index = 0
        scanned = None
        with contextlib.suppress(CorruptLog):  # the tail after `scanned` is torn: cut it
            for pos, header, buf, at in iter_batches(self._fd, position, self.size):
                check_batch(buf, at, header)
                if header.base_offset != expected:
                    raise CorruptLog(f"batch at {pos} has offset {header.base_offset}")
                if self._since_index >= self._interval:
                    self.offset_index.append(header.base_offset, pos)
                    self.time_index.append(header.first_timestamp, header.base_offset)
                    self._since_index = 0
                self._since_index += header.length
                self.last_timestamp = header.last_timestamp
                expected, position = header.next_offset, pos + header.length
                scanned = (expected, position)
        return scanned

    def truncate_to_offset(self, offset: int, partition: int) -> list[Record]:
        """Cut the log at the batch holding ``offset``; returns the records of that batch
        before ``offset``, which the caller writes back."""
        _, position = self.offset_index.lookup(offset)
        keep: list[Record] = []
        cut_at, cut_offset = self.size, self.next_offset
        for pos, header, buf, at in iter_batches(self._fd, position, self.size):
            if header.next_offset > offset:
                if header.base_offset < offset:
                    records = decode_batch(buf, at, header, partition)
                    keep = records[: offset - header.base_offset]
                cut_at, cut_offset = pos, header.base_offset
                break
        self.truncate_to_position(cut_at, cut_offset)
        self._scan_tail()  # the last timestamp is now an earlier batch's
        if self.size == 0:
            self.first_timestamp = None
        return keep

    def truncate_to_position(self, position: int, next_offset: int) -> None:
        """Cut the log at a batch boundary (recovery, replication truncation)."""
        self._synced_size = min(self._synced_size, position)
        if self._lost_at is not None and position <= self._lost_at:
            # Cut below the hole (a follower cutting back to fetch again): the log takes
            # writes again, and the next fsync still rewrites what was not synced.
            self._lost_at = self.lost_offset = None
            self._unsynced_from = min(self._unsynced_from or 0, position)
        os.ftruncate(self._fd, position)
        kept = self.offset_index.truncate_to_position(position)
        self.time_index.truncate(kept)
        self.size = position
        self.next_offset = next_offset
        self._since_index = position - self.offset_index.last()[1]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def iter_batches(
    fd: int, position: int, end: int, chunk: int = READ_CHUNK
) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
    """Yield (file position, header, buffer, position in buffer) for each batch between
    ``position`` and ``end``. The buffer holds the whole batch; its CRC is not checked
    here. Raises CorruptLog at a header that cannot be a batch or a batch cut by ``end``.
    """
    buf = b""
    buf_start = position  # file position of buf[0]
    while position < end:
        at = position - buf_start
        if len(buf) - at < HEADER_SIZE:
            buf, buf_start, at = os.pread(fd, min(chunk, end - position), position), position, 0
        header = read_header(buf, at)
        if position + header.length > end:
            raise CorruptLog(f"torn batch at {position}")
        if len(buf) - at < header.length:
            size = min(max(chunk, header.length), end - position)
            buf, buf_start, at = os.pread(fd, size, position), position, 0
        yield position, header, buf, at
        position += header.length
