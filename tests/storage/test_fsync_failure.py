"""A log whose fsync failed, on a real failing disk (tests/failing_disk.py; needs root).

Linux reports a failed write-back once, to the first fsync after it, and marks the pages
clean (PostgreSQL's "fsyncgate"). Before, the next fsync of the log then succeeded over
records that never reached the disk: a later acks=all publish was answered, and after a
power loss the log held zeros where the earlier records were, so even the acknowledged
record after them could not be read. Each test here ends with a power cut of the disk
and reads what is on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from herald.protocol.errors import StorageUnavailable
from storage.config import TopicConfig
from storage.engine import Storage
from storage.partition_log import PartitionLog
from storage.record import Acks, NewRecord
from storage.topic import PublishItem
from tests.failing_disk import FailingDisk, failing_disk, needs_failing_disk

pytestmark = needs_failing_disk

# Every record spans new blocks of the image: a write inside a block the backing file
# already holds would be written back, and fsynced, fine.
VALUE_BYTES = 200_000
# Written while the disk fails: more than the little room a full backing tmpfs keeps.
B_RECORDS = 16
B_TAGS = [f"b{k}" for k in range(B_RECORDS)]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[FailingDisk]:
    mountpoint = tmp_path / "data"
    mountpoint.mkdir()
    with failing_disk(tmp_path / "backing", mountpoint) as mounted:
        yield mounted


def append(log: PartitionLog, tag: str, count: int) -> None:
    for k in range(count):
        value = f"{tag}{k}:".encode().ljust(VALUE_BYTES, b"x")
        log.append([NewRecord(value)], int(time.time() * 1000))


def tags(log: PartitionLog) -> list[str]:
    return [r.value.split(b":")[0].decode() for r in log.read(0, 1000, 1 << 30)]


def evict(log: PartitionLog) -> None:
    """Drop the log's clean pages from the page cache, as memory pressure may."""
    fd = os.open(log.segments[-1].path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fail_writing_b(disk: FailingDisk, log: PartitionLog) -> None:
    """a0-a1 on disk; then, the disk failing, b0-b15 written and their fsync failed."""
    append(log, "a", 2)
    log.flush()  # acks=all: on disk
    disk.fail_fsyncs()
    append(log, "b", B_RECORDS)  # acks=1: written, not fsynced
    with pytest.raises(StorageUnavailable, match="cannot fsync"):
        log.flush()


def lose_b(disk: FailingDisk, log: PartitionLog) -> None:
    """fail_writing_b, then b's pages evicted before the disk heals: b is gone."""
    fail_writing_b(disk, log)
    evict(log)
    disk.heal()
    with pytest.raises(StorageUnavailable, match="lost its bytes"):
        log.flush()


def after_power_loss(disk: FailingDisk, log: PartitionLog) -> PartitionLog:
    directory = log.directory
    log.close()
    disk.power_cut()
    return PartitionLog(directory)


def kill(log: PartitionLog) -> Path:
    """What kill -9 leaves of the log: its descriptors closed, nothing flushed."""
    for segment in log.segments:
        segment._close_files()
    return log.directory


def test_a_power_cut_loses_what_was_not_written_back_even_on_a_healthy_disk(disk):
    """The cut these tests rely on is a whole one: a rewrite in place of an fsynced file
    is gone (the kernel writes back only pages dirty for 30 s), not written back by the
    unmount as a plain unmount would."""
    path = disk.mountpoint / "f"
    with path.open("wb") as f:
        f.write(b"old")
        f.flush()
        os.fsync(f.fileno())
    with path.open("r+b") as f:  # not truncated: ext4 writes back a truncated file's
        f.write(b"new")  # new data at close (auto_da_alloc)
    disk.power_cut()
    assert path.read_bytes() == b"old"


def test_after_a_power_cut_the_log_holds_what_was_fsynced_and_takes_appends(disk):
    log = PartitionLog(disk.mountpoint / "t" / "0")
    append(log, "a", 2)
    log.flush()  # acks=all
    append(log, "b", 3)  # acks=1: in the page cache only
    directory = kill(log)
    disk.power_cut()
    log = PartitionLog(directory)
    try:
        assert tags(log) == ["a0", "a1"]
        append(log, "c", 1)
        log.flush()
        assert tags(log) == ["a0", "a1", "c0"]
    finally:
        log.close()


def test_a_flush_that_succeeds_after_a_failed_one_has_every_record_on_disk(disk):
    log = PartitionLog(disk.mountpoint / "t" / "0")
    fail_writing_b(disk, log)
    disk.heal()
    append(log, "c", 2)
    log.flush()  # acks=all answered: c, and everything before it, is on disk

    log = after_power_loss(disk, log)
    try:
        assert tags(log) == ["a0", "a1", *B_TAGS, "c0", "c1"]
        assert log.recovered_bytes == 0
    finally:
        log.close()


def test_a_failed_periodic_fsync_is_mended_by_the_next_periodic_flush(disk):
    """The periodic flush (flush_detached, off the writer thread) meets the failure. A
    detached fsync cannot know the lost pages were written again, so it fails until the
    writer has rewritten the log; the next periodic flush does that on the writer (with
    acks=1 alone, nothing else would)."""
    log = PartitionLog(disk.mountpoint / "t" / "0")
    try:
        append(log, "a", 2)
        log.flush()
        disk.fail_fsyncs()
        append(log, "b", B_RECORDS)
        first, second = log.flush_descriptor(), log.flush_descriptor()
        assert first is not None and second is not None
        with pytest.raises(StorageUnavailable, match="cannot fsync"):
            log.flush_detached(first)
        disk.heal()
        with pytest.raises(StorageUnavailable, match="waiting for its rewrite"):
            log.flush_detached(second)  # its fsync would succeed over the lost pages
        assert log.flush_descriptor() is None  # rewritten and fsynced, on the writer
        append(log, "c", 1)
        detached = log.flush_descriptor()
        assert detached is not None
        log.flush_detached(detached)  # mended: periodic fsyncs work again
    except BaseException:
        log.close()
        raise
    log = after_power_loss(disk, log)
    try:
        assert tags(log) == ["a0", "a1", *B_TAGS, "c0"]
    finally:
        log.close()


def test_records_evicted_before_their_rewrite_are_cut_and_the_log_stops_taking_writes(disk):
    """If the kernel dropped the clean pages before the rewrite, their records are gone:
    the flush says so, the log takes no more appends (a record after the hole would be
    acknowledged and then lost), and the next start recovers the log up to the hole."""
    log = PartitionLog(disk.mountpoint / "t" / "0")
    lose_b(disk, log)
    assert log.lost_offset == 2  # b0 on: what a replica cuts its log to (cluster/following.py)
    with pytest.raises(StorageUnavailable, match="lost its bytes"):
        append(log, "c", 1)
    with pytest.raises(StorageUnavailable, match="lost its bytes"):
        log.flush()

    directory = log.directory
    with pytest.raises(OSError, match="lost its bytes"):
        log.close()  # the files are closed all the same
    disk.power_cut()
    log = PartitionLog(directory)
    try:
        assert tags(log) == ["a0", "a1"]
        assert log.end_offset == 2
        append(log, "c", 1)  # a recovered log takes appends again
        log.flush()
        assert tags(log) == ["a0", "a1", "c0"]
    finally:
        log.close()


def test_a_log_cut_below_the_lost_records_takes_writes_again(disk):
    """A follower whose flush failed cuts its log back to what it had fsynced and fetches
    again from its leader: below the hole, the log is whole and takes appends."""
    log = PartitionLog(disk.mountpoint / "t" / "0")
    try:
        lose_b(disk, log)
        log.truncate_to(2)
        assert log.lost_offset is None
        append(log, "c", 1)
        log.flush()
    except BaseException:
        log.close()
        raise
    log = after_power_loss(disk, log)
    try:
        assert tags(log) == ["a0", "a1", "c0"]
    finally:
        log.close()


def test_a_process_killed_before_the_rewrite_leaves_a_log_the_next_start_makes_durable(disk):
    """The process dies after a failed fsync, before any rewrite; the disk heals and a new
    process opens the log. The write-back error was reported to the old process's
    descriptor only: the new one's fsync succeeded over the lost pages, an acks=all record
    appended after them was acknowledged, and the next power cut took it with them. After
    an unclean stop the active segment is now checked whole and copied at its first fsync."""
    log = PartitionLog(disk.mountpoint / "t" / "0")
    fail_writing_b(disk, log)
    disk.heal()
    log = PartitionLog(kill(log))
    log.sync_recovered()  # what opening a partition does (storage/partition.py)
    append(log, "c", 1)
    log.flush()  # acks=all answered
    log = after_power_loss(disk, log)
    try:
        assert tags(log) == ["a0", "a1", *B_TAGS, "c0"]
    finally:
        log.close()


async def test_a_retry_of_an_acks_all_publish_whose_fsync_failed_is_deduplicated(disk):
    """The records of an acks=all publish answered 503 because the fsync failed are in
    the log all the same. A retry with the same message ids must find them (PROTOCOL §2),
    not append them again (the nemesis's first failing-disk run, 2026-11-28, found each
    id twice in the log), and answers only once they are on disk."""
    data = disk.mountpoint / "data"
    storage = await Storage.open(data, writer_threads=1)
    try:
        topic = await storage.create_topic("t", TopicConfig(partitions=1))
        await topic.publish([PublishItem(NewRecord(b"a:", producer_id="a"))], Acks.ALL)
        batch = [
            PublishItem(NewRecord(f"{tag}:".encode().ljust(VALUE_BYTES, b"x"), producer_id=tag))
            for tag in B_TAGS
        ]
        disk.fail_fsyncs()
        with pytest.raises(StorageUnavailable):
            await topic.publish(batch, Acks.ALL)
        disk.heal()
        retry = await topic.publish(batch, Acks.ALL)
        assert [(r.offset, r.duplicate) for r in retry] == [(1 + k, True) for k in range(B_RECORDS)]
    finally:
        await storage.close()
    disk.power_cut()
    storage = await Storage.open(data, writer_threads=1)
    try:
        topic = storage.topic("t")
        assert topic is not None
        records = await topic.partitions[0].read(0, 1000, 1 << 30)
        assert [r.producer_id for r in records] == ["a", *B_TAGS]
    finally:
        await storage.close()
