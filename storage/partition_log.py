"""PartitionLog: the synchronous core of one partition (Kafka's Log + LogLoader).

One writer thread owns every mutation (appends, rolls, retention, truncation); any
thread may read. Readers take a snapshot of the segment tuple, which mutations replace
rather than change, and open segment files themselves; so retention can delete a
segment under a reader, who then starts again from the new start offset.

The active segment's descriptors count against an :class:`OpenFiles` bound: every
mutation holds the log's files lock and then reports its descriptors; when another
partition needs room, an idle log's are fsynced and closed (:meth:`release_files`,
which only tries the lock) and open again, transparently, at its next mutation.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from herald.protocol.errors import StorageUnavailable
from storage.batch import EncodedBatch, as_encoded, check_batch, encode_batch, read_header
from storage.durable import fsync_dir, make_dirs
from storage.epochs import CorruptCheckpoint, LeaderEpochCache, StaleEpoch
from storage.open_files import OpenFiles
from storage.record import NewRecord, Record
from storage.segment import REWRITE_SUFFIX, LogSegment

log = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
_MAX_SEGMENT_BYTES = (1 << 32) - 1  # index positions are u32
_MAX_SEGMENT_RECORDS = (1 << 32) - 1  # index offsets are relative u32
_READ_RETRIES = 3  # retention deleting segments under one read, in a row
_CLEAN_MARKER = "clean-shutdown"  # left by close(), taken by the next open


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 128 * 1024 * 1024  # roll to a new segment past this size
    segment_ms: int = 7 * 24 * 3600 * 1000  # ... or when its first record is this old
    index_interval_bytes: int = 4096  # an index entry every this many bytes of log

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= _MAX_SEGMENT_BYTES:
            raise ValueError("segment_bytes must be in 1..4 GiB")


@dataclass(frozen=True, slots=True)
class DetachedSync:
    """An fsync of the active segment's log off the writer thread: a descriptor of its
    own and the log size it covers."""

    segment: LogSegment
    fd: int
    size: int


class PartitionLog:
    """The segments of one partition, opened (and recovered) in the constructor."""

    def __init__(
        self,
        directory: Path,
        partition: int = 0,
        config: LogConfig | None = None,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.directory = directory
        self.partition = partition
        self.config = config or LogConfig()
        self._open_files = open_files or OpenFiles()
        # Held by every mutation (the writer thread, or the opening thread); the open-
        # files bound only ever tries it, to close an idle log's descriptors.
        self._files_lock = threading.RLock()
        self._reported_files = 0  # what this log last told _open_files it holds
        self._fsyncs = 0  # by flush(), on the writer thread
        self._detached_fsyncs = 0  # by flush_detached(), off it
        self.recovered_bytes = 0  # torn or corrupt tail bytes cut while opening
        self._segments: tuple[LogSegment, ...] = ()
        self.closed = False
        with self._using_files():
            self._load()
            self.last_timestamp: int | None = self._newest_timestamp()
            self.epochs = self._load_epochs()

    # -- opening -----------------------------------------------------------------------

    def _load(self) -> None:
        make_dirs(self.directory)  # a new topic's directories are durable before its 201
        clean = self._take_clean_marker()
        bases = self._segment_bases()
        segments: list[LogSegment] = []
        try:
            for base in bases:
                if segments:
                    segments[-1].seal()  # one segment's descriptors open at a time
                segment = LogSegment(self.directory, base, self.config.index_interval_bytes)
                segments.append(segment)
                # Each segment's tail is checked: only the last can be torn by a crash
                # (rolls fsync the old one), and it costs a scan of ~one index interval.
                # After an unclean stop the last is checked whole, and copied at its
                # first fsync (LogSegment.recover).
                self.recovered_bytes += segment.recover(full=not clean and base == bases[-1])
            if not segments:
                segments.append(LogSegment(self.directory, 0, self.config.index_interval_bytes))
                fsync_dir(self.directory)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        self._segments = tuple(segments)

    def _take_clean_marker(self) -> bool:
        """Whether the last close was clean (close() left the marker); the marker goes
        now, durably, so that a crash from here on is seen as one."""
        marker = self.directory / _CLEAN_MARKER
        try:
            marker.unlink()
        except FileNotFoundError:
            return False
        fsync_dir(self.directory)
        return True

    def _load_epochs(self) -> LeaderEpochCache:
        try:
            epochs = LeaderEpochCache.load(self.directory, self.start_offset)
            if epochs.latest_epoch == 0 and self._last_epoch() > 0:
                raise CorruptCheckpoint("the checkpoint is missing")
        except CorruptCheckpoint as exc:
            log.warning("%s: rebuilding the leader epoch cache (%s)", self.directory, exc)
            epochs = LeaderEpochCache(self.directory, [])
            for segment in self._segments:
                for header in segment.batch_headers():
                    epochs.assign(header.leader_epoch, header.base_offset)
        # An epoch noted just before its first batch, which a crash then tore off.
        epochs.truncate_from_end(self.end_offset)
        return epochs

    def _last_epoch(self) -> int:
        """The epoch of the newest batch (epochs never go down: none means all are 0)."""
        for segment in reversed(self._segments):
            header = segment.last_header()
            if header is not None:
                return header.leader_epoch
        return 0

    def _segment_bases(self) -> list[int]:
        logs: set[int] = set()
        others: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            match = _SEGMENT_FILE.match(path.name)
            if match is None:
                if path.name.endswith(REWRITE_SUFFIX):  # a crash cut its rewrite short
                    path.unlink()
                continue
            if match.group(2) == "log":
                logs.add(int(match.group(1)))
            else:
                others.append((int(match.group(1)), path))
        for base, path in others:
            if base not in logs:  # an index whose log was deleted: derived data, drop it
                path.unlink()
        return sorted(logs)

    # -- the open-files bound (storage/open_files.py) -----------------------------------

    def _using_files(self) -> _FilesInUse:
        """Hold the files lock for a mutation, then report the descriptors it left open
        (this log becomes the most recently used; others may be released)."""
        return _FilesInUse(self)

    def _report_files(self) -> None:
        if not self._segments or self.closed:
            return
        count = self._segments[-1].open_descriptors
        # Still the most recent with as many files: nobody closed ours since (only
        # another log's report closes files, and it would be the most recent then).
        if count != self._reported_files or self._open_files.most_recent is not self:
            self._reported_files = count
            self._open_files.used(self, count)

    def release_files(self) -> int:
        """fsync and close the active segment's descriptors unless a mutation is running
        (the lock is only tried); how many were closed."""
        if not self._files_lock.acquire(blocking=False):
            return 0
        try:
            if self.closed or not self._segments:
                return 0
            active = self._segments[-1]
            count = active.open_descriptors
            try:
                active.release()
            except OSError as exc:  # kept open: the next flush reports it
                log.warning("%s: cannot fsync before closing its files: %s", self.directory, exc)
                return 0
            return count
        finally:
            self._files_lock.release()

    # -- what everyone may look at -----------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The next offset to be written."""
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def lost_offset(self) -> int | None:
        """Where the log lost its records after a failed write-back (the kernel dropped
        the pages before their rewrite), or None: from there on it takes no appends
        until it is cut below that offset (a replica fetching them again) or reopened."""
        return self._segments[-1].lost_offset

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._segments

    # -- writer thread -----------------------------------------------------------------

    def append(self, records: Sequence[NewRecord], timestamp: int, leader_epoch: int = 0) -> int:
        """Append ``records`` stamped ``timestamp`` (written, not fsynced) under
        ``leader_epoch``; returns the first offset. Raises StorageUnavailable on an I/O
        error, the log unchanged, and StaleEpoch for an epoch older than the log's."""
        with self._files_lock:  # _using_files() inlined: the hot path
            try:
                self._note_epoch(leader_epoch, self.end_offset)
                batch = encode_batch(self.end_offset, records, timestamp, leader_epoch)
                return self._append(batch)
            finally:
                self._report_files()

    def append_at(
        self, offset: int, records: Sequence[tuple[NewRecord, int]], leader_epoch: int = 0
    ) -> int:
        """Append records with their own timestamps at ``offset``, which must be the end
        offset (a replica copying its leader). Returns ``offset``."""
        with self._using_files():
            if offset != self.end_offset:
                raise ValueError(f"append_at({offset}) but the log ends at {self.end_offset}")
            self._note_epoch(leader_epoch, offset)
            timestamps = [ts for _, ts in records]
            batch = encode_batch(offset, [r for r, _ in records], timestamps, leader_epoch)
            return self._append(batch)

    def append_batches(self, data: bytes | memoryview) -> int:
        """Append batches byte for byte as another replica stored them (a follower copying
        its leader: the CRC computed by the leader is checked here, end to end). They
        must begin at the end offset, follow each other, and never lower the epoch; all
        of them are checked before any is written. Returns the new end offset. Raises
        CorruptLog, ValueError (not contiguous) or StaleEpoch, the log unchanged, or
        StorageUnavailable, the log cut back to where it was (if that cut fails too,
        end_offset says where it ends)."""
        view = memoryview(data)
        batches: list[EncodedBatch] = []
        expected, epoch, pos = self.end_offset, self.epochs.latest_epoch, 0
        while pos < len(view):
            header = read_header(view, pos)
            check_batch(view, pos, header)
            if header.base_offset != expected:
                raise ValueError(
                    f"batch at offset {header.base_offset} where offset {expected} was expected"
                )
            if header.leader_epoch < epoch:
                raise StaleEpoch(f"batch of epoch {header.leader_epoch} after epoch {epoch}")
            batches.append(as_encoded(bytes(view[pos : pos + header.length]), header))
            expected, epoch, pos = header.next_offset, header.leader_epoch, pos + header.length
        with self._using_files():
            start = self.end_offset
            try:
                for batch in batches:
                    self._note_epoch(batch.leader_epoch, batch.base_offset)
                    self._append(batch)
            except StorageUnavailable:
                # A later batch failed (a new epoch's checkpoint, say) after earlier ones
                # were written: all or nothing, as the checks before promise.
                if self.end_offset != start:
                    try:
                        self._truncate_to(start)
                    except Exception:  # end_offset then says where the log ends
                        log.exception("cannot cut partition %d back", self.partition)
                raise
            return self.end_offset

    def _note_epoch(self, epoch: int, start_offset: int) -> None:
        if epoch != self.epochs.latest_epoch:  # rare: a change of leader
            try:
                self.epochs.assign(epoch, start_offset)
            except OSError as exc:
                raise StorageUnavailable(
                    f"cannot write the epoch checkpoint of partition {self.partition}: {exc}"
                ) from exc

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch`` in this log, the offset where it ended): what a
        leader answers a returning replica, which truncates there (KIP-101)."""
        return self.epochs.end_offset_for(epoch, self.end_offset)

    def _append(self, batch: EncodedBatch) -> int:
        if self.closed:
            raise StorageUnavailable(f"partition {self.partition} is closed")
        try:
            if self._should_roll(batch):
                self._roll()
            self._segments[-1].append(batch)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write partition {self.partition}: {exc}") from exc
        if self.last_timestamp is None or batch.last_timestamp > self.last_timestamp:
            self.last_timestamp = batch.last_timestamp
        return batch.base_offset

    def _should_roll(self, batch: EncodedBatch) -> bool:
        active = self._segments[-1]
        if active.size == 0:
            return False
        assert active.first_timestamp is not None
        return (
            active.size + len(batch.data) > self.config.segment_bytes
            or batch.last_timestamp - active.first_timestamp >= self.config.segment_ms
            or batch.base_offset + batch.record_count - active.base_offset > _MAX_SEGMENT_RECORDS
        )

    def _roll(self) -> None:
        old = self._segments[-1]
        old.seal()  # only the active segment may then hold unsynced bytes
        new = LogSegment(self.directory, old.next_offset, self.config.index_interval_bytes)
        try:
            fsync_dir(self.directory)
        except OSError:
            new.delete()
            raise
        self._segments = (*self._segments, new)

    def flush(self) -> None:
        """fsync what was appended so far (after a failed write-back, rewriting what it
        may have lost first: LogSegment._sync_log). Raises StorageUnavailable if that
        fails."""
        with self._files_lock:
            if self.closed:
                return
            try:
                self._segments[-1].flush()
            except OSError as exc:
                raise StorageUnavailable(f"cannot fsync partition {self.partition}: {exc}") from exc
            self._fsyncs += 1

    def sync_recovered(self) -> None:
        """fsync the active segment's log right after opening (not counted in
        fsync_count): records a crashed process left in the page cache are durable
        before a replica reports them fsynced. Sealed segments were fsynced by their roll."""
        with self._files_lock:
            try:
                self._segments[-1].flush()
            except OSError as exc:
                raise StorageUnavailable(f"cannot fsync partition {self.partition}: {exc}") from exc

    def flush_descriptor(self) -> DetachedSync | None:
        """What flush_detached needs, taken in queue order on the writer thread (None
        once closed, or when the active segment's files are released: they were fsynced
        then): the fsync then covers every append written so far. After a failed
        write-back the log is flushed here instead, which rewrites it (None then too)."""
        with self._files_lock:
            if self.closed:
                return None
            active = self._segments[-1]
            if active.needs_rewrite:  # with acks=1 alone, nothing else would mend it
                self.flush()
                return None
            try:
                duplicate = active.duplicate_descriptor()
            except OSError as exc:
                raise StorageUnavailable(f"cannot fsync partition {self.partition}: {exc}") from exc
            return None if duplicate is None else DetachedSync(active, *duplicate)

    def flush_detached(self, detached: DetachedSync) -> None:
        """fsync through ``detached`` (from flush_descriptor) and close its descriptor, on
        any thread but the writer's, so appends go on while it runs: a periodic fsync of
        Acks.LEADER data can take tens of ms when the disk is busy, and appends queued
        behind it would wait as long (Kafka's log flusher does not hold appends up
        either). After a failed write-back it fails until the writer's flush() has
        rewritten what was lost."""
        try:
            detached.segment.sync_duplicate(detached.fd, detached.size)
        except OSError as exc:
            raise StorageUnavailable(f"cannot fsync partition {self.partition}: {exc}") from exc
        finally:
            os.close(detached.fd)
        self._detached_fsyncs += 1

    @property
    def fsync_count(self) -> int:
        """fsyncs made by flush() and flush_detached(): lets tests see group commit."""
        return self._fsyncs + self._detached_fsyncs

    def apply_retention(
        self, now_ms: int, retention_ms: int | None, retention_bytes: int | None
    ) -> int:
        """Delete whole segments past retention; returns how many were deleted. The
        active segment is rolled first when all of it is past the time limit, so that
        it can go too; offsets are never reused."""
        with self._using_files():
            return self._apply_retention(now_ms, retention_ms, retention_bytes)

    def _apply_retention(
        self, now_ms: int, retention_ms: int | None, retention_bytes: int | None
    ) -> int:
        deleted = 0
        if retention_ms is not None:
            cutoff = now_ms - retention_ms
            active = self._segments[-1]
            if active.last_timestamp is not None and active.last_timestamp < cutoff:
                self._roll()
            while len(self._segments) > 1 and _expired(self._segments[0], cutoff):
                self._delete_oldest()
                deleted += 1
        if retention_bytes is not None:
            while (
                len(self._segments) > 1
                and self.size_bytes - self._segments[0].size >= retention_bytes
            ):
                self._delete_oldest()
                deleted += 1
        if deleted:
            self.epochs.truncate_from_start(self.start_offset)
        return deleted

    def _delete_oldest(self) -> None:
        oldest = self._segments[0]
        self._segments = self._segments[1:]  # readers see the new start before the unlink
        oldest.delete()

    def reset_to(self, offset: int) -> None:
        """Drop every record and go on with an empty log starting at ``offset`` (Kafka's
        truncateFullyAndStartAt): a follower whose end fell below its leader's log start,
        which retention moved past it, copies from the leader's start. The new segment
        is made (and its directory entry made durable) before the old ones go, so a crash
        in between leaves the new start or the old log, never a log restarting at 0."""
        if offset < 0:
            raise ValueError(f"reset_to({offset}): offsets are not negative")
        with self._using_files():
            self._reset_to(offset)

    def _reset_to(self, offset: int) -> None:
        old = self._segments
        reused = next((s for s in old if s.base_offset == offset), None)
        if reused is not None:
            reused.unseal()
            reused.truncate_to_position(0, offset)
            reused.first_timestamp = reused.last_timestamp = None
            new = reused
        else:
            new = LogSegment(self.directory, offset, self.config.index_interval_bytes)
        try:
            fsync_dir(self.directory)
        except OSError:
            if new is not reused:
                new.delete()
            raise
        self._segments = (new,)  # readers see the new start before the unlinks
        for segment in old:
            if segment is not new:
                segment.delete()
        fsync_dir(self.directory)
        self.epochs.clear()
        self.last_timestamp = None

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset`` (a replica diverging from its
        leader). A batch cut in the middle is rewritten with the records before ``offset``."""
        with self._using_files():
            self._truncate_to(offset)

    def _truncate_to(self, offset: int) -> None:
        if offset >= self.end_offset:
            return
        if offset < self.start_offset:
            raise ValueError(f"truncate_to({offset}) below the start offset {self.start_offset}")
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            newest = self._segments[-1]
            self._segments = self._segments[:-1]
            newest.delete()
        kept_epoch = self.epochs.epoch_at(offset - 1)  # of a batch cut in the middle
        active = self._segments[-1]
        active.unseal()
        keep = active.truncate_to_offset(offset, self.partition)
        self.epochs.truncate_from_end(offset)
        self.last_timestamp = self._newest_timestamp()
        if keep:
            self.append_at(
                keep[0].offset, [(_as_new(r), r.timestamp) for r in keep], max(kept_epoch, 0)
            )

    def _newest_timestamp(self) -> int | None:
        for segment in reversed(self._segments):
            if segment.last_timestamp is not None:
                return segment.last_timestamp
        return None

    def close(self) -> None:
        """fsync and close every file."""
        with self._files_lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._segments[-1].flush_all()
                (self.directory / _CLEAN_MARKER).touch()
                fsync_dir(self.directory)
            finally:
                for segment in self._segments:
                    with contextlib.suppress(OSError):
                        segment.close()
                self._open_files.released(self)

    # -- any thread --------------------------------------------------------------------

    def read(
        self, offset: int, max_records: int, max_bytes: int, end_offset: int | None = None
    ) -> list[Record]:
        """Up to ``max_records`` records from ``offset`` (from the start offset if it is
        below), values adding up to at most ``max_bytes`` except that at least one record
        is returned if any exists. ``end_offset`` bounds the read at what callers may see."""
        for _ in range(_READ_RETRIES):
            offset = max(offset, self.start_offset)
            try:
                return self._read(offset, max_records, max_bytes, end_offset)
            except FileNotFoundError:
                continue  # retention deleted a segment under us: again from the new start
        return self._read(max(offset, self.start_offset), max_records, max_bytes, end_offset)

    def _read(
        self, offset: int, max_records: int, max_bytes: int, end_offset: int | None
    ) -> list[Record]:
        # The end first: a segment it counts in is already in the snapshot taken after it.
        end = self.end_offset if end_offset is None else min(end_offset, self.end_offset)
        segments = self._segments
        i = max(0, bisect.bisect_right([s.base_offset for s in segments], offset) - 1)
        out: list[Record] = []
        while i < len(segments) and offset < end and len(out) < max_records:
            if out and max_bytes <= 0:
                break
            segment = segments[i]
            i += 1
            if offset >= segment.next_offset:
                continue  # past this segment's records (or in a gap left by a cut tail)
            got = segment.read(
                offset, max_records - len(out), max_bytes, end, self.partition, not out
            )
            out += got
            max_bytes -= sum(len(r.value) for r in got)
            offset = got[-1].offset + 1 if got else offset
            if offset < min(segment.next_offset, end):
                break  # stopped inside the segment by a limit
        return out

    def read_batches(self, offset: int, max_bytes: int, end_offset: int | None = None) -> bytes:
        """Stored batches, as written, from the one holding ``offset`` (from the start
        offset if it is below): at least one whole batch, then up to ``max_bytes``, none
        beginning at or past ``end_offset``. What a leader ships to a follower, which
        appends them with append_batches; b"" when there is nothing from ``offset``."""
        for _ in range(_READ_RETRIES):
            try:
                return self._read_batches(max(offset, self.start_offset), max_bytes, end_offset)
            except FileNotFoundError:
                continue  # retention deleted a segment under us: again from the new start
        return self._read_batches(max(offset, self.start_offset), max_bytes, end_offset)

    def _read_batches(self, offset: int, max_bytes: int, end_offset: int | None) -> bytes:
        end = self.end_offset if end_offset is None else min(end_offset, self.end_offset)
        segments = self._segments
        i = max(0, bisect.bisect_right([s.base_offset for s in segments], offset) - 1)
        out: list[bytes] = []
        budget = max_bytes
        while i < len(segments) and offset < end:
            segment = segments[i]
            i += 1
            if offset >= segment.next_offset:
                continue
            got = segment.read_batches(offset, budget, end, at_least_one=not out)
            if not got:
                break
            out += got
            budget -= sum(len(b) for b in got)
            offset = read_header(got[-1]).next_offset
            if budget <= 0 or offset < segment.next_offset:
                break  # stopped inside the segment by the budget
        return b"".join(out)

    def offset_for_timestamp(self, timestamp: int) -> int:
        """The first offset whose timestamp is >= ``timestamp``, or the end offset."""
        for _ in range(_READ_RETRIES):
            try:
                for segment in self._segments:
                    found = segment.find_timestamp(timestamp)
                    if found is not None:
                        return found
                break
            except FileNotFoundError:
                continue
        return self.end_offset


class _FilesInUse:
    """PartitionLog._using_files: a class, not a generator, for the append path."""

    __slots__ = ("_log",)

    def __init__(self, log: PartitionLog) -> None:
        self._log = log

    def __enter__(self) -> None:
        self._log._files_lock.acquire()

    def __exit__(self, *exc: object) -> None:
        try:
            self._log._report_files()
        finally:
            self._log._files_lock.release()


def _expired(segment: LogSegment, cutoff: int) -> bool:
    return segment.last_timestamp is None or segment.last_timestamp < cutoff


def _as_new(record: Record) -> NewRecord:
    return NewRecord(
        record.value, record.kind, record.key, record.headers, record.producer_id, record.delay_ms
    )
