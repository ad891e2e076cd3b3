"""Dead-letter redrive: a subscription's dead letters go back to its topic
(docs/protocol.md "Stats, redrive and the console").

A redrive scans each partition of the subscription's ``dead_letter_topic`` from its
start to its end *as of the call*: records dead-lettered again while it runs wait
for the next redrive, so a redrive always ends. Records dead-lettered from this
subscription's topic are republished there with their value, key and headers
(without the ``herald-source-*`` ones), at most ``rate`` per second; others are
skipped. Each republished record's id is derived from its dead-letter offset, so a
retried redrive is deduplicated (PROTOCOL §2 ``id``) instead of publishing twice.
Given a ``reason``, only the records whose ``herald-source-last-error`` is exactly that
are republished (PROTOCOL §8 "Dead letters say why": the console redrives one reason's
records); a record without the header has the reason ``""``. One redrive per
subscription at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from delivery.dead_letter import SOURCE_HEADER_PREFIX, SOURCE_LAST_ERROR, SOURCE_TOPIC
from delivery.engine import DeliveryEngine
from herald.protocol.errors import RedriveConflict, TopicNotFound
from herald.protocol.limits import REDRIVE_DEFAULT_MAX_RECORDS, REDRIVE_DEFAULT_RATE
from storage.record import Acks, NewRecord, Record
from storage.topic import PublishItem, Topic

REDRIVE_HEADER = "herald-redriven-from"

BATCH = 100  # records read and republished at once
READ_BYTES = 1 << 22


@dataclass(frozen=True, slots=True)
class RedriveResult:
    dead_letter_topic: str
    scanned: int
    republished: int
    duplicates: int
    skipped: int  # dead-lettered from another topic
    other_reasons: int  # from this topic, left because their reason is not the one asked


def redriven_record(record: Record, dlq: str) -> NewRecord:
    """The source record again: same value, key and headers without the herald-source-*
    ones, plus where it came from; its id names its dead-letter offset."""
    headers = {k: v for k, v in record.headers.items() if not k.startswith(SOURCE_HEADER_PREFIX)}
    origin = f"{dlq}/{record.partition}/{record.offset}"
    headers[REDRIVE_HEADER] = origin
    return NewRecord(
        record.value, record.kind, record.key, headers, producer_id=f"redrive:{origin}"
    )


class Redrives:
    """The redrives of one server; at most one per subscription runs at a time."""

    def __init__(
        self,
        engine: DeliveryEngine,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._sleep = sleep
        self._running: set[str] = set()

    async def run(
        self,
        subscription: str,
        rate: int = REDRIVE_DEFAULT_RATE,
        max_records: int = REDRIVE_DEFAULT_MAX_RECORDS,
        stopping: Callable[[], bool] = lambda: False,
        reason: str | None = None,
    ) -> RedriveResult:
        """Redrive ``subscription``'s dead letters (only those whose last error is
        ``reason``, when given); ``stopping`` ends it early (SIGTERM).

        Raises SubscriptionNotFound, TopicNotFound (its topic or dead-letter topic is
        gone) or RedriveConflict (no dead_letter_topic; a redrive of it is running)."""
        config = self._engine.get(subscription)
        if config.dead_letter_topic is None:
            raise RedriveConflict(f"subscription {subscription!r} has no dead_letter_topic")
        dlq = self._topic(config.dead_letter_topic, "dead-letter topic")
        source = self._topic(config.topic, "topic")
        if subscription in self._running:
            raise RedriveConflict(f"a redrive of {subscription!r} is already running")
        self._running.add(subscription)
        try:
            return await self._scan(dlq, source, rate, max_records, stopping, reason)
        finally:
            self._running.discard(subscription)

    def _topic(self, name: str, what: str) -> Topic:
        topic = self._engine.storage.topic(name)
        if topic is None:
            raise TopicNotFound(f"{what} {name!r} does not exist")
        return topic

    async def _scan(
        self,
        dlq: Topic,
        source: Topic,
        rate: int,
        limit: int,
        stopping: Callable[[], bool],
        reason: str | None,
    ) -> RedriveResult:
        ends = [p.end_offset for p in dlq.partitions]  # the end as of now: it always ends
        scanned = republished = duplicates = skipped = other_reasons = 0
        started = self._clock()
        for partition, end in zip(dlq.partitions, ends, strict=True):
            offset = partition.start_offset
            while offset < end and scanned < limit and not stopping():
                want = min(BATCH, end - offset, limit - scanned, rate)
                records = [
                    r for r in await partition.read(offset, want, READ_BYTES) if r.offset < end
                ]
                if not records:
                    break
                offset = records[-1].offset + 1
                scanned += len(records)
                mine = [r for r in records if r.headers.get(SOURCE_TOPIC) == source.name]
                skipped += len(records) - len(mine)
                if reason is not None:
                    wanted = [r for r in mine if r.headers.get(SOURCE_LAST_ERROR, "") == reason]
                    other_reasons += len(mine) - len(wanted)
                    mine = wanted
                if mine:
                    items = [PublishItem(redriven_record(r, dlq.name)) for r in mine]
                    results = await source.publish(items, Acks.ALL)
                    again = sum(1 for r in results if r.duplicate)
                    duplicates += again
                    republished += len(results) - again
                # Never ahead of `rate` records per second since the start.
                ahead = scanned / rate - (self._clock() - started)
                if ahead > 0:
                    await self._sleep(ahead)
        return RedriveResult(dlq.name, scanned, republished, duplicates, skipped, other_reasons)
