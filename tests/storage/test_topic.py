"""Topic: partition choice and deduplicated publish (PROTOCOL §1, §2), on real partitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import pytest

from herald.protocol.errors import PartitionNotFound, StorageUnavailable, TopicNotFound
from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord, message_size
from storage.topic import PublishItem, PublishResult, Topic


class Clock:
    """Wall clock in ms that only moves when told (read from writer threads too)."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now


def item(
    producer_id: str | None = None,
    key: str | None = None,
    partition: int | None = None,
    value: bytes = b"1",
) -> PublishItem:
    return PublishItem(NewRecord(value, key=key, producer_id=producer_id), partition)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def storage(tmp_path: Path, clock: Clock) -> AsyncIterator[Storage]:
    opened = await Storage.open(tmp_path, wall_ms=clock, writer_threads=2)
    yield opened
    await opened.close()


async def make_topic(storage: Storage, partitions: int = 3, window_ms: int = 10_000) -> Topic:
    config = TopicConfig(partitions=partitions, dedup_window_ms=window_ms)
    return await storage.create_topic("t", config)


def end_offsets(topic: Topic) -> list[int]:
    return [p.end_offset for p in topic.partitions]


async def test_same_key_always_lands_on_same_partition(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=7)
    assert topic.choose_partition("user-42") == crc32c.crc32c(b"user-42") % 7
    assert topic.choose_partition("é") == crc32c.crc32c("é".encode()) % 7
    assert topic.choose_partition(None) is None
    results = await topic.publish([item(key="user-42") for _ in range(5)], Acks.LEADER)
    assert {r.partition for r in results} == {crc32c.crc32c(b"user-42") % 7}
    assert [r.offset for r in results] == [0, 1, 2, 3, 4]


async def test_keyless_batch_shares_one_partition_and_batches_rotate(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=3)
    seen = []
    for _ in range(3):
        results = await topic.publish([item(), item(), item()], Acks.LEADER)
        assert len({r.partition for r in results}) == 1
        seen.append(results[0].partition)
    assert sorted(seen) == [0, 1, 2]
    assert end_offsets(topic) == [3, 3, 3]


async def test_explicit_partition_wins_and_bad_one_is_refused(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=2)
    results = await topic.publish([item(key="k", partition=1), item(partition=0)], Acks.ALL)
    assert [(r.partition, r.offset) for r in results] == [(1, 0), (0, 0)]
    with pytest.raises(PartitionNotFound):
        await topic.publish([item("id-1"), item(partition=2)], Acks.ALL)
    assert topic._pending == {}  # the refused batch claimed no producer id
    assert (await topic.publish([item("id-1")], Acks.ALL))[0].duplicate is False


async def test_duplicate_in_same_batch_gets_first_partition_and_offset(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=4)
    results = await topic.publish(
        [item("a", key="x"), item("b"), item("a", key="other"), item("a")], Acks.ALL
    )
    first = results[0]
    assert first.duplicate is False
    assert results[2] == results[3] == PublishResult(first.partition, first.offset, True)
    assert sum(end_offsets(topic)) == 2


async def test_results_come_back_in_request_order(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=3)
    keys = [f"k{i}" for i in range(30)]
    results = await topic.publish(
        [item(key=k, value=str(i).encode()) for i, k in enumerate(keys)], Acks.ALL
    )
    for i, (key, result) in enumerate(zip(keys, results, strict=True)):
        assert result.partition == topic.choose_partition(key)
        [record] = await topic.partitions[result.partition].read(result.offset, 1, 1 << 20)
        assert record.value == str(i).encode()


async def test_republish_within_window_is_duplicate_and_after_window_is_new(
    storage: Storage, clock: Clock
) -> None:
    topic = await make_topic(storage, partitions=2, window_ms=5_000)
    [first] = await topic.publish([item("order-1")], Acks.ALL)
    clock.now += 4_999
    [again] = await topic.publish([item("order-1", key="moved")], Acks.ALL)
    assert again == PublishResult(first.partition, first.offset, True)
    clock.now += 1  # 5 s after the FIRST publish: the window has passed
    [later] = await topic.publish([item("order-1")], Acks.ALL)
    assert later.duplicate is False
    assert sum(end_offsets(topic)) == 2


async def test_duplicate_answered_at_acks_all_is_fsynced_first(storage: Storage) -> None:
    # The first publish was acks=1: only written. A retry at acks=all that is answered
    # as a duplicate makes the same promise as a new record, so the original is synced.
    topic = await make_topic(storage, partitions=1)
    partition = topic.partitions[0]
    await topic.publish([item("order-1")], Acks.LEADER)
    assert partition.fsync_count == 0
    [again, repeat] = await topic.publish([item("order-1"), item("order-1")], Acks.ALL)
    assert again.duplicate and repeat.duplicate and partition.fsync_count == 1
    [_, _] = await topic.publish([item("order-1"), item("order-1")], Acks.LEADER)
    assert partition.fsync_count == 1  # acks=1 duplicates promise nothing more

    racing = await asyncio.gather(
        topic.publish([item("order-2")], Acks.LEADER), topic.publish([item("order-2")], Acks.ALL)
    )
    assert [r.duplicate for [r] in racing] == [False, True]
    assert partition.fsync_count == 2
    assert partition.end_offset == 2


async def test_concurrent_publishes_of_one_id_append_one_record(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=3)
    batches = [[item("same"), item(f"own-{n}")] for n in range(5)]
    outcomes = await asyncio.gather(*(topic.publish(b, Acks.ALL) for b in batches))
    same = [results[0] for results in outcomes]
    assert len({(r.partition, r.offset) for r in same}) == 1
    assert [r.duplicate for r in same].count(False) == 1
    assert sum(end_offsets(topic)) == 6
    assert topic._pending == {}


async def test_counters_count_appended_records_not_duplicates(storage: Storage) -> None:
    topic = await make_topic(storage)
    record = NewRecord(b'{"a":1}', key="k", headers={"h": "v"}, producer_id="p")
    await topic.publish([PublishItem(record), PublishItem(record)], Acks.ALL)
    await topic.publish([PublishItem(record), item(value=b"xy")], Acks.ALL)
    assert topic.messages_total == 2
    assert topic.bytes_total == message_size(record.value, "k", {"h": "v"}) + 2


async def test_failed_append_propagates_and_releases_ids(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=2)
    await topic.partitions[1].close()  # appends to it now fail as a full disk would
    with pytest.raises(StorageUnavailable):
        await topic.publish([item("a", partition=0), item("b", partition=1)], Acks.ALL)
    assert topic._pending == {}
    # What landed on the healthy partition is remembered, so a producer retry does not
    # duplicate it; what failed is not, so the retry appends it.
    [a, b] = await topic.publish([item("a"), item("b", partition=0)], Acks.ALL)
    assert a == PublishResult(0, 0, True)
    assert b == PublishResult(0, 1, False)


async def test_publish_racing_a_failed_append_appends_itself(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=2)
    await topic.partitions[1].close()
    failing = topic.publish([item("x", partition=1)], Acks.ALL)
    racing = topic.publish([item("x", partition=0)], Acks.ALL)
    outcomes = await asyncio.gather(failing, racing, return_exceptions=True)
    assert isinstance(outcomes[0], StorageUnavailable)
    assert outcomes[1] == [PublishResult(0, 0, False)]
    assert topic._pending == {}


async def test_cancelled_publish_still_registers_what_it_appended(storage: Storage) -> None:
    topic = await make_topic(storage, partitions=1)
    task = asyncio.ensure_future(topic.publish([item("c")], Acks.ALL))
    await asyncio.sleep(0)  # the append is handed to the writer
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # A retry resolves to the one record, whether or not the cancelled append finished first.
    [retry] = await topic.publish([item("c")], Acks.ALL)
    assert (retry.partition, retry.offset) == (0, 0)
    assert topic.partitions[0].end_offset == 1


async def test_publish_to_closed_topic_is_topic_not_found(storage: Storage) -> None:
    topic = await make_topic(storage)
    await storage.delete_topic("t")
    with pytest.raises(TopicNotFound):
        await topic.publish([item()], Acks.ALL)
