"""Partition: the awaitable facade of one partition log (docs/architecture.md).

Appends are handed to the partition's writer thread (group commit, storage.writer);
reads are served from an in-memory tail cache of decoded records (storage/tail_cache.py)
when they can be — caught-up consumers then read with no thread hop and no decode —
and otherwise from the files on a reader thread. All state here is touched on the event loop only.

Two ends: ``log_end_offset`` (LEO), what is written, and ``end_offset``, what readers
see. On a single node they are the same. Switched to the replicated mode
(:meth:`Partition.replicate`, PROTOCOL §7), the visible end is the high watermark the
cluster layer sets; reads, the tail cache, timestamps lookups, waiters and append
listeners all stop there, and leader appends go through the
:class:`storage.replicated.ReplicationHooks`. A follower copies its leader's batches
with :meth:`Partition.append_batches` and cuts its log with ``truncate_to`` /
``reset_to``, on the writer thread in queue order with everything else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TypeVar

from herald.protocol.errors import StorageUnavailable
from storage.open_files import OpenFiles
from storage.partition_log import DetachedSync, LogConfig, PartitionLog
from storage.record import Acks, NewRecord, Record
from storage.replicated import ReplicationHooks
from storage.tail_cache import DEFAULT_CACHE_BYTES, TailCache
from storage.writer import AppendRequest, TaskRequest, Writer, WriterPool

log = logging.getLogger(__name__)

T = TypeVar("T")
AppendListener = Callable[["Partition"], None]
LogListener = Callable[["Partition"], None]


class Partition:
    """One partition of a topic, as the layers above use it."""

    def __init__(
        self,
        topic: str,
        partition_log: PartitionLog,
        writers: WriterPool | None = None,
        *,
        reader: Executor | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.topic = topic
        self.partition = partition_log.partition
        self.log = partition_log  # the sync core: replication hooks, tests
        # Without a shared pool the partition gets a writer thread of its own.
        self._own_writers = writers is None
        self._writers = WriterPool(1) if writers is None else writers
        self._writer: Writer = self._writers.assign()
        self._reader = reader
        self._end = partition_log.end_offset  # visible: the high watermark when replicated
        self._leo = self._end  # written (and seen on the loop)
        # What was recovered at open counts as fsynced (Partition.open fsyncs it first).
        self._fsynced = self._end
        self._hooks: ReplicationHooks | None = None
        self._cache = TailCache(self.partition, cache_bytes, self._end)
        self._listeners: list[AppendListener] = []
        self._log_listeners: list[LogListener] = []
        self._waiters: dict[int, set[asyncio.Future[bool]]] = {}
        self._closed = False

    @classmethod
    async def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        *,
        writers: WriterPool | None = None,
        config: LogConfig | None = None,
        segment_bytes: int | None = None,
        reader: Executor | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        open_files: OpenFiles | None = None,
    ) -> Partition:
        """Open (recovering it off the loop) the log in ``directory``, which is
        ``<data_dir>/topics/<topic>/<partition>``; created when missing. ``writers`` is
        the shared writer pool (else a writer thread of its own); ``segment_bytes``
        overrides ``config.segment_bytes``; ``open_files`` is the bound on descriptors
        the partitions share (storage/open_files.py; else unbounded)."""
        config = config or LogConfig()
        if segment_bytes is not None:
            config = dataclasses.replace(config, segment_bytes=segment_bytes)
        partition_log = await asyncio.to_thread(_open_log, directory, partition, config, open_files)
        return cls(topic, partition_log, writers, reader=reader, cache_bytes=cache_bytes)

    # -- state -------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return min(self.log.start_offset, self._end)

    @property
    def end_offset(self) -> int:
        """The visible end: what readers may read below. On a single node the next offset
        to be written (advances once a batch is written); replicated, the high watermark."""
        return self._end

    @property
    def log_start_offset(self) -> int:
        """The log's first offset, visible end or not (what a leader tells followers)."""
        return self.log.start_offset

    @property
    def log_end_offset(self) -> int:
        """The log end (LEO): the next offset to be written, visible or not."""
        return self._leo

    @property
    def lost_offset(self) -> int | None:
        """PartitionLog.lost_offset: a replica's log that lost records from there on."""
        return self.log.lost_offset

    @property
    def fsynced_offset(self) -> int:
        """The end of what is known to be fsynced (<= log_end_offset)."""
        return self._fsynced

    @property
    def high_watermark(self) -> int:
        """The visible end (an alias of end_offset, in the words of PROTOCOL §7)."""
        return self._end

    @property
    def replicated(self) -> bool:
        return self._hooks is not None

    @property
    def hooks(self) -> ReplicationHooks | None:
        return self._hooks

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the log (-1 for an emptied log; 0 on a single node)."""
        return self.log.epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch`` in the log, the offset where it ends): what a
        leader answers a follower's divergence check (KIP-101/279); (-1, -1) if none."""
        return self.log.epochs.end_offset_for(epoch, self._leo)

    @property
    def size_bytes(self) -> int:
        return self.log.size_bytes

    @property
    def fsync_count(self) -> int:
        return self.log.fsync_count

    # -- appends -----------------------------------------------------------------------

    async def append(self, records: Sequence[NewRecord], acks: Acks) -> tuple[int, int]:
        """Append ``records`` as one batch -> (first offset, timestamp). Resolves once
        written (Acks.LEADER / NONE) or once fsynced (Acks.ALL, shared with every append
        of the same group). Raises StorageUnavailable, nothing of the batch acked."""
        hooks = self._hooks  # the commit is awaited under those the append ran under
        first, timestamp = await self.submit_local(records, acks)
        if hooks is not None:
            await hooks.wait_commit(first + len(records), acks)
        return first, timestamp

    async def append_local(self, records: Sequence[NewRecord], acks: Acks) -> tuple[int, int]:
        """The first half of a replicated append (Topic.publish records its producer ids
        between the halves: a batch whose commit then fails is in the log all the same,
        and a retry must find it): ``hooks.check_append`` (which may refuse: nothing is
        appended), then the local append stamped with ``hooks.epoch``. On a single node,
        the same as :meth:`append`."""
        return await self.submit_local(records, acks)

    def submit_local(
        self, records: Sequence[NewRecord], acks: Acks
    ) -> asyncio.Future[tuple[int, int]]:
        """:meth:`append_local` without the await: the records are with the writer when
        this returns, and the future resolves as append_local would."""
        if not records:
            raise ValueError("append needs at least one record")
        self._check_open()
        hooks = self._hooks
        epoch: int | None = None  # not replicated: the log's latest epoch
        if hooks is not None:
            hooks.check_append(acks)
            epoch = hooks.epoch
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()
        self._writer.submit(
            AppendRequest(
                self.log, records, acks, loop, future, self._on_written, epoch, self._on_synced
            )
        )
        return future

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:
        """The second half: ``hooks.wait_commit`` (acks=all: until the records below
        ``end_offset`` are committed; raises if they cannot be). Returns at once on a
        single node."""
        hooks = self._hooks
        if hooks is not None:
            await hooks.wait_commit(end_offset, acks)

    def _on_written(self, first: int, timestamp: int, records: Sequence[NewRecord]) -> None:
        # On the loop, in log order: the batch is written (and visible on a single node).
        self._cache.add(first, timestamp, records)
        self._leo = first + len(records)
        if self._hooks is None:
            self._end = self._leo
            self._wake_waiters()
            self._notify_append()
        if self._log_listeners:
            self._notify_log()

    def _on_synced(self, end: int) -> None:
        # On the loop: a group fsync covered the log up to ``end``.
        if end > self._fsynced:
            self._fsynced = min(end, self._leo)
            if self._log_listeners:
                self._notify_log()

    def _notify_append(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:
                log.exception("append listener failed")

    def _notify_log(self) -> None:
        for listener in list(self._log_listeners):
            try:
                listener(self)
            except Exception:
                log.exception("log listener failed")

    def add_log_listener(self, fn: LogListener) -> Callable[[], None]:
        """``fn(partition)`` runs on the loop whenever log_end_offset or fsynced_offset
        advances (visible or not): what a leader's replication state follows."""
        self._log_listeners.append(fn)

        def unsubscribe() -> None:
            if fn in self._log_listeners:
                self._log_listeners.remove(fn)

        return unsubscribe

    # -- the replicated mode -----------------------------------------------------------

    def replicate(
        self, hooks: ReplicationHooks | None, *, high_watermark: int | None = None
    ) -> None:
        """Switch to the replicated mode under ``hooks`` (a new leader epoch, or a follower
        whose hooks refuse appends), or back to a single node with None (the visible end
        is the log end again). ``high_watermark`` sets the visible end (clamped to the
        log end) — lower too, for a partition opened into a cluster before anyone reads
        it; otherwise it stays where it is and only set_high_watermark moves it."""
        self._hooks = hooks
        if hooks is None:
            self._set_visible(self._leo)
        elif high_watermark is not None:
            self._set_visible(max(0, min(high_watermark, self._leo)))

    def set_high_watermark(self, high_watermark: int) -> None:
        """Replicated: advance the visible end to ``high_watermark`` (clamped to the log
        end; never lowered here). Readers, waiters and append listeners see it now."""
        hw = min(high_watermark, self._leo)
        if hw > self._end:
            self._set_visible(hw)

    def _set_visible(self, end: int) -> None:
        advanced = end > self._end
        self._end = end
        if advanced:
            self._wake_waiters()
            self._notify_append()

    def _wake_waiters(self) -> None:
        for offset in [o for o in self._waiters if o < self._end]:
            for future in self._waiters.pop(offset):
                if not future.done():
                    future.set_result(True)

    def add_append_listener(self, fn: AppendListener) -> Callable[[], None]:
        """``fn(partition)`` runs on the loop after each batch becomes visible (replicated:
        each time the high watermark advances)."""
        self._listeners.append(fn)

        def unsubscribe() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)

        return unsubscribe

    async def wait_for(self, offset: int, timeout: float | None) -> bool:  # noqa: ASYNC109
        """True as soon as end_offset > ``offset``; False on timeout or close."""
        if self._end > offset:
            return True
        if self._closed:
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(offset, set())
        waiters.add(future)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return False
        finally:
            waiters.discard(future)
            if not waiters and self._waiters.get(offset) is waiters:
                del self._waiters[offset]

    # -- reads -------------------------------------------------------------------------

    async def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """Records from ``offset`` (from start_offset if below); [] at or past the end;
        at least one record whenever one exists at or after ``offset``."""
        cached = self.read_cached(offset, max_records, max_bytes)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._reader, self.log.read, offset, max_records, max_bytes, self._end
        )

    def read_cached(self, offset: int, max_records: int, max_bytes: int) -> list[Record] | None:
        """Tail cache only, never I/O; None when the range starts below the cache."""
        if offset >= self._end or max_records <= 0:
            return []
        return self._cache.read(max(offset, self.start_offset), max_records, max_bytes, self._end)

    async def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose timestamp is >= ``timestamp_ms``, or end_offset."""
        cached = self._cache.find_timestamp(timestamp_ms)
        if cached is not None:
            return min(cached, self._end)
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(
            self._reader, self.log.offset_for_timestamp, timestamp_ms
        )
        return min(found, self._end)

    async def read_log(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """As :meth:`read` but up to the log end, visible or not (storage's own use: the
        dedup index counts ids written but not yet committed)."""
        if offset >= self._leo or max_records <= 0:
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._reader, self.log.read, offset, max_records, max_bytes, self._leo
        )

    async def log_offset_for_timestamp(self, timestamp_ms: int) -> int:
        """As :meth:`offset_for_timestamp` but up to the log end, visible or not."""
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(
            self._reader, self.log.offset_for_timestamp, timestamp_ms
        )
        return min(found, self._leo)

    async def read_batches(
        self, offset: int, max_bytes: int, end_offset: int | None = None
    ) -> bytes:
        """The stored batches from the one holding ``offset``, byte for byte, none
        beginning at or past ``end_offset`` nor the log end (what a leader ships to a
        follower); b"" when there is nothing. On the reader executor."""
        end = self._leo if end_offset is None else min(end_offset, self._leo)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._reader, self.log.read_batches, offset, max_bytes, end
        )

    # -- a follower (on the writer thread, in queue order with everything else) --------

    async def append_batches(self, data: bytes) -> int:
        """Append a leader's stored batches as they are (their CRCs checked end to end) and
        fsync them (one fsync per call: a fetch response is one group commit); returns
        the new log end. Raises CorruptLog (a bad batch), ValueError (not contiguous)
        or StaleEpoch (a lower epoch than the log's) with nothing written, or
        StorageUnavailable. The visible end follows only on a single node; replicated,
        set_high_watermark moves it."""
        self._check_open()
        if not data:
            return self._leo
        end, error = await self._on_writer(lambda: self._append_batches_on_writer(data))
        if end > self._leo:
            # Left to file reads: a copied batch may hold several timestamps, which the
            # cache's chunks (one timestamp each) do not, and a follower rarely serves
            # its tail; the cache goes on from the new end, contiguous.
            self._cache.reset(end)
            self._leo = end
            if error is None:
                self._fsynced = end
            if self._hooks is None:
                self._set_visible(end)
            if self._log_listeners:
                self._notify_log()
        if error is not None:
            raise error
        return end

    def _append_batches_on_writer(self, data: bytes) -> tuple[int, StorageUnavailable | None]:
        start = self.log.end_offset
        try:
            end = self.log.append_batches(data)  # raises with nothing written (or cut back)
        except StorageUnavailable as exc:
            # Should cutting back have failed as well, the loop still learns where the log
            # ends: a follower that fetched from its old end would be refused for good.
            return self.log.end_offset, exc
        try:
            self.log.flush()
        except StorageUnavailable as exc:
            # What could not be made durable is not kept: after a failed fsync Linux may
            # drop the pages, and a later fsync then succeeds without having written them
            # ("fsyncgate"), so a replica would report records fsynced that its disk
            # lacks. Cut back to where the log was; the follower fetches them again.
            try:
                self.log.truncate_to(start)
            except Exception:  # the cut failed too: the loop still learns the new end
                log.exception("cannot cut partition %d back after a failed fsync", self.partition)
                return end, exc
            return self.log.end_offset, exc
        return end, None

    async def truncate_to(self, offset: int) -> int:
        """Remove every record at or after ``offset`` (a follower dropping what its leader
        does not have), durably; returns the new log end. The visible end, the fsynced
        end and the tail cache follow it down; waiters past it go on waiting."""
        self._check_open()
        end: int = await self._on_writer(lambda: self._cut_on_writer(self.log.truncate_to, offset))
        self._after_cut(end)
        return end

    async def reset_to(self, offset: int) -> int:
        """Drop every record and go on with an empty log starting at ``offset`` (the
        leader's log start moved past this log's end); returns ``offset``."""
        self._check_open()
        end: int = await self._on_writer(lambda: self._cut_on_writer(self.log.reset_to, offset))
        self._cache.reset(end)
        self._after_cut(end)
        return end

    def _cut_on_writer(self, cut: Callable[[int], None], offset: int) -> int:
        cut(offset)
        self.log.flush()  # a cut batch is rewritten: make the new end durable
        return self.log.end_offset

    def _after_cut(self, end: int) -> None:
        self._cache.truncate(end)
        advanced = end > self._leo  # reset_to past the end
        self._leo = end
        self._fsynced = end
        if self._hooks is None:
            self._set_visible(end)
        elif end < self._end:
            self._end = end
        if advanced and self._log_listeners:
            self._notify_log()

    # -- maintenance (on the writer thread, in queue order with the appends) -----------

    async def apply_retention(
        self, now_ms: int, retention_ms: int | None, retention_bytes: int | None
    ) -> int:
        """Delete whole segments past retention; returns how many were deleted."""
        deleted: int = await self._on_writer(
            lambda: self.log.apply_retention(now_ms, retention_ms, retention_bytes)
        )
        self._cache.drop_below(self.log.start_offset)
        return deleted

    async def flush(self) -> None:
        """fsync what was written so far (for a periodic flush of Acks.LEADER appends).
        Only taking the descriptor waits in the writer's queue; the fsync itself runs on
        another thread, so the appends behind it are not held up."""
        detached, end = await self._on_writer(self._flush_descriptor)
        if detached is not None:
            await asyncio.to_thread(self.log.flush_detached, detached)
            self._on_synced(end)
        elif not self.log.closed:
            self._on_synced(end)  # its files were released: fsynced before they closed

    def _flush_descriptor(self) -> tuple[DetachedSync | None, int]:
        return self.log.flush_descriptor(), self.log.end_offset

    async def close(self) -> None:
        """Finish queued appends, fsync and close the files. Waiters get False."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._on_writer(self._close_on_writer)
        except StorageUnavailable:  # the writer pool is already stopped
            await asyncio.to_thread(self.log.close)
        finally:
            self._writers.release(self._writer)
            if self._own_writers:
                await asyncio.to_thread(self._writers.close)
            for waiters in self._waiters.values():
                for future in waiters:
                    if not future.done():
                        future.set_result(False)
            # Its cached records go now. Whatever still holds the partition (a reference
            # cycle the collector has yet to find), they would otherwise wait for the next
            # full collection, which then walks each of them: a deleted topic's 10,000
            # records made it stop the server for 200-300 ms (issue 27: p99).
            self._cache.reset(self._end)

    def _close_on_writer(self) -> None:
        self.log.close()
        self._writer.forget(self.log)

    async def _on_writer(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._writer.submit(TaskRequest(fn, loop, future))
        return await future

    def _check_open(self) -> None:
        if self._closed:
            raise StorageUnavailable(f"partition {self.topic}/{self.partition} is closed")

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.partition}, end_offset={self._end})"


def _open_log(
    directory: Path, partition: int, config: LogConfig, open_files: OpenFiles | None
) -> PartitionLog:
    """Open (recover) the log and fsync what it holds: a crash of the process leaves
    written records unsynced in the page cache, and fsynced_offset starts at its end.
    Running out of descriptors or space is StorageUnavailable, never a bare OSError."""
    try:
        partition_log = PartitionLog(directory, partition, config, open_files)
    except OSError as exc:
        raise StorageUnavailable(
            f"cannot open partition {partition}: {exc.strerror or exc}", retry_after=1
        ) from exc
    try:
        partition_log.sync_recovered()
    except BaseException:
        partition_log.close()
        raise
    return partition_log
