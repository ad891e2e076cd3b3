"""SubscriptionRuntime run by its owner (the ephemeral tail's way): an at-most-once core
over a real Storage on a temp dir, with a consumer whose outbox is bounded in bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from delivery.config import DeliveryMode, SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import Delivery
from delivery.runtime import SubscriptionRuntime
from storage.config import TopicConfig
from storage.cursors import CursorSnapshot, PartitionCursor
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(30)


class SlowConsumer:
    """A sink whose outbox counts bytes; congested above ``limit`` until ``drain()``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0
        self.received: list[Delivery] = []
        self._drained = asyncio.Event()

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        self.received.extend(deliveries)
        self.queued += sum(len(d.record.value) for d in deliveries)
        self._drained.clear()

    def close(self, code: int, reason: str) -> None:
        raise AssertionError("not closed in these tests")

    def congested(self) -> bool:
        return self.queued > self.limit

    async def drained(self) -> None:
        await self._drained.wait()

    def drain(self) -> None:
        self.queued = 0
        self._drained.set()


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    s = await Storage.open(tmp_path / "data")
    topic, _ = await s.ensure_topic("t", TopicConfig(partitions=1))
    await topic.publish([PublishItem(NewRecord(b"x" * 1000), 0) for _ in range(50)], Acks.LEADER)
    yield s
    await s.close()


async def test_a_congested_consumer_is_not_read_for_until_it_drains(storage: Storage) -> None:
    topic = storage.topic("t")
    assert topic is not None
    config = SubscriptionConfig(topic="t", delivery=DeliveryMode.AT_MOST_ONCE)
    core = SubscriptionCore(config, CursorSnapshot({0: PartitionCursor(0)}, {}))
    consumer = SlowConsumer(limit=4_000)
    runtime = SubscriptionRuntime(
        "tail", config, topic, core, storage, lambda: 0.0, read_max_bytes=2_000,
        backpressure=consumer,
    )  # fmt: skip
    core.attach("c", 1_000)
    runtime.sinks["c"] = consumer
    runtime.listen()
    worker = asyncio.create_task(runtime.run())
    try:
        # Reads of 2 records (2,000 bytes) each, until the outbox passes 4,000 bytes.
        await wait_until(lambda: consumer.congested())
        first = len(consumer.received)
        assert 4 < first < 50
        for _ in range(20):  # the worker gets every chance to read on
            await asyncio.sleep(0)
        assert len(consumer.received) == first
        consumer.drain()
        await wait_until(lambda: len(consumer.received) > first)
        while len(consumer.received) < 50:
            await wait_until(lambda: consumer.congested() or len(consumer.received) == 50)
            consumer.drain()
        assert [d.record.offset for d in consumer.received] == list(range(50))
        assert all(d.attempt == 1 for d in consumer.received)
    finally:
        worker.cancel()
        await runtime.stop()
        await asyncio.wait([worker])
