"""WebhookDispatcher and DeliveryEngine on one injected clock: a real Storage on a temp
dir, a real receiver on loopback, and time that moves only when the test moves it."""

from __future__ import annotations

import asyncio

import pytest

from delivery.config import Backoff, Breaker, PushConfig, SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.start import StartAt
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem
from subscribers.webhook import WebhookDispatcher
from tests.helpers import FakeClock, wait_until
from tests.webhooks.push import SECRET
from tests.webhooks.receiver import Answer, Received, Receiver

pytestmark = pytest.mark.timeout(60)


def fail_first(received: Received) -> Answer:
    assert received.message is not None
    return Answer(500 if received.message["attempt"] == 1 else 200)


async def test_an_open_breaker_waits_for_the_clock_then_probes(storage: Storage) -> None:
    clock = FakeClock()
    engine = DeliveryEngine(storage, clock=clock)
    await engine.start()
    with Receiver([SECRET], fail_first) as receiver:
        breaker = Breaker(failures=1, open_ms=60_000, max_open_ms=60_000)
        config = SubscriptionConfig(
            topic="t",
            start=StartAt.earliest(),
            retry_backoff=Backoff(1_000, 1_000),
            push=PushConfig(url=receiver.url, secret=SECRET, breaker=breaker),
        )
        await engine.create_subscription("s", config)
        dispatcher = WebhookDispatcher(engine, "s", config, clock=clock)
        worker = asyncio.create_task(dispatcher.run())
        try:
            topic = storage.topic("t")
            assert topic is not None
            await topic.publish([PublishItem(NewRecord(b"1"), 0)], Acks.LEADER)
            await wait_until(lambda: dispatcher.stats()["endpoint_state"] == "open")
            # The backoff (1 s) and the open breaker (60 s) run on the fake clock: while
            # it stands still, the record is neither redelivered nor posted again.
            await engine.settled("s")
            assert len(receiver.snapshot()) == 1
            clock.advance(1.0)
            engine.clock_moved()
            await wait_until(lambda: dispatcher.stats()["endpoint_waiting"] == 1)
            await engine.settled("s")
            assert len(receiver.snapshot()) == 1  # held by the breaker, not posted
            clock.advance(59.0)
            dispatcher.clock_moved()
            await wait_until(lambda: len(receiver.acked_ids()) == 1)
            assert [r.message["attempt"] for r in receiver.snapshot() if r.message] == [1, 2]
            await wait_until(lambda: engine.stats("s")["acked_total"] == 1)
            assert dispatcher.stats()["endpoint_state"] == "closed"
        finally:
            dispatcher.close(1001, "test over")
            await asyncio.wait_for(worker, 10)
            await engine.stop()
