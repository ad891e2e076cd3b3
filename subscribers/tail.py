"""An ephemeral tail of a topic over WebSocket (PROTOCOL §3 `GET /v1/topics/{topic}/ws`).

At-most-once and stateless: each tail runs its own non-durable at-most-once
SubscriptionCore (delivery/core.py) — the same credit spending, partition round robin
and cursors as a subscription, kept in memory and never persisted — driven by a
SubscriptionRuntime inside the connection's TaskGroup. It sends every record with
`attempt` 1 and no `subscription`, ignores acks, and forgets everything on disconnect.
It waits for appends through the partitions' append listeners — no polling.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgspec import UNSET

from delivery.config import DeliveryMode, SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.runtime import SubscriptionRuntime
from herald.protocol.close_codes import CloseCode
from herald.protocol.frames import ClientFrame, CreditFrame
from storage.cursors import CursorSnapshot, PartitionCursor
from subscribers.codec import JSON, Codec
from subscribers.connection import ConsumerConnection

if TYPE_CHECKING:
    from delivery.events import Delivery
    from delivery.start import StartAt
    from storage.engine import Storage
    from storage.record import Record
    from storage.topic import Topic


@dataclass(frozen=True, slots=True)
class TailSettings:
    read_max_bytes: int = 1024 * 1024  # one read from one partition
    max_queued_bytes: int = 4 * 1024 * 1024  # encoded records waiting for the writer


class TailSession:
    """One tail connection: the ConsumerSink of its own at-most-once core."""

    def __init__(
        self,
        storage: Storage,
        topic: Topic,
        connection: ConsumerConnection,
        registry: TailRegistry,
        settings: TailSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.connection = connection
        self.registry = registry
        self.settings = settings or TailSettings()
        self.consumer_id = f"tail-{uuid.uuid4().hex[:16]}"
        self._clock = clock
        self._runtime: SubscriptionRuntime | None = None
        self._encodings = registry.encodings_for(connection.codec)

    def topic_deleted(self) -> bool:
        return self.storage.topic(self.topic.name) is not self.topic

    # -- ConsumerSink ------------------------------------------------------------------

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        # PROTOCOL §3: tail records carry `attempt` 1 and no `subscription`: the same
        # bytes for every tail of the same encoding, encoded once for all of them.
        encode = self._encodings.encode
        self.connection.push_records([encode(topic, d.record) for d in deliveries])

    def close(self, code: int, reason: str) -> None:
        self.connection.request_close(code, reason)

    # -- Backpressure (STYLE 3: bounded in bytes as well as by credit) -----------------

    def congested(self) -> bool:
        return self.connection.queued_bytes > self.settings.max_queued_bytes

    async def drained(self) -> None:
        await self.connection.wait_drained()

    # -- the connection ----------------------------------------------------------------

    async def run(self, start: StartAt, credit: int, positions: bool = False) -> None:
        """Serve the tail from ``start``; with ``positions``, its `ready` frame says where
        it starts in each partition (a client that resumes learns what retention took
        between its own lookup of the topic and this moment: docs/protocol.md §3)."""
        offsets = await start.offsets_in(self.topic.partitions)
        cursor = CursorSnapshot({p: PartitionCursor(o) for p, o in offsets.items()}, {})
        config = SubscriptionConfig(topic=self.topic.name, delivery=DeliveryMode.AT_MOST_ONCE)
        core = SubscriptionCore(config, cursor)
        runtime = SubscriptionRuntime(
            self.consumer_id,
            config,
            self.topic,
            core,
            self.storage,
            self._clock,
            read_max_bytes=self.settings.read_max_bytes,
            backpressure=self,
        )
        self._runtime = runtime
        core.attach(self.consumer_id, credit)
        runtime.sinks[self.consumer_id] = self
        self.registry.add(self)
        try:
            ready = self.connection.codec.ready_frame(
                None, self.consumer_id, credit, dict(offsets) if positions else UNSET
            )
            await self.connection.send_now(ready)
            runtime.listen()
            # The delivery worker is a task of the connection's (not one more TaskGroup
            # and task of the tail's own: issue 27 §3, memory per tail).
            await self.connection.run(self.handle, runtime.wake, worker=self._deliver(runtime))
        finally:
            self.registry.discard(self)
            await runtime.stop()
            # The runtime holds this session (its sink and backpressure): without this
            # edge the pair is a cycle that only the collector frees, later.
            self._runtime = None

    def handle(self, frame: ClientFrame) -> bytes | None:
        # PROTOCOL §3: a tail is at-most-once; acks, nacks and extends are ignored
        # and never answered (they were still validated as frames).
        runtime = self._runtime
        if isinstance(frame, CreditFrame) and runtime is not None:
            runtime.core.grant_credit(self.consumer_id, frame.n)  # capped by the core
            runtime.wake()
        return None

    async def _deliver(self, runtime: SubscriptionRuntime) -> None:
        try:
            await runtime.run()
        except Exception:
            # A deleted topic's partitions are closed under a running read
            # (PROTOCOL §3: 4410); any other failure goes up as 1011.
            if not self.topic_deleted():
                raise
            self.close(CloseCode.DELETED, "topic deleted")


class SharedEncodings:
    """The tail encoding (JSON, or another codec's: one cache per codec) of the records
    tails sent last, shared by every tail of that encoding: a hundred tails of a topic
    encode each new record once, not a hundred times.

    Keyed by the record object: tails read new records from the partition's tail cache,
    which hands every reader the same Record objects (a record read again from disk is a
    new object and is simply encoded again). An entry holds its record, so the key stays
    that record's while the entry lives; the whole is bounded by the encoded bytes kept.
    """

    def __init__(self, max_bytes: int = 4 * 1024 * 1024, codec: Codec = JSON) -> None:
        self.max_bytes = max_bytes
        self._encode = codec.tail_record
        self._entries: dict[int, tuple[Record, str, bytes]] = {}  # oldest first
        self._bytes = 0

    def encode(self, topic: str, record: Record) -> bytes:
        entry = self._entries.get(id(record))
        if entry is not None and entry[0] is record and entry[1] == topic:
            return entry[2]
        encoded = self._encode(topic, record)
        if len(encoded) <= self.max_bytes // 4:  # a huge record is not kept
            if entry is not None:
                self._forget(id(record))
            self._entries[id(record)] = (record, topic, encoded)
            self._bytes += len(encoded)
            while self._bytes > self.max_bytes:
                self._forget(next(iter(self._entries)))
        return encoded

    def _forget(self, key: int) -> None:
        _, _, encoded = self._entries.pop(key)
        self._bytes -= len(encoded)

    def __len__(self) -> int:
        return len(self._entries)


class TailRegistry:
    """The open tails by topic, so a deleted topic or a shutdown can close them.

    The server calls `topic_deleted(name)` when it deletes a topic (4410) and
    `close_all()` on shutdown (1001).
    """

    def __init__(self) -> None:
        self._tails: dict[str, set[TailSession]] = {}
        # By codec name: a msgpack tail and a JSON tail of a record never share bytes.
        self._encodings: dict[str, SharedEncodings] = {}
        # In a cluster, told when a topic gains its first tail here and loses its last:
        # the node then copies (observes) the topic's partitions it does not replicate.
        self.on_first: Callable[[str], None] | None = None
        self.on_last: Callable[[str], None] | None = None

    def encodings_for(self, codec: Codec) -> SharedEncodings:
        """The records' shared encodings in ``codec``'s form, made at its first tail."""
        encodings = self._encodings.get(codec.name)
        if encodings is None:
            encodings = self._encodings[codec.name] = SharedEncodings(codec=codec)
        return encodings

    def add(self, tail: TailSession) -> None:
        tails = self._tails.setdefault(tail.topic.name, set())
        if not tails and self.on_first is not None:
            self.on_first(tail.topic.name)
        tails.add(tail)

    def discard(self, tail: TailSession) -> None:
        tails = self._tails.get(tail.topic.name)
        if tails is not None and tail in tails:
            tails.discard(tail)
            if not tails:
                del self._tails[tail.topic.name]
                if self.on_last is not None:
                    self.on_last(tail.topic.name)

    def topic_deleted(self, topic: str) -> None:
        for tail in list(self._tails.get(topic, ())):
            tail.close(CloseCode.DELETED, "topic deleted")

    def close_all(
        self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutting down"
    ) -> None:
        for tails in list(self._tails.values()):
            for tail in list(tails):
                tail.close(code, reason)
