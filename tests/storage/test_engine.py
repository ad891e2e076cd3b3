"""Storage: the data directory across open/create/delete/reopen, retention, and dedup that
survives a restart and a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from herald.protocol.errors import StorageUnavailable, TopicConflict, TopicNotFound
from storage.config import TopicConfig
from storage.engine import Storage
from storage.metadata import MetadataStore
from storage.record import Acks, NewRecord
from storage.topic import PublishItem, PublishResult, Topic

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now


def with_ids(*ids: str) -> list[PublishItem]:
    return [PublishItem(NewRecord(b"1", key=i, producer_id=i)) for i in ids]


async def test_open_creates_the_layout(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path / "data")
    try:
        assert storage.topics() == []
        names = {p.name for p in (tmp_path / "data").iterdir()}
        assert {"meta.db", "topics", "cursors", "trash"} <= names
        assert storage.cursors.directory == tmp_path / "data" / "cursors"
    finally:
        await storage.close()


async def test_topics_and_records_survive_reopen(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    config = TopicConfig(partitions=3, retention_ms=None, dedup_window_ms=60_000)
    topic = await storage.create_topic("orders", config)
    await storage.create_topic("audit", TopicConfig())
    assert (tmp_path / "topics" / "orders" / "2").is_dir()
    await topic.publish([PublishItem(NewRecord(b"1"), partition=2)] * 4, Acks.ALL)
    await storage.close()

    storage = await Storage.open(tmp_path)
    try:
        assert [t.name for t in storage.topics()] == ["audit", "orders"]
        reopened = storage.topic("orders")
        assert reopened is not None
        assert reopened.config == config
        assert [p.end_offset for p in reopened.partitions] == [0, 0, 4]
        assert reopened.messages_total == 0  # counts appends since this start only
        assert storage.topic("missing") is None
    finally:
        await storage.close()


async def test_create_existing_topic_conflicts_and_ensure_returns_it(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    try:
        created = await storage.create_topic("t", TopicConfig(partitions=2))
        with pytest.raises(TopicConflict):
            await storage.create_topic("t", TopicConfig(partitions=2))
        assert await storage.ensure_topic("t", TopicConfig(partitions=9)) == (created, False)
        # Concurrent auto-creates of a new name create it once.
        outcomes = await asyncio.gather(
            *(storage.ensure_topic("auto", TopicConfig()) for _ in range(3))
        )
        assert [created for _, created in outcomes].count(True) == 1
        assert len({id(topic) for topic, _ in outcomes}) == 1
    finally:
        await storage.close()


async def test_delete_topic_removes_everything_and_name_starts_fresh(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    try:
        topic = await storage.create_topic("t", TopicConfig(partitions=2))
        await topic.publish(with_ids("a", "b", "c"), Acks.ALL)
        storage.metadata.put_subscription("s1", {"topic": "t"})
        storage.metadata.put_subscription("other", {"topic": "u"})

        assert await storage.delete_topic("t") == ["s1"]
        assert storage.topic("t") is None
        assert not (tmp_path / "topics" / "t").exists()
        assert list((tmp_path / "trash").iterdir()) == []
        assert list(storage.metadata.subscriptions()) == ["other"]
        with pytest.raises(TopicNotFound):
            await storage.delete_topic("t")

        again = await storage.create_topic("t", TopicConfig(partitions=2))
        [result] = await again.publish(with_ids("a"), Acks.ALL)
        assert (result.offset, result.duplicate) == (0, False)  # no old records, no old ids
    finally:
        await storage.close()

    storage = await Storage.open(tmp_path)
    try:
        topic = storage.topic("t")
        assert topic is not None
        assert sum(p.end_offset for p in topic.partitions) == 1
    finally:
        await storage.close()


async def test_a_new_topic_never_opens_a_directory_it_finds(tmp_path: Path) -> None:
    """A delete whose steps failed on a failing disk (the close's fsync, then meta.db's
    commit) left the topic's directory behind while the topic was gone; the topic created
    again under that name opened it and served the deleted records as its own (the
    nemesis, seed 2006, 2026-11-28: "deleted-topic-served"). A directory that a create
    finds is such a leftover: it goes to the trash first."""
    storage = await Storage.open(tmp_path)
    try:
        old = await storage.create_topic("old", TopicConfig())
        await old.publish(with_ids("a", "b"), Acks.ALL)
        shutil.copytree(tmp_path / "topics" / "old", tmp_path / "topics" / "t")  # left over
        topic = await storage.create_topic("t", TopicConfig())
        assert topic.partitions[0].end_offset == 0
        assert await topic.partitions[0].read(0, 100, 1 << 20) == []
        [result] = await topic.publish(with_ids("a"), Acks.ALL)
        assert (result.offset, result.duplicate) == (0, False)
        assert list((tmp_path / "trash").iterdir()) == []
    finally:
        await storage.close()


async def test_open_sweeps_leftovers_of_an_interrupted_delete(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    topic = await storage.create_topic("t", TopicConfig())
    await topic.publish(with_ids("a"), Acks.ALL)
    await storage.close()
    # A crash after meta.db forgot the topic but before its directory went to the trash,
    # and an earlier crash in the middle of emptying the trash.
    metadata = MetadataStore(tmp_path / "meta.db")
    metadata.delete_topic("t")
    metadata.close()
    (tmp_path / "trash" / "old.123" / "0").mkdir(parents=True)
    (tmp_path / "trash" / "stray").write_bytes(b"x")

    storage = await Storage.open(tmp_path)
    try:
        assert storage.topics() == []
        assert list((tmp_path / "topics").iterdir()) == []
        assert list((tmp_path / "trash").iterdir()) == []
        recreated = await storage.create_topic("t", TopicConfig())
        assert recreated.partitions[0].end_offset == 0
    finally:
        await storage.close()


async def test_retention_pass_deletes_old_segments(tmp_path: Path) -> None:
    clock = Clock()
    storage = await Storage.open(tmp_path, wall_ms=clock, segment_bytes=4096)
    try:
        topic = await storage.create_topic("t", TopicConfig(partitions=1, retention_ms=60_000))
        big = [PublishItem(NewRecord(b"x" * 1000), partition=0)]
        for _ in range(20):
            await topic.publish(big, Acks.LEADER)
        partition = topic.partitions[0]
        await storage.run_retention()
        assert partition.start_offset == 0  # nothing is old yet

        clock.now += 30_000
        await topic.publish(big, Acks.LEADER)  # offset 20
        clock.now += 30_001  # offsets 0..19 are past retention, 20 is not
        await storage.run_retention()
        assert 0 < partition.start_offset <= 20  # whole segments only
        records = await partition.read(0, 100, 1 << 30)
        assert records[0].offset == partition.start_offset
        assert records[-1].offset == 20

        clock.now += 60_000  # everything is past retention, the active segment included
        await storage.run_retention()
        assert partition.start_offset == partition.end_offset == 21
        [result] = await topic.publish(big, Acks.LEADER)
        assert result.offset == 21  # offsets are never reused
    finally:
        await storage.close()


async def test_dedup_survives_restart(tmp_path: Path) -> None:
    clock = Clock()
    storage = await Storage.open(tmp_path, wall_ms=clock)
    topic = await storage.create_topic("t", TopicConfig(partitions=3, dedup_window_ms=10_000))
    clock.now -= 20_000
    [old] = await topic.publish(with_ids("old"), Acks.ALL)  # already outside the window
    clock.now += 20_000
    first = await topic.publish(with_ids("a", "b", "c"), Acks.ALL)
    await storage.close()

    clock.now += 9_000
    storage = await Storage.open(tmp_path, wall_ms=clock)
    try:
        topic = storage.topic("t")
        assert topic is not None
        again = await topic.publish(with_ids("c", "a", "b", "old"), Acks.ALL)
        assert again[:3] == [
            PublishResult(r.partition, r.offset, True) for r in (first[2], first[0], first[1])
        ]
        assert again[3].duplicate is False and again[3] != old
        assert topic.messages_total == 1
    finally:
        await storage.close()


async def topic_t_with(tmp_path: Path, *items: PublishItem) -> list[PublishResult]:
    """Create topic "t" (one partition) holding ``items``, and close the storage."""
    storage = await Storage.open(tmp_path)
    try:
        topic = await storage.create_topic("t", TopicConfig(partitions=1))
        return await topic.publish(items, Acks.ALL) if items else []
    finally:
        await storage.close()


async def reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rebuild: Callable[[Topic], Awaitable[None]]
) -> tuple[Storage, Topic]:
    """Open the storage again with ``rebuild`` in place of the dedup index rebuild."""
    monkeypatch.setattr(Topic, "_rebuild_dedup", rebuild)
    storage = await Storage.open(tmp_path)
    topic = storage.topic("t")
    assert topic is not None
    return storage, topic


async def test_topic_serves_while_its_dedup_index_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [first] = await topic_t_with(tmp_path, *with_ids("a"))

    # Hold the rebuild (as a window of millions of ids would) until the gate opens.
    gate = asyncio.Event()
    rebuild = Topic._rebuild_dedup

    async def held(self: Topic) -> None:
        await gate.wait()
        await rebuild(self)

    storage, topic = await reopened(tmp_path, monkeypatch, held)
    try:
        # Reads and publishes without ids go on; a publish with an id waits.
        [plain] = await topic.publish([PublishItem(NewRecord(b"2"))], Acks.ALL)
        assert plain.offset == 1
        assert [r.value for r in await topic.partitions[0].read(0, 10, 1 << 20)] == [b"1", b"2"]
        retry = asyncio.ensure_future(topic.publish(with_ids("a"), Acks.ALL))
        await asyncio.sleep(0.1)
        assert not retry.done()
        gate.set()
        assert await asyncio.wait_for(retry, 10) == [PublishResult(0, first.offset, True)]
        assert topic.partitions[0].end_offset == 2
    finally:
        await storage.close()


async def test_failed_dedup_rebuild_refuses_ids_and_takes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await topic_t_with(tmp_path)

    async def broken(self: Topic) -> None:
        raise OSError("EIO while re-reading the window")

    storage, topic = await reopened(tmp_path, monkeypatch, broken)
    try:
        with pytest.raises(StorageUnavailable, match="cannot be checked"):
            await topic.publish(with_ids("a"), Acks.ALL)
        [plain] = await topic.publish([PublishItem(NewRecord(b"2"))], Acks.ALL)
        assert plain.offset == 0
    finally:
        await storage.close()


async def test_closing_while_the_rebuild_runs_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await topic_t_with(tmp_path)

    async def forever(self: Topic) -> None:
        await asyncio.Event().wait()

    storage, topic = await reopened(tmp_path, monkeypatch, forever)
    waiting = asyncio.ensure_future(topic.publish(with_ids("a"), Acks.ALL))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(storage.close(), 10)
    with pytest.raises((StorageUnavailable, TopicNotFound)):
        await asyncio.wait_for(waiting, 10)


async def test_dedup_survives_sigkill_of_the_publisher(tmp_path: Path) -> None:
    count = 50
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("publish_child.py")),
        str(tmp_path),
        str(count),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    try:
        line = await asyncio.wait_for(child.stdout.readline(), timeout=30)  # type: ignore[union-attr]
    finally:
        child.send_signal(signal.SIGKILL)
        await child.communicate()
    assert child.returncode == -signal.SIGKILL
    published = [tuple(pair) for pair in orjson.loads(line)]
    assert len(published) == count

    storage = await Storage.open(tmp_path)
    try:
        topic = storage.topic("t")
        assert topic is not None
        again = await topic.publish(with_ids(*(f"id-{i}" for i in range(count))), Acks.ALL)
        assert [(r.partition, r.offset) for r in again] == published
        assert all(r.duplicate for r in again)
        assert sum(p.end_offset for p in topic.partitions) == count
    finally:
        await storage.close()


async def test_flush_fsyncs_leader_appends(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path)
    try:
        topic = await storage.create_topic("t", TopicConfig(partitions=2))
        await topic.publish([PublishItem(NewRecord(b"1"), partition=1)], Acks.LEADER)
        before = topic.partitions[1].fsync_count
        await storage.flush()
        assert topic.partitions[1].fsync_count == before + 1
    finally:
        await storage.close()
