"""The partitions' open descriptors stay within their bound (PROTOCOL §6): idle
partitions' files are fsynced and closed, and open again on use, while appends (group
commit on several writer threads), reads, retention, truncation and recovery stay right."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from storage.config import TopicConfig
from storage.engine import Storage
from storage.open_files import OpenFiles
from storage.partition_log import LogConfig, PartitionLog
from storage.record import Acks, NewRecord
from storage.topic import PublishItem

TOPICS = 120
BOUND = 30  # descriptors: ten partitions' active segments


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def item(value: bytes) -> list[PublishItem]:
    return [PublishItem(NewRecord(value))]


async def read_all(storage: Storage, name: str) -> list[bytes]:
    topic = storage.topic(name)
    assert topic is not None
    partition = topic.partitions[0]
    # From the files, not the tail cache: the point is that they open again.
    records = await asyncio.to_thread(partition.log.read, 0, 1000, 1 << 20)
    return [r.value for r in records]


async def test_many_topics_keep_descriptors_within_the_bound(tmp_path: Path) -> None:
    before = open_descriptors()
    storage = await Storage.open(tmp_path, max_open_files=BOUND, writer_threads=4)
    try:
        for i in range(TOPICS):
            topic = await storage.create_topic(f"t{i}", TopicConfig(retention_ms=None))
            await topic.publish(item(b"first %d" % i), Acks.ALL)
            assert storage.open_files.count <= BOUND
        # meta.db, the lock and the writer threads' own take a few; never 3 per topic.
        assert open_descriptors() - before <= BOUND + 10
        assert storage.open_files.evictions > 0
        # Every topic again, side by side (several writer threads, group commit): each
        # append reopens the files of a partition whose files were closed.
        results = await asyncio.gather(
            *(
                storage.topic(f"t{i}").publish(item(b"second %d" % i), acks)  # type: ignore[union-attr]
                for i in range(TOPICS)
                for acks in (Acks.ALL, Acks.LEADER)
            )
        )
        assert all(r[0].offset in (1, 2) for r in results)
        await storage.flush()
        assert storage.open_files.count <= BOUND
        for topic in storage.topics():  # released files were fsynced: flush says so
            assert [p.fsynced_offset for p in topic.partitions] == [3]
        for i in range(TOPICS):
            values = await read_all(storage, f"t{i}")
            assert values == [b"first %d" % i, b"second %d" % i, b"second %d" % i]
    finally:
        await storage.close()
    assert open_descriptors() <= before + 2

    # Recovery of all of them, within the bound too; then appends go on at the right end.
    storage = await Storage.open(tmp_path, max_open_files=BOUND)
    try:
        assert storage.open_files.count <= BOUND
        assert open_descriptors() - before <= BOUND + 10
        for i in range(TOPICS):
            [result] = await storage.topic(f"t{i}").publish(item(b"third"), Acks.ALL)  # type: ignore[union-attr]
            assert result.offset == 3
            values = await read_all(storage, f"t{i}")
            assert values[0] == b"first %d" % i and values[-1] == b"third"
    finally:
        await storage.close()


def test_released_log_rolls_truncates_and_applies_retention(tmp_path: Path) -> None:
    bound = OpenFiles(3)  # one active segment's three files
    config = LogConfig(segment_bytes=200, index_interval_bytes=1)
    a = PartitionLog(tmp_path / "a", 0, config, bound)
    b = PartitionLog(tmp_path / "b", 0, config, bound)
    try:
        for n in range(20):
            for log in (a, b):
                log.append([NewRecord(b"%02d" % n + b"x" * 40)], 1000 + n)
                held = a.segments[-1].open_descriptors + b.segments[-1].open_descriptors
                assert held == bound.count <= 3
        assert len(a.segments) > 3
        a.truncate_to(15)  # a released log cut in the middle of its active segment
        assert a.end_offset == 15
        assert [r.value[:2] for r in a.read(13, 10, 1 << 20)] == [b"13", b"14"]
        b.flush()
        deleted = b.apply_retention(1_000_000, retention_ms=1000, retention_bytes=None)
        assert deleted > 0 and b.start_offset == b.end_offset == 20
        a.reset_to(40)
        a.append([NewRecord(b"after reset")], 2000)
        assert [r.offset for r in a.read(0, 10, 1 << 20)] == [40]
        assert bound.count <= 3
    finally:
        a.close()
        b.close()
    assert bound.count == 0
    again = PartitionLog(tmp_path / "a", 0, config, bound)
    try:
        assert again.end_offset == 41
        assert [r.value for r in again.read(40, 10, 1 << 20)] == [b"after reset"]
    finally:
        again.close()
