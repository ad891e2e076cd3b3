"""An ephemeral tail of a topic over WebSocket (PROTOCOL §3 `GET /v1/topics/{topic}/ws`).

At-most-once and stateless: it reads each partition by offset straight from the
log, spends the client's credit, sends every record with `attempt` 1 and no
`subscription`, ignores acks, and forgets everything on disconnect. It waits
for appends through the partitions' append listeners — no polling.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delivery.close_codes import CloseCode
from subscribers.connection import ConsumerConnection
from subscribers.frames import MAX_CREDIT, ClientFrame, CreditFrame
from subscribers.wire import ready_frame, record_json

if TYPE_CHECKING:
    from delivery.start import StartAt
    from storage.engine import Storage
    from storage.partition import Partition
    from storage.topic import Topic


@dataclass(frozen=True, slots=True)
class TailSettings:
    read_max_bytes: int = 1024 * 1024  # one read from one partition
    max_queued_bytes: int = 4 * 1024 * 1024  # encoded records waiting for the writer


class TailSession:
    """One tail connection: a pump task reading the log, plus the connection's tasks."""

    def __init__(
        self,
        storage: Storage,
        topic: Topic,
        connection: ConsumerConnection,
        registry: TailRegistry,
        settings: TailSettings | None = None,
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.connection = connection
        self.registry = registry
        self.settings = settings or TailSettings()
        self.consumer_id = f"tail-{uuid.uuid4().hex[:16]}"
        self.credit = 0
        self._cursors: list[int] = []
        self._next_partition = 0
        self._wake = asyncio.Event()  # credit granted or records appended

    def topic_deleted(self) -> bool:
        return self.storage.topic(self.topic.name) is not self.topic

    def close(self, code: int, reason: str) -> None:
        self.connection.request_close(code, reason)
        self._wake.set()

    async def run(self, start: StartAt, credit: int) -> None:
        partitions = self.topic.partitions
        self.credit = credit
        offsets = await start.offsets_in(partitions)
        self._cursors = [offsets[p.partition] for p in partitions]
        unsubscribe = [p.add_append_listener(self._appended) for p in partitions]
        self.registry.add(self)
        try:
            await self.connection.send_now(ready_frame(None, self.consumer_id, credit))
            async with asyncio.TaskGroup() as group:
                served = group.create_task(self.connection.run(self.handle, self._wake.set))
                pump = group.create_task(self._pump())
                served.add_done_callback(lambda _: pump.cancel())
        finally:
            self.registry.discard(self)
            for stop in unsubscribe:
                stop()

    def handle(self, frame: ClientFrame) -> bytes | None:
        # PROTOCOL §3: a tail is at-most-once; acks, nacks and extends are ignored
        # and never answered (they were still validated as frames).
        if isinstance(frame, CreditFrame):
            grant = min(frame.n, MAX_CREDIT - self.credit)
            if grant > 0:
                self.credit += grant
                self._wake.set()
        return None

    def _appended(self, partition: Partition) -> None:
        self._wake.set()

    async def _pump(self) -> None:
        """Send records while there is credit; sleep on the event otherwise."""
        while not self.connection.closing:
            self._wake.clear()  # before looking, so no append or credit is missed
            if self.topic_deleted():
                # Also caught here in case the server did not tell the registry.
                self.close(CloseCode.DELETED, "topic deleted")
                return
            if self.credit > 0 and self.connection.queued_bytes > self.settings.max_queued_bytes:
                await self.connection.wait_drained()  # STYLE 3: bounded in bytes as well
                continue
            try:
                sent = self.credit > 0 and await self._read_round()
            except Exception:
                # A deleted topic's partitions are closed under a running read
                # (PROTOCOL §3: 4410); any other failure goes up as 1011.
                if not self.topic_deleted():
                    raise
                self.close(CloseCode.DELETED, "topic deleted")
                return
            if not sent:
                await self._wake.wait()

    async def _read_round(self) -> bool:
        """One read from every partition with records, round robin; True if any were sent."""
        partitions = self.topic.partitions
        count = len(partitions)
        sent = False
        for step in range(count):
            if self.credit <= 0 or self.connection.closing:
                break
            index = (self._next_partition + step) % count
            partition, offset = partitions[index], self._cursors[index]
            if offset >= partition.end_offset:
                continue
            limit, max_bytes = self.credit, self.settings.read_max_bytes
            records = partition.read_cached(offset, limit, max_bytes)
            if records is None:
                records = await partition.read(offset, limit, max_bytes)
            records = records[: self.credit]  # only this task spends credit
            if not records:
                continue
            self.credit -= len(records)
            self._cursors[index] = records[-1].offset + 1
            name = self.topic.name
            self.connection.push_records([record_json(name, r, None, 1) for r in records])
            sent = True
        self._next_partition = (self._next_partition + 1) % max(count, 1)
        return sent


class TailRegistry:
    """The open tails by topic, so a deleted topic or a shutdown can close them.

    The server calls `topic_deleted(name)` when it deletes a topic (4410) and
    `close_all()` on shutdown (1001).
    """

    def __init__(self) -> None:
        self._tails: dict[str, set[TailSession]] = {}

    def add(self, tail: TailSession) -> None:
        self._tails.setdefault(tail.topic.name, set()).add(tail)

    def discard(self, tail: TailSession) -> None:
        tails = self._tails.get(tail.topic.name)
        if tails is not None:
            tails.discard(tail)
            if not tails:
                del self._tails[tail.topic.name]

    def topic_deleted(self, topic: str) -> None:
        for tail in list(self._tails.get(topic, ())):
            tail.close(CloseCode.DELETED, "topic deleted")

    def close_all(
        self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutting down"
    ) -> None:
        for tails in list(self._tails.values()):
            for tail in list(tails):
                tail.close(code, reason)
