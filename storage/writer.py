"""Writer threads with group commit: file writes and fsyncs never run on the event loop.

Each partition is assigned to one writer thread of a small pool. A writer drains its
queue in groups: it writes every pending append, answers the Acks.LEADER / Acks.NONE
ones, then makes ONE fsync per partition that has Acks.ALL appends in the group and
answers those. Appends that arrive during an fsync form the next group, so concurrent
publishers share fsyncs (STYLE §2). Answers go back to each event loop with a single
``call_soon_threadsafe`` per group and phase, not one per request.

Offsets and timestamps are assigned here, on the writer thread: the order of the queue
is the order of the log.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from herald.protocol.errors import StorageUnavailable
from storage.errors import WrittenNotSynced
from storage.partition_log import PartitionLog
from storage.record import Acks, NewRecord

log = logging.getLogger(__name__)

# (first offset, timestamp) of an append; on_written also gets the records.
AppendResult = tuple[int, int]
OnWritten = Callable[[int, int, Sequence[NewRecord]], None]
_Thunk = tuple[Callable[..., Any], tuple[Any, ...]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, eq=False)
class AppendRequest:
    log: PartitionLog
    records: Sequence[NewRecord]
    acks: Acks
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[AppendResult]
    on_written: OnWritten | None = None  # on the loop once written: the batch is visible
    leader_epoch: int | None = None  # stamped on the batch; None: the log's latest (or 0)
    on_synced: Callable[[int], None] | None = None  # on the loop: fsynced up to this end


@dataclass(frozen=True, slots=True, eq=False)
class TaskRequest:
    """Any other mutation of a log (retention, flush, close), run in queue order."""

    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class Writer:
    """One writer thread and its queue."""

    def __init__(self, name: str, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._clock_ms = clock_ms
        self._queue: collections.deque[AppendRequest | TaskRequest] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._dirty: set[PartitionLog] = set()  # written since their last fsync
        self.fsync_count = 0
        self.group_count = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, request: AppendRequest | TaskRequest) -> None:
        with self._cond:
            if self._stopping:
                raise StorageUnavailable("storage is shutting down")
            self._queue.append(request)
            self._cond.notify()

    def stop(self) -> None:
        """Finish what is queued, fsync what was written, and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                break
            try:
                if isinstance(group, TaskRequest):
                    self._run_task(group)
                else:
                    self._commit(group)
            except Exception:  # never let a bug stop the writer: later appends would hang
                log.exception("writer thread failed on a group")
        for partition_log in self._dirty:
            try:
                partition_log.flush()
            except StorageUnavailable:
                log.exception("final fsync failed")

    def _take(self) -> list[AppendRequest] | TaskRequest | None:
        """The next group: every queued append up to the next task, or that task."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            if isinstance(self._queue[0], TaskRequest):
                return self._queue.popleft()  # type: ignore[return-value]
            group: list[AppendRequest] = []
            while self._queue and isinstance(self._queue[0], AppendRequest):
                group.append(self._queue.popleft())  # type: ignore[arg-type]
            return group

    def _commit(self, group: list[AppendRequest]) -> None:
        self.group_count += 1
        written: dict[asyncio.AbstractEventLoop, list[_Thunk]] = {}
        to_sync: dict[PartitionLog, list[tuple[AppendRequest, AppendResult]]] = {}
        for request in group:
            if request.future.cancelled():
                continue  # its publisher is gone and was told nothing: don't write it
            thunks = written.setdefault(request.loop, [])
            try:
                result = self._append(request)
            except Exception as exc:
                thunks.append((_fail, (request.future, _storage_error(exc))))
                continue
            if request.on_written is not None:
                thunks.append((request.on_written, (*result, request.records)))
            if request.acks is Acks.ALL:
                to_sync.setdefault(request.log, []).append((request, result))
            else:
                thunks.append((_resolve, (request.future, result)))
        _post(written)
        _post(self._sync(to_sync))

    def _append(self, request: AppendRequest) -> AppendResult:
        # PROTOCOL §1: broker append time, never decreasing within a partition.
        last = request.log.last_timestamp
        timestamp = self._clock_ms()
        if last is not None and last > timestamp:
            timestamp = last
        epoch = request.leader_epoch
        if epoch is None:  # not replicated: go on under the epoch the log has (0 if none)
            epoch = max(request.log.epochs.latest_epoch, 0)
        first = request.log.append(request.records, timestamp, epoch)
        self._dirty.add(request.log)
        return first, timestamp

    def _sync(
        self, to_sync: dict[PartitionLog, list[tuple[AppendRequest, AppendResult]]]
    ) -> dict[asyncio.AbstractEventLoop, list[_Thunk]]:
        durable: dict[asyncio.AbstractEventLoop, list[_Thunk]] = {}
        for partition_log, items in to_sync.items():
            answers: list[_Thunk]
            try:
                end = partition_log.end_offset  # the fsync covers everything written so far
                partition_log.flush()
                self.fsync_count += 1
                self._dirty.discard(partition_log)
                answers = [(_resolve, (req.future, result)) for req, result in items]
                on_synced = items[0][0].on_synced
                if on_synced is not None:
                    durable.setdefault(items[0][0].loop, []).append((on_synced, (end,)))
            except Exception as exc:
                error = str(_storage_error(exc))
                answers = [
                    (_fail, (req.future, WrittenNotSynced(error, *result))) for req, result in items
                ]
            for answer, (request, _) in zip(answers, items, strict=True):
                durable.setdefault(request.loop, []).append(answer)
        return durable

    def _run_task(self, task: TaskRequest) -> None:
        if task.future.cancelled():
            return
        try:
            thunk: _Thunk = (_resolve, (task.future, task.fn()))
        except Exception as exc:
            thunk = (_fail, (task.future, exc))
        _post({task.loop: [thunk]})

    def forget(self, partition_log: PartitionLog) -> None:
        """Called on this thread when a log is closed: nothing left to fsync there."""
        self._dirty.discard(partition_log)


class WriterPool:
    """Up to ``max_writers`` threads; partitions are spread over them as they open."""

    def __init__(self, max_writers: int = 4, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        if max_writers < 1:
            raise ValueError("max_writers must be >= 1")
        self._max = max_writers
        self._clock_ms = clock_ms
        self._writers: list[Writer] = []
        self._assigned: list[int] = []
        self._lock = threading.Lock()

    def assign(self) -> Writer:
        """A writer for a newly opened partition: a new thread until the cap, then the
        least loaded one."""
        with self._lock:
            if len(self._writers) < self._max:
                self._writers.append(Writer(f"herald-writer-{len(self._writers)}", self._clock_ms))
                self._assigned.append(0)
            i = min(range(len(self._writers)), key=self._assigned.__getitem__)
            self._assigned[i] += 1
            return self._writers[i]

    def release(self, writer: Writer) -> None:
        with self._lock:
            self._assigned[self._writers.index(writer)] -= 1

    @property
    def fsync_count(self) -> int:
        return sum(w.fsync_count for w in self._writers)

    @property
    def writers(self) -> list[Writer]:
        return list(self._writers)

    def close(self) -> None:
        """Finish pending appends, fsync, stop every thread (blocking: call it off the loop)."""
        with self._lock:
            writers, self._writers, self._assigned = self._writers, [], []
        for writer in writers:
            writer.stop()


def _storage_error(exc: Exception) -> Exception:
    if isinstance(exc, StorageUnavailable | ValueError | TypeError | UnicodeError):
        return exc
    return StorageUnavailable(f"write failed: {exc}")


def _post(by_loop: dict[asyncio.AbstractEventLoop, list[_Thunk]]) -> None:
    for loop, thunks in by_loop.items():
        if thunks:
            try:
                loop.call_soon_threadsafe(_run_thunks, thunks)
            except RuntimeError:
                log.warning("event loop closed before %d storage answers", len(thunks))


def _run_thunks(thunks: list[_Thunk]) -> None:
    for fn, args in thunks:
        try:
            fn(*args)
        except Exception:
            log.exception("storage callback failed")


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
