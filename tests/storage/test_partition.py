"""The awaitable Partition facade: group commit on writer threads, visibility, tail
cache, waiters and listeners, I/O failures — on real directories."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from herald.protocol.errors import StorageUnavailable
from storage.partition import Partition
from storage.partition_log import LogConfig, PartitionLog
from storage.record import Acks, NewRecord, Record
from storage.writer import TaskRequest, WriterPool


@pytest.fixture
def pool() -> Iterator[WriterPool]:
    writers = WriterPool(max_writers=1)
    yield writers
    writers.close()


async def open_partition(path: Path, pool: WriterPool, **kw) -> Partition:
    return await Partition.open(path, "orders", 0, writers=pool, **kw)


def records(n: int, tag: str = "v", size: int = 0) -> list[NewRecord]:
    return [NewRecord(f"{tag}{i}".encode() + b"." * size) for i in range(n)]


@contextlib.asynccontextmanager
async def writer_paused(pool: WriterPool):
    """Hold the (single) writer thread so that requests queue up behind it."""
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    loop = asyncio.get_running_loop()
    future = loop.create_future()
    pool.writers[0].submit(TaskRequest(hold, loop, future))
    await asyncio.to_thread(started.wait, 10)
    try:
        yield
    finally:
        release.set()
        await future


async def test_appends_are_read_back_from_the_tail_cache(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    first, timestamp = await partition.append(records(3), Acks.LEADER)
    assert (first, partition.end_offset) == (0, 3)
    cached = partition.read_cached(1, 10, 10**6)
    assert cached is not None
    assert [(r.offset, r.value, r.timestamp, r.id) for r in cached] == [
        (1, b"v1", timestamp, "0-1"),
        (2, b"v2", timestamp, "0-2"),
    ]
    assert await partition.read(0, 10, 10**6) == partition.read_cached(0, 10, 10**6)
    assert await partition.read(3, 10, 10**6) == []
    await partition.close()


async def test_a_closed_partition_lets_go_of_its_cached_records_at_once(tmp_path, pool):
    """Even while the partition is still held (a reference cycle the collector has not
    reached: a deleted topic's partition was), its cached records are freed when it
    closes, not at the next full collection, which would walk every one of them first.
    The collector is off meanwhile: only what is really let go is gone."""
    partition = await open_partition(tmp_path, pool)
    await partition.append(records(500, tag="cached"), Acks.LEADER)
    assert len(partition.read_cached(0, 500, 10**9) or []) == 500  # decoded, kept
    gc.collect()
    gc.disable()
    try:
        assert live_records() >= 500
        await partition.close()
        assert live_records() < 500
    finally:
        gc.enable()


def live_records() -> int:
    return sum(isinstance(o, Record) for o in gc.get_objects())


async def test_reads_after_a_reopen_come_from_the_files(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    await partition.append(records(5), Acks.ALL)
    await partition.close()
    partition = await open_partition(tmp_path, pool)
    assert partition.read_cached(0, 10, 10**6) is None
    assert [r.value for r in await partition.read(0, 10, 10**6)] == [
        b"v0",
        b"v1",
        b"v2",
        b"v3",
        b"v4",
    ]
    assert [r.offset for r in await partition.read(2, 2, 10**6)] == [2, 3]
    await partition.close()


async def test_concurrent_acks_all_appends_share_one_fsync(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    async with writer_paused(pool):
        appends = [asyncio.ensure_future(partition.append(records(2), Acks.ALL)) for _ in range(16)]
        await asyncio.sleep(0)  # let every append reach the writer's queue
    results = await asyncio.gather(*appends)
    assert sorted(first for first, _ in results) == list(range(0, 32, 2))
    assert partition.fsync_count == 1
    assert pool.fsync_count == 1
    await partition.close()


async def test_one_group_fsyncs_each_partition_of_the_writer_once(tmp_path, pool):
    a = await Partition.open(tmp_path / "0", "t", 0, writers=pool)
    b = await Partition.open(tmp_path / "1", "t", 1, writers=pool)
    async with writer_paused(pool):
        appends = [asyncio.ensure_future(p.append(records(1), Acks.ALL)) for p in (a, b) * 5] + [
            asyncio.ensure_future(a.append(records(1), Acks.LEADER))
        ]
        await asyncio.sleep(0)
    await asyncio.gather(*appends)
    assert (a.fsync_count, b.fsync_count, pool.fsync_count) == (1, 1, 2)
    assert (a.end_offset, b.end_offset) == (6, 5)
    await a.close()
    await b.close()


async def test_acks_leader_does_not_wait_for_an_fsync(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    for _ in range(5):
        await partition.append(records(1), Acks.LEADER)
    await partition.append(records(1), Acks.NONE)
    assert partition.fsync_count == 0
    await partition.flush()
    assert partition.fsync_count == 1
    await partition.close()


async def test_timestamps_never_decrease_even_if_the_clock_does(tmp_path):
    ticks = iter([5000, 4000, 6000])
    pool = WriterPool(1, clock_ms=lambda: next(ticks))
    partition = await open_partition(tmp_path, pool)
    stamps = [(await partition.append(records(1), Acks.LEADER))[1] for _ in range(3)]
    assert stamps == [5000, 5000, 6000]
    await partition.close()
    pool.close()


async def test_listeners_fire_once_per_batch_after_it_is_visible(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    seen: list[int] = []
    unsubscribe = partition.add_append_listener(lambda p: seen.append(p.end_offset))
    await partition.append(records(2), Acks.LEADER)
    await partition.append(records(3), Acks.ALL)
    unsubscribe()
    await partition.append(records(1), Acks.LEADER)
    assert seen == [2, 5]
    await partition.close()


async def test_wait_for_wakes_when_the_offset_is_written(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    waiter = asyncio.ensure_future(partition.wait_for(0, timeout=10))
    await asyncio.sleep(0)
    assert not waiter.done()
    await partition.append(records(1), Acks.LEADER)
    assert await waiter is True
    assert await partition.wait_for(0, timeout=0) is True
    assert await partition.wait_for(1, timeout=0.01) is False
    late = asyncio.ensure_future(partition.wait_for(5, timeout=10))
    await asyncio.sleep(0)
    await partition.close()
    assert await late is False


async def test_read_cached_is_none_below_the_cache_but_read_still_works(tmp_path, pool):
    partition = await open_partition(tmp_path, pool, cache_bytes=2000)
    for i in range(10):
        await partition.append(records(5, tag=f"b{i}-", size=40), Acks.LEADER)
    assert partition.read_cached(0, 10, 10**6) is None
    tail = partition.read_cached(49, 10, 10**6)
    assert tail is not None and [r.offset for r in tail] == [49]
    cold = await partition.read(0, 100, 10**6)
    assert [r.offset for r in cold] == list(range(50))
    await partition.close()


async def test_read_respects_limits_and_returns_at_least_one_record(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    await partition.append(records(10, size=100), Acks.LEADER)
    assert len(await partition.read(0, 3, 10**6)) == 3
    assert len(await partition.read(0, 100, 1)) == 1
    assert len(await partition.read(0, 100, 250)) == 2
    await partition.close()


async def test_offset_for_timestamp(tmp_path):
    ticks = iter([1000, 2000, 3000])
    pool = WriterPool(1, clock_ms=lambda: next(ticks))
    partition = await open_partition(tmp_path, pool)
    for _ in range(3):
        await partition.append(records(2), Acks.LEADER)
    assert await partition.offset_for_timestamp(0) == 0
    assert await partition.offset_for_timestamp(1500) == 2
    assert await partition.offset_for_timestamp(3000) == 4
    assert await partition.offset_for_timestamp(3001) == 6
    await partition.close()
    pool.close()


async def test_retention_moves_the_start_and_reads_follow(tmp_path, pool):
    config = LogConfig(segment_bytes=500)
    partition = await open_partition(tmp_path, pool, config=config)
    for _ in range(10):
        await partition.append(records(5, size=20), Acks.LEADER)
    deleted = await partition.apply_retention(now_ms=2**62, retention_ms=1000, retention_bytes=None)
    assert deleted > 1
    assert partition.start_offset == partition.end_offset == 50
    assert await partition.read(0, 10, 10**6) == []
    assert partition.read_cached(0, 10, 10**6) == []
    await partition.append(records(1), Acks.ALL)
    assert [r.offset for r in await partition.read(0, 10, 10**6)] == [50]
    await partition.close()


async def test_close_finishes_queued_appends_then_refuses_more(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    appends = [asyncio.ensure_future(partition.append(records(1), Acks.LEADER)) for _ in range(5)]
    await asyncio.sleep(0)
    await partition.close()
    assert len(await asyncio.gather(*appends)) == 5
    with pytest.raises(StorageUnavailable):
        await partition.append(records(1), Acks.ALL)
    log = PartitionLog(tmp_path, 0)
    assert log.end_offset == 5
    log.close()


async def test_a_partition_without_a_pool_has_its_own_writer(tmp_path):
    partition = await Partition.open(tmp_path, "t", 0, segment_bytes=1000)
    assert await partition.append(records(2), Acks.ALL) == (
        0,
        partition.read_cached(0, 1, 1)[0].timestamp,
    )
    assert partition.log.config.segment_bytes == 1000
    await partition.close()


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """A real write failure: past RLIMIT_FSIZE the kernel answers EFBIG (with SIGXFSZ
    ignored), after a short write — like a disk filling up mid-batch."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


async def test_a_failed_write_fails_the_append_and_leaves_the_log_whole(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    await partition.append(records(3), Acks.ALL)
    size = partition.size_bytes
    with file_size_limit(size + 500):
        with pytest.raises(StorageUnavailable):
            await partition.append(records(20, size=100), Acks.ALL)
        with pytest.raises(StorageUnavailable):
            await partition.append(records(20, size=100), Acks.LEADER)
        assert (partition.end_offset, partition.size_bytes) == (3, size)
        assert (await partition.append(records(1, tag="small"), Acks.ALL))[0] == 3
    assert (await partition.append(records(20, size=100), Acks.ALL))[0] == 4
    await partition.close()
    log = PartitionLog(tmp_path, 0)
    assert log.recovered_bytes == 0
    assert [r.offset for r in log.read(0, 100, 10**9)] == list(range(24))
    assert log.read(3, 1, 10**9)[0].value == b"small0"
    log.close()


async def test_cached_reads_span_batches_and_keep_their_limits(tmp_path, pool):
    partition = await open_partition(tmp_path, pool)
    for i in range(4):
        await partition.append(records(3, tag=f"b{i}-", size=10), Acks.LEADER)
    spanning = partition.read_cached(2, 5, 10**6)
    assert spanning is not None
    assert [r.offset for r in spanning] == [2, 3, 4, 5, 6]
    assert [r.value[:4] for r in spanning] == [b"b0-2", b"b1-0", b"b1-1", b"b1-2", b"b2-0"]
    by_bytes = partition.read_cached(1, 100, 3 * 14)
    assert by_bytes is not None and [r.offset for r in by_bytes] == [1, 2, 3]
    assert partition.read_cached(11, 100, 1) == [(await partition.read(11, 1, 1))[0]]
    from_files = await asyncio.to_thread(partition.log.read, 0, 100, 10**6)
    assert partition.read_cached(0, 100, 10**6) == from_files  # same records either way
    await partition.close()
