"""Dead-letter redrive (delivery/redrive.py) on a real Storage, with a fake clock:
the rate limit is checked by the sleeps it asks for, not by waiting them out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from delivery.config import SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.redrive import REDRIVE_HEADER, Redrives
from herald.protocol.errors import RedriveConflict, SubscriptionNotFound, TopicNotFound
from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem

DEAD = {"herald-source-topic": "src", "herald-source-offset": "7", "keep": "me"}


class FakeTime:
    """A clock that only moves when the redrive sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[DeliveryEngine]:
    storage = await Storage.open(tmp_path / "data")
    for name in ("src", "dlq"):
        await storage.create_topic(name, TopicConfig())
    engine = DeliveryEngine(storage)
    await engine.start()
    await engine.create_subscription("s", SubscriptionConfig("src", dead_letter_topic="dlq"))
    yield engine
    await engine.stop()
    await storage.close()


async def dead_letters(engine: DeliveryEngine, n: int, source: str = "src") -> None:
    dlq = engine.storage.topic("dlq")
    assert dlq is not None
    headers = {**DEAD, "herald-source-topic": source}
    items = [PublishItem(NewRecord(b"%d" % i, key=f"k{i}", headers=headers)) for i in range(n)]
    await dlq.publish(items, Acks.ALL)


async def test_redrive_republishes_once_at_the_rate_and_skips_other_topics(
    engine: DeliveryEngine,
) -> None:
    await dead_letters(engine, 25)
    await dead_letters(engine, 5, source="elsewhere")
    time = FakeTime()
    redrives = Redrives(engine, clock=time.clock, sleep=time.sleep)
    result = await redrives.run("s", rate=10)
    assert (result.scanned, result.republished, result.duplicates, result.skipped) == (30, 25, 0, 5)
    # 30 records at 10/s: never ahead of the rate, and done in 3 s of (fake) time.
    assert time.now == pytest.approx(3.0)
    assert all(s > 0 for s in time.sleeps)
    source = engine.storage.topic("src")
    assert source is not None
    records = await source.partitions[0].read(0, 100, 1 << 20)
    assert [r.value for r in records] == [b"%d" % i for i in range(25)]
    assert records[3].headers == {"keep": "me", REDRIVE_HEADER: "dlq/0/3"}
    assert records[3].key == "k3"
    again = await redrives.run("s", rate=1000)
    assert (again.republished, again.duplicates) == (0, 25)


async def test_a_reason_redrives_only_the_dead_letters_that_say_it(
    engine: DeliveryEngine,
) -> None:
    dlq = engine.storage.topic("dlq")
    assert dlq is not None
    said = [{"herald-source-last-error": "http 500"}, {"herald-source-last-error": "timeout"}, {}]
    items = [PublishItem(NewRecord(b"%d" % i, headers={**DEAD, **said[i % 3]})) for i in range(9)]
    await dlq.publish(items, Acks.ALL)
    redrives = Redrives(engine, clock=FakeTime().clock, sleep=FakeTime().sleep)
    timeouts = await redrives.run("s", rate=1000, reason="timeout")
    assert (timeouts.republished, timeouts.other_reasons, timeouts.skipped) == (3, 6, 0)
    unsaid = await redrives.run("s", rate=1000, reason="")  # no header: the reason ""
    assert (unsaid.republished, unsaid.other_reasons) == (3, 6)
    source = engine.storage.topic("src")
    assert source is not None
    records = await source.partitions[0].read(0, 100, 1 << 20)
    assert [r.value for r in records] == [b"1", b"4", b"7", b"2", b"5", b"8"]


async def test_one_redrive_per_subscription_at_a_time(engine: DeliveryEngine) -> None:
    await dead_letters(engine, 3)
    sleeping, release = asyncio.Event(), asyncio.Event()

    async def held_sleep(seconds: float) -> None:
        sleeping.set()
        await release.wait()

    redrives = Redrives(engine, clock=lambda: 0.0, sleep=held_sleep)
    first = asyncio.create_task(redrives.run("s", rate=1))
    await asyncio.wait_for(sleeping.wait(), 10)  # the first is mid-way
    with pytest.raises(RedriveConflict):
        await redrives.run("s")
    release.set()
    assert (await first).republished == 3


async def test_stopping_ends_a_redrive_early(engine: DeliveryEngine) -> None:
    await dead_letters(engine, 10)
    time = FakeTime()
    redrives = Redrives(engine, clock=time.clock, sleep=time.sleep)
    result = await redrives.run("s", rate=2, stopping=lambda: len(time.sleeps) >= 1)
    assert result.scanned == 2


async def test_what_a_redrive_needs_is_checked_first(engine: DeliveryEngine) -> None:
    redrives = Redrives(engine)
    with pytest.raises(SubscriptionNotFound):
        await redrives.run("nope")
    await engine.create_subscription("plain", SubscriptionConfig("src"))
    with pytest.raises(RedriveConflict):
        await redrives.run("plain")
    await engine.create_subscription("lost", SubscriptionConfig("src", dead_letter_topic="gone"))
    with pytest.raises(TopicNotFound):
        await redrives.run("lost")
