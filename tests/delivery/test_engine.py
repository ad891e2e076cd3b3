"""DeliveryEngine against a real Storage on a temp dir; consumers are plain in-test sinks
that collect what the engine pushes (a test double of the WebSocket session)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from delivery.config import Backoff, DeliveryMode, SubscriptionConfig
from delivery.engine import Delivery, DeliveryEngine
from delivery.start import StartAt
from herald.protocol.errors import (
    PartitionNotFound,
    SubscriptionConflict,
    SubscriptionNotFound,
    TopicNotFound,
)
from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem
from tests.helpers import FakeClock, wait_until

pytestmark = pytest.mark.timeout(30)


class Sink:
    """Collects deliveries; records its close code."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.frames: list[tuple[str, str, int]] = []
        self.closed: tuple[int, str] | None = None

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        self.frames.append((topic, subscription, len(deliveries)))
        self.deliveries.extend(deliveries)

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def ids(self) -> list[str]:
        return [d.record.id for d in self.deliveries]

    def attempts(self) -> list[tuple[str, int]]:
        return [(d.record.id, d.attempt) for d in self.deliveries]


async def publish(
    storage: Storage, topic: str, n: int, key: str | None = None, partition: int | None = None
) -> None:
    t = storage.topic(topic)
    assert t is not None
    items = [
        PublishItem(NewRecord(f"{i}".encode(), key=key, headers={"h": "v"}), partition)
        for i in range(n)
    ]
    await t.publish(items, Acks.LEADER)


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    s = await Storage.open(tmp_path / "data")
    await s.create_topic("t", TopicConfig(partitions=2))
    yield s
    await s.close()


@pytest.fixture
async def engine(storage: Storage) -> AsyncIterator[DeliveryEngine]:
    e = DeliveryEngine(storage, cursor_flush_interval=0.02)
    await e.start()
    yield e
    await e.stop()


def sub(**kw) -> SubscriptionConfig:
    kw.setdefault("topic", "t")
    kw.setdefault("start", StartAt.earliest())
    return SubscriptionConfig(**kw)


async def test_consumer_receives_published_records_within_credit(storage, engine):
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 5, partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 3)
    await wait_until(lambda: len(sink.deliveries) == 3)
    await engine.settled("s")  # PROTOCOL §3: no credit, nothing more
    assert sink.ids() == ["0-0", "0-1", "0-2"]
    assert engine.pause_reason("s") == "no_credit"
    assert all(frame[:2] == ("t", "s") for frame in sink.frames)
    engine.grant_credit(consumer, 10)
    await wait_until(lambda: len(sink.deliveries) == 5)


async def test_records_published_after_attach_are_pushed(storage, engine):
    await engine.create_subscription("s", sub())
    sink = Sink()
    engine.attach("s", sink, 100)
    await engine.settled("s")
    assert sink.deliveries == []
    await publish(storage, "t", 4, partition=1)
    await wait_until(lambda: sink.ids() == ["1-0", "1-1", "1-2", "1-3"])


async def test_new_subscription_at_latest_skips_older_records(storage, engine):
    await publish(storage, "t", 3, partition=0)
    await engine.create_subscription("s", sub(start=StartAt.latest()))
    sink = Sink()
    engine.attach("s", sink, 100)
    await publish(storage, "t", 1, partition=0)
    await wait_until(lambda: sink.ids() == ["0-3"])


async def test_create_is_idempotent_and_conflicts_on_a_different_config(engine):
    config, created = await engine.create_subscription("s", sub())
    assert created
    again, created = await engine.create_subscription("s", sub(start=StartAt.latest()))
    assert (again, created) == (config, False)
    with pytest.raises(SubscriptionConflict):
        await engine.create_subscription("s", sub(max_in_flight=7))
    assert (await engine.create_subscription("s", sub(max_in_flight=7), given={"topic"}))[
        1
    ] is False


async def test_subscription_on_a_missing_topic_is_refused(engine):
    with pytest.raises(TopicNotFound):
        await engine.create_subscription("s", sub(topic="nope"))


async def test_ack_reports_unknown_and_advances_the_floor(storage, engine):
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 2, partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 2)
    assert engine.ack(consumer, ["0-0", "0-1", "0-9"]) == (["0-0", "0-1"], ["0-9"])
    stats = engine.stats("s")
    assert stats["partitions"] == [
        {"partition": 0, "ack_floor": 2},
        {"partition": 1, "ack_floor": 0},
    ]
    assert (stats["acked_total"], stats["backlog"], stats["in_flight"]) == (2, 0, 0)


async def test_unacked_record_is_redelivered_after_its_deadline(storage):
    clock = FakeClock()
    engine = DeliveryEngine(storage, clock=clock)
    await engine.start()
    try:
        config = sub(ack_deadline_ms=30_000, retry_backoff=Backoff(1_000, 1_000))
        await engine.create_subscription("s", config)
        await publish(storage, "t", 1, partition=0)
        sink = Sink()
        engine.attach("s", sink, 10)
        await wait_until(lambda: sink.attempts() == [("0-0", 1)])
        clock.advance(29.9)
        engine.clock_moved()
        await engine.settled("s")
        assert sink.attempts() == [("0-0", 1)]  # the deadline has not passed
        clock.advance(0.1)  # it has: the record waits out its backoff (0.8..1 s)
        engine.clock_moved()
        await engine.settled("s")
        assert sink.attempts() == [("0-0", 1)] and engine.pause_reason("s") == "backoff"
        clock.advance(1.0)
        engine.clock_moved()
        await wait_until(lambda: sink.attempts() == [("0-0", 1), ("0-0", 2)])
    finally:
        await engine.stop()


async def test_detach_gives_records_to_another_consumer_at_once(storage, engine):
    await engine.create_subscription("s", sub(ack_deadline_ms=60_000))
    await publish(storage, "t", 3, partition=0)
    first, second = Sink(), Sink()
    consumer = engine.attach("s", first, 10)
    await wait_until(lambda: len(first.deliveries) == 3)
    engine.attach("s", second, 10)
    engine.detach(consumer)
    await wait_until(lambda: len(second.deliveries) == 3)
    assert second.attempts() == [("0-0", 2), ("0-1", 2), ("0-2", 2)]
    with pytest.raises(SubscriptionNotFound):
        engine.ack(consumer, ["0-0"])


async def test_dead_letter_goes_to_the_dead_letter_topic_with_source_headers(storage, engine):
    await engine.create_subscription("s", sub(max_deliveries=1, dead_letter_topic="dlq"))
    await publish(storage, "t", 1, key="k", partition=1)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 1)
    engine.nack(consumer, ["1-0"], None)
    await wait_until(lambda: engine.stats("s")["dead_lettered_total"] == 1)
    dlq = storage.topic("dlq")
    assert dlq is not None
    records = [r for p in dlq.partitions for r in await p.read(0, 10, 1 << 20)]
    assert len(records) == 1
    record = records[0]
    assert (record.value, record.key) == (b"0", "k")
    assert record.headers == {
        "h": "v",
        "herald-source-topic": "t",
        "herald-source-partition": "1",
        "herald-source-offset": "0",
        "herald-source-deliveries": "1",
        "herald-source-subscription": "s",
        "herald-source-last-error": "nack",
        "herald-source-reason": "max_deliveries",
    }
    assert engine.stats("s")["partitions"][1]["ack_floor"] == 1


async def test_dead_letter_without_topic_is_dropped_and_counted(storage, engine):
    await engine.create_subscription("s", sub(max_deliveries=1))
    await publish(storage, "t", 1, partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 1)
    engine.nack(consumer, ["0-0"], 0)
    await wait_until(lambda: engine.stats("s")["dead_lettered_total"] == 1)
    assert engine.stats("s")["backlog"] == 0


async def test_seek_to_earliest_replays_from_attempt_1(storage, engine):
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 2, partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 2)
    engine.ack(consumer, ["0-0"])
    await engine.seek("s", StartAt.earliest())
    await wait_until(lambda: len(sink.deliveries) == 4)
    assert sink.attempts()[2:] == [("0-0", 1), ("0-1", 1)]
    assert engine.ack(consumer, ["0-1"]) == (["0-1"], [])


async def test_seek_by_offsets_clamps_to_the_end_and_checks_partitions(storage, engine):
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 2, partition=0)
    await engine.seek("s", StartAt.at_offsets({0: 100}))
    assert engine.stats("s")["partitions"][0]["ack_floor"] == 2
    with pytest.raises(PartitionNotFound):
        await engine.seek("s", StartAt.at_offsets({0: 0, 5: 0}))
    assert engine.stats("s")["partitions"][0]["ack_floor"] == 2  # nothing changed


async def test_delete_closes_consumers_with_4410(engine):
    await engine.create_subscription("s", sub())
    sink = Sink()
    engine.attach("s", sink, 10)
    await engine.delete_subscription("s")
    assert sink.closed is not None and sink.closed[0] == 4410
    with pytest.raises(SubscriptionNotFound):
        engine.get("s")
    assert engine.names() == []


async def test_topic_deleted_deletes_its_subscriptions(storage, engine):
    await engine.create_subscription("s", sub())
    sink = Sink()
    engine.attach("s", sink, 10)
    await storage.delete_topic("t")
    await engine.topic_deleted("t")
    assert sink.closed is not None and sink.closed[0] == 4410
    assert engine.names() == []


async def test_acks_survive_a_restart_and_unacked_records_come_back_with_next_attempt(tmp_path):
    storage = await Storage.open(tmp_path / "d")
    await storage.create_topic("t", TopicConfig())
    engine = DeliveryEngine(storage, cursor_flush_interval=0.02)
    await engine.start()
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 4)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 4)
    engine.ack(consumer, ["0-0", "0-2"])
    await engine.stop()
    assert sink.closed is not None and sink.closed[0] == 1001
    await storage.close()

    storage = await Storage.open(tmp_path / "d")
    engine = DeliveryEngine(storage, cursor_flush_interval=0.02)
    await engine.start()
    try:
        assert engine.get("s") == sub()
        sink = Sink()
        engine.attach("s", sink, 10)
        await wait_until(lambda: len(sink.deliveries) == 2)
        assert sink.attempts() == [("0-1", 2), ("0-3", 2)]
    finally:
        await engine.stop()
        await storage.close()


async def test_attach_after_stop_is_closed_with_1001(engine):
    await engine.create_subscription("s", sub())
    await engine.stop()
    sink = Sink()
    engine.attach("s", sink, 10)
    assert sink.closed is not None and sink.closed[0] == 1001


async def test_at_most_once_records_count_as_acked_when_sent(storage, engine):
    await engine.create_subscription("s", sub(delivery=DeliveryMode.AT_MOST_ONCE))
    await publish(storage, "t", 3, partition=0)
    sink = Sink()
    engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 3)
    stats = engine.stats("s")
    assert (stats["acked_total"], stats["backlog"], stats["in_flight"]) == (3, 0, 0)


async def test_acked_cursor_is_flushed_without_a_stop(storage, engine):
    await engine.create_subscription("s", sub())
    await publish(storage, "t", 3, partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: len(sink.deliveries) == 3)
    engine.ack(consumer, ["0-0", "0-1"])

    def flushed() -> bool:
        snapshot = storage.cursors.load("s")
        return snapshot is not None and snapshot.partitions[0].ack_floor == 2

    await wait_until(flushed)


async def test_ordered_by_key_holds_the_key_until_acked(storage, engine):
    await engine.create_subscription("s", sub(ordered_by_key=True))
    await publish(storage, "t", 2, key="a", partition=0)
    await publish(storage, "t", 1, key="b", partition=0)
    sink = Sink()
    consumer = engine.attach("s", sink, 10)
    await wait_until(lambda: sink.ids() == ["0-0", "0-2"])
    engine.ack(consumer, ["0-0"])
    await wait_until(lambda: sink.ids() == ["0-0", "0-2", "0-1"])


async def test_many_records_flow_through_in_offset_order(storage, engine):
    await engine.create_subscription("s", sub(max_in_flight=500))
    t = storage.topic("t")
    assert t is not None
    for _ in range(10):
        await t.publish([PublishItem(NewRecord(b"1"), 0) for _ in range(500)], Acks.NONE)
    sink = Sink()
    consumer = engine.attach("s", sink, 1_000_000)
    acked = 0

    def drain() -> bool:
        nonlocal acked
        batch = sink.ids()[acked:]
        if batch:
            engine.ack(consumer, batch)
            acked += len(batch)
        return acked == 5000

    await wait_until(drain)
    assert [d.record.offset for d in sink.deliveries] == list(range(5000))
    assert engine.stats("s")["backlog"] == 0


async def test_retention_past_the_cursor_is_skipped_and_counted_as_expired(tmp_path):
    now = [time.time_ns() // 1_000_000]
    storage = await Storage.open(tmp_path / "d", segment_bytes=256, wall_ms=lambda: now[0])
    await storage.create_topic("t", TopicConfig(retention_ms=1000))
    engine = DeliveryEngine(storage, cursor_flush_interval=0.02)
    await engine.start()
    try:
        await engine.create_subscription("s", sub())
        for _ in range(20):
            await publish(storage, "t", 5)
        now[0] += 10_000
        await publish(storage, "t", 1)  # a fresh segment that stays
        await storage.run_retention()
        topic = storage.topic("t")
        assert topic is not None
        start = topic.partitions[0].start_offset
        assert start > 0
        stats = engine.stats("s")
        assert stats["expired_total"] == start
        assert stats["partitions"][0]["ack_floor"] == start
        sink = Sink()
        engine.attach("s", sink, 1000)
        await wait_until(lambda: len(sink.deliveries) == 101 - start)
        assert sink.deliveries[0].record.offset == start
    finally:
        await engine.stop()
        await storage.close()
