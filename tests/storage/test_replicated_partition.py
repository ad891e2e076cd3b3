"""The replicated mode of Partition (PROTOCOL §7 "High watermark", "acks"): the visible
end is the high watermark, leader appends go through the ReplicationHooks, and a
follower copies its leader's batches byte for byte — on real directories and writer
threads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from herald.protocol.errors import HeraldError, StorageUnavailable
from storage.batch import read_header
from storage.config import TopicConfig
from storage.epochs import CHECKPOINT_FILE, StaleEpoch
from storage.errors import CorruptLog
from storage.partition import Partition
from storage.record import Acks, NewRecord, Record
from storage.topic import PublishItem, Topic
from storage.writer import WriterPool


class Refused(HeraldError):
    code, status, title = "not_enough_replicas", 503, "Service Unavailable"


class Hooks:
    """ReplicationHooks as the cluster layer implements them, driven by the test: it
    refuses appends while ``refuse`` is set, and wait_commit waits until ``commit``
    reaches the end asked for (or raises ``fail`` once set)."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        self.refuse = False
        self.checked: list[Acks] = []
        self.waited: list[tuple[int, Acks]] = []
        self.committed = 0
        self.fail: HeraldError | None = None
        self._changed = asyncio.Event()

    def check_append(self, acks: Acks) -> None:
        self.checked.append(acks)
        if self.refuse:
            raise Refused("the ISR is below min_insync_replicas")

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:
        self.waited.append((end_offset, acks))
        if acks is not Acks.ALL:
            return
        while True:
            if self.fail is not None:
                raise self.fail
            if self.committed >= end_offset:
                return
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 10)

    def commit(self, end: int) -> None:
        self.committed = max(self.committed, end)
        self._changed.set()

    def refuse_commits(self, error: HeraldError) -> None:
        self.fail = error
        self._changed.set()


class FixedClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
async def opener(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    """open(name, clock=None, cache_bytes=...) -> a Partition with a writer pool of its
    own (so that each replica has its own clock); all closed at the end."""
    opened: list[tuple[Partition, WriterPool]] = []

    async def open_partition(name: str, clock: FixedClock | None = None, **kw) -> Partition:
        pool = WriterPool(1) if clock is None else WriterPool(1, clock_ms=clock)
        partition = await Partition.open(tmp_path / name, "orders", 0, writers=pool, **kw)
        opened.append((partition, pool))
        return partition

    yield open_partition
    for partition, pool in opened:
        await partition.close()
        await asyncio.to_thread(pool.close)


def records(n: int, tag: str = "v") -> list[NewRecord]:
    return [NewRecord(f'"{tag}{i}"'.encode()) for i in range(n)]


def values(got: list[Record]) -> list[bytes]:
    return [r.value for r in got]


async def copy_all(leader: Partition, follower: Partition, max_bytes: int = 1 << 20) -> int:
    """Ship the leader's batches to the follower the way a fetch loop does; the number
    of append_batches calls made."""
    for calls in range(1000):
        data = await leader.read_batches(follower.log_end_offset, max_bytes)
        if not data:
            return calls
        await follower.append_batches(data)
    raise AssertionError("the follower never caught up")


# -- the visible end ---------------------------------------------------------------------


@pytest.mark.parametrize("cache_bytes", [32 << 20, 1], ids=["cached", "files"])
async def test_readers_see_only_records_below_the_high_watermark(opener, cache_bytes) -> None:
    partition: Partition = await opener("p", cache_bytes=cache_bytes)
    hooks = Hooks()
    partition.replicate(hooks)
    appended, logged = [], []
    partition.add_append_listener(lambda p: appended.append(p.end_offset))
    partition.add_log_listener(lambda p: logged.append(p.log_end_offset))

    first, timestamp = await partition.append(records(5), Acks.LEADER)
    assert (first, partition.log_end_offset, partition.end_offset) == (0, 5, 0)
    assert await partition.read(0, 100, 1 << 20) == []
    assert partition.read_cached(0, 100, 1 << 20) == []
    assert not await partition.wait_for(0, 0.05)
    assert await partition.offset_for_timestamp(0) == 0  # the visible end
    assert appended == [] and logged == [5]

    waiter = asyncio.create_task(partition.wait_for(2, 10))
    await asyncio.sleep(0)
    partition.set_high_watermark(3)
    assert await waiter
    assert partition.end_offset == partition.high_watermark == 3
    assert values(await partition.read(0, 100, 1 << 20)) == [b'"v0"', b'"v1"', b'"v2"']
    cached = partition.read_cached(0, 100, 1 << 20)
    if cache_bytes > 1:
        assert cached is not None and values(cached) == [b'"v0"', b'"v1"', b'"v2"']
        assert partition.read_cached(3, 100, 1 << 20) == []
    else:
        assert cached is None  # below the (empty) cache: read from the files
    assert values(await partition.read(2, 100, 1 << 20)) == [b'"v2"']
    assert not await partition.wait_for(3, 0.05)
    assert await partition.offset_for_timestamp(timestamp + 1) == 3
    assert await partition.offset_for_timestamp(timestamp) == 0
    assert appended == [3]

    partition.set_high_watermark(2)  # never lowered
    partition.set_high_watermark(100)  # clamped to the log end
    assert partition.end_offset == 5 and appended == [3, 5]
    assert len(await partition.read(0, 100, 1 << 20)) == 5


async def test_replicate_none_returns_to_a_single_node(opener) -> None:
    partition: Partition = await opener("p")
    hooks = Hooks()
    partition.replicate(hooks)
    await partition.append(records(4), Acks.LEADER)
    woken: list[int] = []
    partition.add_append_listener(lambda p: woken.append(p.end_offset))
    waiter = asyncio.create_task(partition.wait_for(1, 10))
    await asyncio.sleep(0)
    assert not waiter.done()

    partition.replicate(None)
    assert await waiter and woken == [4] and partition.end_offset == 4
    assert not partition.replicated and partition.hooks is None
    await partition.append(records(2, "w"), Acks.ALL)
    assert partition.end_offset == partition.log_end_offset == partition.fsynced_offset == 6
    assert woken == [4, 6]
    assert len(hooks.checked) == 1  # the single-node append went around the hooks
    # Back on a single node, appends go on under the log's latest epoch (0 would be a
    # stale epoch after 1).
    assert partition.latest_epoch == 1


async def test_replicate_with_a_high_watermark_hides_an_uncommitted_tail(opener) -> None:
    partition: Partition = await opener("p")
    await partition.append(records(6), Acks.ALL)
    partition.replicate(Hooks(), high_watermark=4)
    assert (partition.end_offset, partition.log_end_offset) == (4, 6)
    assert len(await partition.read(0, 100, 1 << 20)) == 4
    assert len(partition.read_cached(0, 100, 1 << 20) or []) == 4


# -- leader appends ----------------------------------------------------------------------


async def test_a_refused_append_appends_nothing(opener) -> None:
    partition: Partition = await opener("p")
    hooks = Hooks()
    partition.replicate(hooks)
    hooks.refuse = True
    with pytest.raises(Refused):
        await partition.append(records(3), Acks.ALL)
    assert hooks.checked == [Acks.ALL] and hooks.waited == []
    assert partition.log_end_offset == partition.log.end_offset == 0
    assert await partition.read_batches(0, 1 << 20) == b""
    hooks.refuse = False
    first, _ = await partition.append(records(1), Acks.LEADER)
    assert first == 0 and partition.log_end_offset == 1


async def test_wait_commit_gets_the_end_and_its_error_propagates(opener) -> None:
    partition: Partition = await opener("p")
    hooks = Hooks(epoch=3)
    partition.replicate(hooks)
    await partition.append(records(2), Acks.LEADER)
    assert hooks.waited == [(2, Acks.LEADER)]

    pending = asyncio.create_task(partition.append(records(3), Acks.ALL))
    for _ in range(200):
        if hooks.waited[-1][0] == 5:
            break
        await asyncio.sleep(0.01)
    assert hooks.waited[-1] == (5, Acks.ALL)
    # wait_commit is called once the local fsync is done.
    assert partition.fsynced_offset == 5 and not pending.done()
    hooks.commit(5)
    assert (await pending)[0] == 2

    failing = asyncio.create_task(partition.append(records(1), Acks.ALL))
    for _ in range(200):
        if hooks.waited[-1][0] == 6:
            break
        await asyncio.sleep(0.01)
    hooks.refuse_commits(Refused("the ISR shrank below min_insync_replicas"))
    with pytest.raises(Refused):
        await failing
    assert partition.log_end_offset == 6  # written all the same (PROTOCOL §7)

    # Every batch carries the hooks' epoch.
    data = await partition.read_batches(0, 1 << 20)
    pos, epochs = 0, []
    while pos < len(data):
        header = read_header(data, pos)
        epochs.append(header.leader_epoch)
        pos += header.length
    assert epochs == [3, 3, 3]
    assert partition.latest_epoch == 3
    assert partition.end_offset_for_epoch(3) == (3, 6)
    assert partition.end_offset_for_epoch(2) == (-1, -1)  # none as old


async def test_fsynced_offset_follows_group_fsyncs_and_flush(opener) -> None:
    partition: Partition = await opener("p")
    seen: list[tuple[int, int]] = []
    partition.add_log_listener(lambda p: seen.append((p.log_end_offset, p.fsynced_offset)))
    await partition.append(records(2), Acks.LEADER)
    assert (partition.log_end_offset, partition.fsynced_offset) == (2, 0)
    await partition.flush()
    assert partition.fsynced_offset == 2
    await partition.append(records(3), Acks.ALL)
    assert partition.fsynced_offset == 5
    assert seen == [(2, 0), (2, 2), (5, 2), (5, 5)]


async def test_a_reopened_log_counts_as_fsynced(tmp_path: Path) -> None:
    pool = WriterPool(1)
    try:
        partition = await Partition.open(tmp_path, "orders", 0, writers=pool)
        await partition.append(records(3), Acks.LEADER)
        await partition.close()
        partition = await Partition.open(tmp_path, "orders", 0, writers=pool)
        assert partition.fsynced_offset == partition.log_end_offset == 3
        await partition.close()
    finally:
        await asyncio.to_thread(pool.close)


# -- followers ---------------------------------------------------------------------------


async def test_a_follower_copies_its_leader_byte_for_byte(opener) -> None:
    leader: Partition = await opener("leader")
    follower: Partition = await opener("follower")
    hooks = Hooks(epoch=1)
    leader.replicate(hooks)
    follower.replicate(Hooks(epoch=1))
    for i in range(5):
        await leader.append(records(3, f"a{i}"), Acks.LEADER)
    leader.replicate(Hooks(epoch=2))  # a new leader epoch
    await leader.append(
        [NewRecord(b"{}", key="k", headers={"h": "1"}, producer_id="p1")], Acks.LEADER
    )
    logged: list[tuple[int, int]] = []
    follower.add_log_listener(lambda p: logged.append((p.log_end_offset, p.fsynced_offset)))
    fsyncs = follower.fsync_count

    calls = await copy_all(leader, follower, max_bytes=100)  # a batch or two per call
    assert calls >= 3
    assert follower.fsync_count - fsyncs == calls  # one fsync per fetch response
    assert follower.log_end_offset == follower.fsynced_offset == leader.log_end_offset == 16
    assert logged[-1] == (16, 16) and len(logged) == calls
    assert await follower.read_batches(0, 1 << 20) == await leader.read_batches(0, 1 << 20)
    assert follower.latest_epoch == 2
    for epoch in (0, 1, 2, 3):
        assert follower.end_offset_for_epoch(epoch) == leader.end_offset_for_epoch(epoch)
    # Replicated: nothing visible on the follower until the leader's mark arrives.
    assert follower.end_offset == 0 and await follower.read(0, 100, 1 << 20) == []
    follower.set_high_watermark(16)
    assert await leader.read(0, 100, 1 << 20) == []  # the leader's own mark is still 0
    leader.set_high_watermark(16)
    assert await follower.read(0, 100, 1 << 20) == await leader.read(0, 100, 1 << 20)
    assert len(await follower.read(0, 100, 1 << 20)) == 16


async def test_batches_that_do_not_append_write_nothing(opener) -> None:
    leader: Partition = await opener("leader")
    follower: Partition = await opener("follower")
    leader.replicate(Hooks(epoch=2))
    await leader.append(records(3), Acks.LEADER)
    await leader.append(records(3, "b"), Acks.LEADER)
    data = await leader.read_batches(0, 1 << 20)
    size = follower.size_bytes

    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF  # in the second batch: the first must not be written either
    with pytest.raises(CorruptLog):
        await follower.append_batches(bytes(corrupt))
    first_length = read_header(data).length
    with pytest.raises(ValueError, match="expected"):
        await follower.append_batches(data[first_length:])  # not contiguous
    assert follower.log_end_offset == follower.log.end_offset == 0
    assert follower.size_bytes == size

    await follower.append_batches(data)
    assert follower.log_end_offset == 6
    # A batch of an older epoch than the log's: StaleEpoch, nothing written.
    stale: Partition = await opener("stale")
    stale.replicate(Hooks(epoch=1))
    await stale.append(records(1), Acks.LEADER)
    for _ in range(6):
        await stale.append(records(1), Acks.LEADER)
    old = await stale.read_batches(6, 1 << 20)
    with pytest.raises(StaleEpoch):
        await follower.append_batches(old)
    assert follower.log_end_offset == follower.log.end_offset == 6


async def test_a_fetch_whose_new_epoch_cannot_be_checkpointed_appends_nothing(opener) -> None:
    """A fetch answer of two batches, the second of a new leader epoch, whose epoch
    checkpoint cannot be written (in the nemesis, seed 2005 on 2026-11-28, a failing disk;
    here a directory where the file goes). The first batch had been written, and the
    follower's end did not count it: it fetched from there for good, every answer
    refused ("batch at offset 13510 where offset 13520 was expected") and out of the ISR
    for the rest of the run. The log is cut back now, and the next fetch appends."""
    leader: Partition = await opener("leader")
    follower: Partition = await opener("follower")
    leader.replicate(Hooks(epoch=1))
    await leader.append(records(3), Acks.LEADER)
    await leader.append(records(2, "b"), Acks.LEADER)
    leader.replicate(Hooks(epoch=2))
    await leader.append(records(2, "c"), Acks.LEADER)
    await follower.append_batches(await leader.read_batches(0, 1 << 20, end_offset=3))
    checkpoint = follower.log.directory / CHECKPOINT_FILE
    checkpoint.unlink()
    checkpoint.mkdir()  # the checkpoint's rename fails

    with pytest.raises(StorageUnavailable, match="epoch checkpoint"):
        await follower.append_batches(await leader.read_batches(3, 1 << 20))
    assert follower.log_end_offset == follower.log.end_offset == 3
    assert follower.latest_epoch == 1

    checkpoint.rmdir()
    await copy_all(leader, follower)
    assert follower.log_end_offset == follower.fsynced_offset == 7
    assert await follower.read_batches(0, 1 << 20) == await leader.read_batches(0, 1 << 20)
    assert follower.latest_epoch == 2


async def test_a_single_node_follower_sees_its_copies_at_once(opener) -> None:
    leader: Partition = await opener("leader")
    follower: Partition = await opener("follower")
    await leader.append(records(4), Acks.LEADER)
    woken = asyncio.create_task(follower.wait_for(0, 10))
    await copy_all(leader, follower)
    assert await woken and follower.end_offset == 4
    assert await follower.read(0, 100, 1 << 20) == await leader.read(0, 100, 1 << 20)


async def test_truncate_with_a_warm_cache(opener) -> None:
    partition: Partition = await opener("p")
    for i in range(3):
        await partition.append(records(4, f"b{i}"), Acks.LEADER)
    assert len(partition.read_cached(0, 100, 1 << 20) or []) == 12  # warm, materialized
    waiter = asyncio.create_task(partition.wait_for(12, 10))
    await asyncio.sleep(0)

    assert await partition.truncate_to(6) == 6  # in the middle of the second batch
    assert partition.log_end_offset == partition.end_offset == partition.fsynced_offset == 6
    cached = partition.read_cached(0, 100, 1 << 20)
    assert cached is not None
    assert values(cached) == values(partition.log.read(0, 100, 1 << 20))
    assert [r.offset for r in cached] == list(range(6))
    assert not waiter.done()

    first, _ = await partition.append(records(4, "c"), Acks.LEADER)
    assert first == 6 and not waiter.done()
    await partition.append(records(3, "d"), Acks.LEADER)
    assert await waiter
    cached = partition.read_cached(0, 100, 1 << 20)
    assert cached is not None and [r.offset for r in cached] == list(range(13))
    assert values(cached) == values(partition.log.read(0, 100, 1 << 20))
    assert values(cached)[6:10] == [b'"c0"', b'"c1"', b'"c2"', b'"c3"']


async def test_truncate_and_reset_when_replicated(opener) -> None:
    partition: Partition = await opener("p")
    hooks = Hooks(epoch=1)
    partition.replicate(hooks)
    for _ in range(3):
        await partition.append(records(4), Acks.LEADER)
    partition.set_high_watermark(10)
    assert await partition.truncate_to(8) == 8
    assert (partition.log_end_offset, partition.end_offset, partition.fsynced_offset) == (8, 8, 8)
    assert len(partition.read_cached(0, 100, 1 << 20) or []) == 8
    assert await partition.truncate_to(20) == 8  # past the end: nothing to cut

    partition.set_high_watermark(4)  # never lowered (truncation only)
    assert partition.end_offset == 8
    assert await partition.truncate_to(6) == 6 and partition.end_offset == 6

    woken: list[int] = []
    partition.add_append_listener(lambda p: woken.append(p.end_offset))
    assert await partition.reset_to(50) == 50
    assert partition.log_end_offset == partition.fsynced_offset == 50
    assert partition.end_offset == 6  # the visible end stays at most where it was
    assert await partition.read(0, 100, 1 << 20) == []
    assert partition.read_cached(50, 100, 1 << 20) == []
    assert partition.latest_epoch == -1
    first, _ = await partition.append(records(2), Acks.LEADER)
    assert first == 50
    partition.set_high_watermark(52)
    assert woken == [52]
    got = await partition.read(0, 100, 1 << 20)
    assert [r.offset for r in got] == [50, 51]
    assert [r.offset for r in partition.read_cached(50, 100, 1 << 20) or []] == [50, 51]


async def test_reset_on_a_single_node_moves_the_end(opener) -> None:
    partition: Partition = await opener("p")
    await partition.append(records(3), Acks.LEADER)
    waiter = asyncio.create_task(partition.wait_for(10, 10))
    await asyncio.sleep(0)
    await partition.reset_to(20)
    assert await waiter
    assert partition.start_offset == partition.end_offset == 20
    assert await partition.read(0, 100, 1 << 20) == []
    first, _ = await partition.append(records(1), Acks.LEADER)
    assert first == 20 and len(await partition.read(0, 100, 1 << 20)) == 1


# -- timestamps never go down ------------------------------------------------------------


async def test_timestamps_never_go_down_across_copies_and_truncation(opener) -> None:
    ahead = FixedClock(1_000_000)
    behind = FixedClock(1_000)
    leader: Partition = await opener("leader", ahead)
    follower: Partition = await opener("follower", behind)
    leader.replicate(Hooks(epoch=1))
    await leader.append(records(3), Acks.LEADER)
    ahead.now += 500
    await leader.append(records(3), Acks.LEADER)
    await copy_all(leader, follower)

    follower.replicate(Hooks(epoch=2))  # the follower becomes leader, its clock behind
    _, timestamp = await follower.append(records(1), Acks.LEADER)
    assert timestamp == 1_000_500
    await follower.truncate_to(4)  # the newest left is 1_000_500 (offsets 3..)
    _, timestamp = await follower.append(records(1), Acks.LEADER)
    assert timestamp >= 1_000_500
    await follower.truncate_to(2)  # only records of 1_000_000 left
    _, timestamp = await follower.append(records(1), Acks.LEADER)
    assert timestamp == 1_000_000
    follower.set_high_watermark(100)
    stamps = [r.timestamp for r in await follower.read(0, 100, 1 << 20)]
    assert stamps == sorted(stamps)


# -- the topic over replicated partitions ------------------------------------------------


def publish_item(producer_id: str | None, value: bytes = b"1") -> PublishItem:
    return PublishItem(NewRecord(value, producer_id=producer_id), 0)


async def open_topic(partition: Partition) -> Topic:
    topic = await Topic.open("orders", TopicConfig(partitions=1), [partition])
    await topic.dedup_ready()
    return topic


async def test_topic_publish_over_a_replicated_partition(opener) -> None:
    partition: Partition = await opener("p")
    hooks = Hooks()
    partition.replicate(hooks)
    topic = await open_topic(partition)

    hooks.refuse = True
    with pytest.raises(Refused):
        await topic.publish([publish_item("a")], Acks.ALL)
    assert partition.log_end_offset == 0
    hooks.refuse = False

    # A refused id was not recorded: the retry appends it.
    result = asyncio.create_task(topic.publish([publish_item("a")], Acks.ALL))
    for _ in range(200):
        if hooks.waited:
            break
        await asyncio.sleep(0.01)
    assert hooks.waited == [(1, Acks.ALL)]
    hooks.commit(1)
    [landed] = await result
    assert (landed.offset, landed.duplicate) == (0, False)

    # A commit that fails after the append: the retry finds the id (PROTOCOL §7).
    hooks.refuse_commits(Refused("the ISR shrank"))
    with pytest.raises(Refused):
        await topic.publish([publish_item("b")], Acks.ALL)
    assert partition.log_end_offset == 2
    [again] = await topic.publish([publish_item("b")], Acks.LEADER)
    assert (again.offset, again.duplicate) == (1, True)
    # A duplicate answered at acks=all waits for the commit of its original too.
    with pytest.raises(Refused):
        await topic.publish([publish_item("b")], Acks.ALL)
    hooks.fail = None
    hooks.commit(2)
    [again] = await topic.publish([publish_item("b")], Acks.ALL)
    assert (again.offset, again.duplicate) == (1, True)

    # The record is cut by a truncation: its id is forgotten, a retry appends it again.
    await partition.truncate_to(1)
    assert topic.forget_dedup_from(0, 1) == 1
    [retried] = await topic.publish([publish_item("b")], Acks.LEADER)
    assert (retried.offset, retried.duplicate) == (1, False)
    await topic.close()


async def test_rebuild_dedup_finds_ids_that_arrived_by_replication(opener) -> None:
    leader: Partition = await opener("leader")
    follower: Partition = await opener("follower")
    leader.replicate(Hooks(epoch=1))
    follower.replicate(Hooks(epoch=1))
    leader_topic = await open_topic(leader)
    follower_topic = await open_topic(follower)
    await leader_topic.publish([publish_item("x"), publish_item("y")], Acks.LEADER)
    await copy_all(leader, follower)
    assert follower.end_offset == 0  # not even committed: the ids count all the same

    follower.replicate(Hooks(epoch=2))  # the follower becomes leader
    await follower_topic.rebuild_dedup(0)
    results = await follower_topic.publish([publish_item("y"), publish_item("z")], Acks.LEADER)
    assert [(r.offset, r.duplicate) for r in results] == [(1, True), (2, False)]
    await leader_topic.close()
    await follower_topic.close()
