"""Herald in bench/compare.py: through its SDK (``herald.Producer``, ``herald.Consumer``)
with default settings but the consumer's window (WINDOW, as the peers' consumers have).

Per-record calls: ``producer.send`` and ``await message.ack()``, each delivery read with
``async for``; batch calls: ``producer.send_many`` and ``consumer.ack_many`` over what
``consumer.take_batch`` gives. JSON records go as a JSON string ``value``, binary ones
as ``value_b64`` (the SDK encodes ``bytes`` so; ``message.value`` decodes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bench.compare_workload import WINDOW, Calls, Payload, running


class HeraldChannel:
    def __init__(self, producer: Any, consumer: Any, topic: str, payload: Payload) -> None:
        self.producer, self.consumer, self.topic = producer, consumer, topic
        self.binary = payload is Payload.BINARY

    def encode(self, record: bytes) -> Any:
        return record if self.binary else record.decode()

    def send(self, value: Any) -> Awaitable[Any]:
        return self.producer.send(self.topic, value)  # type: ignore[no-any-return]

    def send_batch(self, values: list[Any]) -> Awaitable[Any]:
        return self.producer.send_many(self.topic, values)  # type: ignore[no-any-return]

    def consuming(
        self, on_record: Callable[[Any], None], calls: Calls
    ) -> contextlib.AbstractAsyncContextManager[None]:
        read = self._each if calls is Calls.RECORD else self._batches
        return running(asyncio.create_task(read(on_record)), self.consumer.close)

    async def _each(self, on_record: Callable[[Any], None]) -> None:
        async for message in self.consumer:  # ends once closed
            on_record(message.value)
            await message.ack()

    async def _batches(self, on_record: Callable[[Any], None]) -> None:
        while batch := await self.consumer.take_batch(WINDOW):  # [] once closed
            for message in batch:
                on_record(message.value)
            await self.consumer.ack_many(batch)


class Herald:
    def __init__(self, url: str, acks: str, pid: int | None) -> None:
        self.url, self.acks, self.pid = url, acks, pid
        self.name = f"Herald SDK acks={acks}"

    @contextlib.asynccontextmanager
    async def channel(self, payload: Payload) -> AsyncIterator[HeraldChannel]:
        from herald import Admin, Consumer, Producer

        topic, name = f"t-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
        async with Admin(self.url) as admin:
            await admin.create_topic(topic)
            await admin.create_subscription(name, topic, start="earliest")
            producer = Producer(self.url, acks=self.acks)
            consumer = Consumer(self.url, name, credit=WINDOW)
            try:
                yield HeraldChannel(producer, consumer, topic, payload)
            finally:
                await producer.close()
                await consumer.close()
                await admin.delete_subscription(name)
                await admin.delete_topic(topic)
