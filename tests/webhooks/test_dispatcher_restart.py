"""WebhookDispatchers supervises each dispatcher (herald.lifecycle.supervised): one that
fails is restarted as a new dispatcher with everything the first one was given — the
destination guard of PROTOCOL §6 included. A real Storage on a temp dir; the failure is
a real one (the subscription's attempt log cannot be read)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

import subscribers.webhook
from delivery.config import PushConfig, SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.start import StartAt
from herald.lifecycle import Backoff
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem
from subscribers.attempt_log import Attempt, AttemptLog
from subscribers.destination import DestinationGuard
from subscribers.webhook import WebhookDispatchers
from tests.helpers import wait_until
from tests.webhooks.push import SECRET
from tests.webhooks.receiver import Answer, Receiver

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def engine(storage: Storage) -> AsyncIterator[DeliveryEngine]:
    """A delivery engine on the ``storage`` fixture's (tests/webhooks/conftest.py)."""
    engine = DeliveryEngine(storage)
    await engine.start()
    yield engine
    await engine.stop()


async def test_a_failed_dispatcher_restarts_with_the_same_destination_guard(
    engine: DeliveryEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(subscribers.webhook, "RESTART_BACKOFF", Backoff(first_s=0.2, max_s=0.2))
    # The attempt log's file is a directory: the dispatcher's first start fails.
    blocker = engine.storage.data_dir / "attempts" / "s.jsonl"
    blocker.mkdir(parents=True)
    topic = engine.storage.topic("t")
    assert topic is not None
    await topic.publish([PublishItem(NewRecord(b"1"), 0)], Acks.LEADER)
    with Receiver([SECRET], lambda _: Answer(200)) as receiver:
        config = SubscriptionConfig(
            topic="t",
            start=StartAt.earliest(),
            push=PushConfig(url=receiver.url, secret=SECRET),
        )
        await engine.create_subscription("s", config)
        # PROTOCOL §6: with credentials, loopback is not a destination webhooks may reach.
        dispatchers = WebhookDispatchers(engine, destinations=DestinationGuard(enforced=True))
        await dispatchers.start()
        try:
            await wait_until(lambda: "webhook dispatcher of s failed; restarting" in caplog.text)
            blocker.rmdir()  # the restarted dispatcher starts
            await wait_until(
                lambda: (
                    (dispatchers.stats("s") or {}).get("last_error") == "destination not allowed"
                )
            )
            assert receiver.snapshot() == []
        finally:
            await dispatchers.stop()


async def test_the_history_on_disk_is_read_before_the_dispatchers_start_returns(
    engine: DeliveryEngine,
) -> None:
    """PROTOCOL §8: the delivery history survives a restart. The server serves once the
    dispatchers have started: by then the history kept on disk is read, so that an
    `attempts` request right after a restart does not find it empty (it once did, 1 run
    in 26 of the webhooks folder: the reading was the dispatcher task's first step)."""
    history = engine.storage.data_dir / "attempts" / "s.jsonl"
    history.parent.mkdir(parents=True)
    kept = [Attempt(1_795_000_000_000 + i, f"0-{i}", 1, 500, 1.5, "http 500") for i in range(3)]
    history.write_bytes(b"".join(orjson.dumps(a.as_dict()) + b"\n" for a in kept))
    with Receiver([SECRET], lambda _: Answer(200)) as receiver:
        config = SubscriptionConfig(
            topic="t", start=StartAt.latest(), push=PushConfig(url=receiver.url, secret=SECRET)
        )
        await engine.create_subscription("s", config)
        dispatchers = WebhookDispatchers(engine)
        await dispatchers.start()
        try:
            dispatcher = dispatchers.get("s")
            assert dispatcher is not None
            assert dispatcher.attempts.recent() == kept[::-1]  # newest first
            stats = dispatchers.stats("s")
            assert stats is not None and stats["last_status"] == 500
        finally:
            await dispatchers.stop()


async def test_a_flush_cancelled_after_taking_its_batch_still_writes_it(tmp_path: Path) -> None:
    """The periodic flush is cancelled at shutdown. One cancelled while writing lost the
    attempts it had taken, and the final flush found nothing left: a graceful restart
    came back with an empty history (2 runs in ~65 of the webhooks folder)."""
    path = tmp_path / "attempts" / "s.jsonl"
    history = AttemptLog(path)
    kept = [Attempt(1_795_000_000_000 + i, f"0-{i}", 1, 200, 1.0, None) for i in range(5)]
    for attempt in kept:
        history.add(attempt)
    periodic = asyncio.create_task(history.flush())
    await asyncio.sleep(0)  # it has taken the batch and waits on the file system
    periodic.cancel()
    await asyncio.wait([periodic])
    history.add(last := Attempt(1_795_000_000_009, "0-9", 2, 200, 1.0, None))
    await history.flush()  # the final flush: after the cut-short one, in order
    reloaded = AttemptLog(path)
    await reloaded.load()
    assert reloaded.recent() == [last, *kept[::-1]]
