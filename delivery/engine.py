"""DeliveryEngine: the subscriptions of a server and their consumers (docs/architecture.md,
"Engine API"). What server/ and subscribers/ call.

Each subscription has a sans-I/O SubscriptionCore (delivery/core.py) driven by a
SubscriptionRuntime (delivery/runtime.py). The engine owns the app-wide work under
start/stop: the runtimes' workers and one cursor flusher, which persists dirty cursors at
most every ``cursor_flush_interval`` so that after a crash no record acked more than 1 s
earlier is redelivered (PROTOCOL §3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from delivery.config import PushConfig, SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import Delivery
from delivery.pull import SETTLE_S, PullSink, first_of
from delivery.runtime import ConsumerSink, SubscriptionRuntime
from delivery.start import StartAt
from herald.lifecycle import periodic
from herald.protocol.close_codes import CloseCode
from herald.protocol.errors import (
    BadRequest,
    SubscriptionConflict,
    SubscriptionNotFound,
    TopicNotFound,
)
from herald.protocol.stats import SubscriptionStats
from storage.cursors import CursorSnapshot, PartitionCursor
from storage.engine import Storage
from storage.topic import Topic
from storage.writer import wall_clock_ms

__all__ = ["ConsumerSink", "Delivery", "DeliveryEngine", "config_matches"]

log = logging.getLogger("herald.delivery")


@dataclasses.dataclass(frozen=True, slots=True)
class AttachedConsumer:
    """One attached consumer as the console lists it: its outstanding credit, the
    records in flight to it, and its sink (which knows the connection)."""

    id: str
    credit: int
    in_flight: int
    sink: ConsumerSink


class DeliveryEngine:
    def __init__(
        self,
        storage: Storage,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = wall_clock_ms,
        cursor_flush_interval: float = 0.2,
        load_local: bool = True,
        cursor_saved: Callable[[str, CursorSnapshot], None] | None = None,
    ) -> None:
        self.storage = storage
        # A cluster node runs only the subscriptions it coordinates (adopt/release), not
        # those meta.db remembers; and each persisted cursor goes to etcd as well.
        self._load_local = load_local
        self._cursor_saved = cursor_saved
        self._clock = clock
        self._wall_ms = wall_ms
        self._flush_interval = cursor_flush_interval
        self._runtimes: dict[str, SubscriptionRuntime] = {}
        self._consumers: dict[str, SubscriptionRuntime] = {}  # consumer id -> runtime
        self._ids = itertools.count(1)
        self._admin = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load subscriptions from meta.db, restore their cursors, start delivering."""
        configs = await asyncio.to_thread(self.storage.metadata.subscriptions)
        if not self._load_local:
            configs = {}
        for name, data in configs.items():
            config = SubscriptionConfig.from_storage(data)
            topic = self.storage.topic(config.topic)
            if topic is None:
                log.warning("subscription %s: topic %s is gone; skipped", name, config.topic)
                continue
            cursor = await asyncio.to_thread(self.storage.cursors.load, name)
            if cursor is None:
                cursor = await self._initial_cursor(topic, config.start)
            cursor = _fit_cursor(cursor, topic)
            self._open_runtime(name, config, topic, cursor)
        self._flusher = asyncio.create_task(
            periodic(self._flush_interval, self._flush_dirty, what="cursor flush", logger=log),
            name="herald-cursor-flusher",
        )

    async def stop(self) -> None:
        """SIGTERM (PROTOCOL §3): close consumers with 1001 — after which their frames are
        no longer applied — and persist every cursor with its attempt counts."""
        if self._stopped:
            return
        self._stopped = True
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.wait([self._flusher])
            self._flusher = None
        runtimes = list(self._runtimes.values())
        for runtime in runtimes:
            for consumer in runtime.close_sinks(CloseCode.GOING_AWAY, "server shutting down"):
                self._consumers.pop(consumer, None)
        await asyncio.gather(*(runtime.stop() for runtime in runtimes))
        results = await asyncio.gather(
            *(self._save(runtime, with_attempts=True) for runtime in runtimes),
            return_exceptions=True,
        )
        for runtime, result in zip(runtimes, results, strict=True):
            if isinstance(result, BaseException):
                _cursor_not_saved(runtime.name, result)

    # ------------------------------------------------------------------ subscriptions

    async def create_subscription(
        self, name: str, config: SubscriptionConfig, given: Collection[str] | None = None
    ) -> tuple[SubscriptionConfig, bool]:
        """(config, created). An existing subscription whose fields in ``given`` (default:
        all but ``start``) equal ``config``'s is returned as (existing, False); else
        SubscriptionConflict. Raises TopicNotFound: auto-creating is the server's call."""
        async with self._admin:
            existing = self.existing(name, config, given)
            if existing is not None:
                return existing, False
            topic = self.storage.topic(config.topic)
            if topic is None:
                raise TopicNotFound(f"topic {config.topic!r} does not exist")
            cursor = await self._initial_cursor(topic, config.start)
            # The start position is fixed now: a restart must not move "latest".
            await asyncio.to_thread(self.storage.cursors.save, name, cursor)
            await asyncio.to_thread(
                self.storage.metadata.put_subscription, name, config.to_storage()
            )
            self._open_runtime(name, config, topic, cursor)
            return config, True

    def existing(
        self, name: str, config: SubscriptionConfig, given: Collection[str] | None = None
    ) -> SubscriptionConfig | None:
        """The config of subscription ``name`` if it exists and matches ``config`` in the
        fields ``given`` (PROTOCOL §2 PUT: 200); None if there is none; SubscriptionConflict
        (409) if it differs. Lets the server refuse a PUT before it creates any topic."""
        runtime = self._runtimes.get(name)
        if runtime is None:
            return None
        if not config_matches(runtime.config, config, given):
            raise SubscriptionConflict(f"subscription {name!r} exists with a different config")
        return runtime.config

    async def adopt(
        self, name: str, config: SubscriptionConfig, cursor: CursorSnapshot | None
    ) -> CursorSnapshot:
        """Cluster (PROTOCOL §7): run ``name`` here from ``cursor`` — the last one its
        previous coordinator replicated — or, for a new subscription, from its start
        position now. Returns the cursor it starts from. Raises TopicNotFound."""
        async with self._admin:
            runtime = self._runtimes.get(name)
            if runtime is not None:
                return runtime.core.snapshot(with_attempts=True)
            topic = self.storage.topic(config.topic)
            if topic is None:
                raise TopicNotFound(f"topic {config.topic!r} does not exist")
            if cursor is None:
                cursor = await self._initial_cursor(topic, config.start)
            cursor = _fit_cursor(cursor, topic)
            await asyncio.to_thread(self.storage.cursors.save, name, cursor)
            await asyncio.to_thread(
                self.storage.metadata.put_subscription, name, config.to_storage()
            )
            self._open_runtime(name, config, topic, cursor)
            return cursor

    async def release(self, name: str) -> CursorSnapshot | None:
        """Cluster: stop running ``name`` here (another node coordinates it now): its
        consumers are closed with 1012 and its records in flight go back with it. Returns
        its last cursor (attempt counts included), None if it did not run here."""
        async with self._admin:
            runtime = self._runtimes.pop(name, None)
            if runtime is None:
                return None
            for consumer in runtime.close_sinks(
                CloseCode.SERVICE_RESTART, "the subscription moved to another node"
            ):
                self._consumers.pop(consumer, None)
            await runtime.stop()
            async with runtime.save_lock:
                snapshot = runtime.core.snapshot(with_attempts=True)
                await asyncio.to_thread(self.storage.cursors.delete, name)
            await asyncio.to_thread(self.storage.metadata.delete_subscription, name)
            return snapshot

    async def delete_subscription(self, name: str) -> None:
        """Consumers are closed with 4410; the cursor and the config are deleted."""
        async with self._admin:
            runtime = self._runtimes.pop(name, None)
            if runtime is None:
                raise SubscriptionNotFound(f"subscription {name!r} does not exist")
            await self._discard(runtime)
            await asyncio.to_thread(self.storage.metadata.delete_subscription, name)

    async def topic_deleted(self, topic: str) -> None:
        """The topic is gone (Storage.delete_topic already removed the configs from
        meta.db): its subscriptions are deleted and their consumers closed with 4410."""
        async with self._admin:
            for name in [n for n, r in self._runtimes.items() if r.config.topic == topic]:
                runtime = self._runtimes.pop(name)
                await self._discard(runtime)
                await asyncio.to_thread(self.storage.metadata.delete_subscription, name)

    async def update_push(
        self, name: str, change: Callable[[PushConfig], PushConfig]
    ) -> SubscriptionConfig:
        """Replace the push config of a push subscription in place with ``change(push)``,
        computed under the admin lock so concurrent changes do not lose one another
        (docs/protocol.md, rotating the secret). Persisted in meta.db, then swapped in; the
        cursor, in-flight records, attempt counts and stats are untouched. The webhook
        dispatcher takes the new config from its caller (WebhookDispatchers.update_push).
        Raises SubscriptionNotFound, or BadRequest for a subscription without push."""
        async with self._admin:
            runtime = self._runtime(name)
            if runtime.config.push is None:
                raise BadRequest(f"subscription {name!r} is not a push subscription")
            config = replace(runtime.config, push=change(runtime.config.push))
            # A topic deleted meanwhile is fine: topic_deleted waits for this lock and then
            # deletes the row written here along with the runtime.
            await asyncio.to_thread(
                self.storage.metadata.put_subscription, name, config.to_storage()
            )
            runtime.config = config
            runtime.core.config = config
            return config

    async def update_subscription(
        self, name: str, change: Callable[[SubscriptionConfig], SubscriptionConfig]
    ) -> tuple[SubscriptionConfig, SubscriptionConfig]:
        """PROTOCOL §8 change in place: the config becomes ``change(config)`` — computed
        under the admin lock, so it sees the current config and may refuse it (409, 400) —
        persisted in meta.db, then applied at once. The cursor, in-flight records (with the
        deadlines they were sent with), attempt counts and stats are kept. Returns (old,
        new); starting or stopping webhook push is the caller's (WebhookDispatchers)."""
        async with self._admin:
            runtime = self._runtime(name)
            old = runtime.config
            new = change(old)
            if new != old:
                await asyncio.to_thread(
                    self.storage.metadata.put_subscription, name, new.to_storage()
                )
                runtime.config = new
                runtime.core.reconfigure(new)
                runtime.wake()  # more room under max_in_flight, a shorter deadline...
            return old, new

    def get(self, name: str) -> SubscriptionConfig:
        return self._runtime(name).config

    def names(self) -> list[str]:
        return list(self._runtimes)

    def stats(self, name: str) -> dict[str, Any]:
        """PROTOCOL §5 stats, as the JSON object of a subscription's answer."""
        return self.stats_of(name).as_dict()

    def stats_of(self, name: str) -> SubscriptionStats:
        """PROTOCOL §5 stats, as the model the console's snapshot is built of."""
        runtime = self._runtime(name)
        runtime.refresh_bounds()
        return runtime.core.stats()

    def pause_reason(self, name: str) -> str:
        """no_credit | max_in_flight | backoff | none — for the console."""
        runtime = self._runtime(name)
        runtime.refresh_bounds()
        return runtime.core.pause_reason().value

    async def seek(self, name: str, target: StartAt) -> None:
        """PROTOCOL §2 seek: earliest, latest, a timestamp, or per-partition offsets (past
        the end means the end). Raises PartitionNotFound (nothing changed) for a partition
        the topic does not have."""
        runtime = self._runtime(name)
        target.check_partitions(runtime.topic.name, len(runtime.topic.partitions))
        runtime.core.seek(await target.offsets_in(runtime.topic.partitions))
        runtime.wake()

    async def settled(self, name: str) -> None:
        """Wait until subscription ``name`` has done all it can for now: it sends nothing
        more until an append, credit, a verdict or one of its timers wakes it. (How a test
        sees that nothing more comes, without sleeping and hoping.)"""
        await self._runtime(name).idle.wait()

    def clock_moved(self) -> None:
        """The injected clock jumped ahead (a test's fake clock): every subscription checks
        its deadlines and backoffs against it now rather than when its timer fires."""
        for runtime in self._runtimes.values():
            runtime.wake()

    # ------------------------------------------------------------------ consumers

    def attach(self, name: str, sink: ConsumerSink, credit: int) -> str:
        """Attach a consumer with its initial credit; returns its consumer id. Records
        go to ``sink.send`` from the next loop iteration on."""
        runtime = self._runtime(name)
        consumer = f"{name}#{next(self._ids)}"
        if self._stopped:
            sink.close(CloseCode.GOING_AWAY, "server shutting down")
            return consumer
        runtime.core.attach(consumer, credit)
        runtime.sinks[consumer] = sink
        self._consumers[consumer] = runtime
        runtime.wake()
        return consumer

    def detach(self, consumer_id: str) -> None:
        """PROTOCOL §3: its in-flight records go back for redelivery at once. Idempotent."""
        runtime = self._consumers.pop(consumer_id, None)
        if runtime is None:
            return
        runtime.sinks.pop(consumer_id, None)
        runtime.core.detach(consumer_id, self._clock())
        runtime.wake()

    def credit_of(self, consumer_id: str) -> int:
        """The consumer's outstanding credit: granted and not yet spent (0 if detached)."""
        runtime = self._consumers.get(consumer_id)
        return 0 if runtime is None else runtime.core.consumers.credit_of(consumer_id)

    def consumers_of(self, name: str) -> list[AttachedConsumer]:
        """Read-only: the consumers attached to subscription ``name`` (the console)."""
        core = self._runtime(name).core
        return [
            AttachedConsumer(id, core.consumers.credit_of(id), core.in_flight_of(id), sink)
            for id, sink in self._runtime(name).sinks.items()
        ]

    def grant_credit(self, consumer_id: str, n: int) -> None:
        runtime = self._consumer(consumer_id)
        runtime.core.grant_credit(consumer_id, n)
        runtime.wake()

    def ack(self, consumer_id: str, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """(ok, unknown). Any consumer of the subscription may ack any of its records."""
        runtime = self._consumer(consumer_id)
        result = runtime.core.ack(ids)
        if result[0]:
            runtime.wake()  # room under max_in_flight
        return result

    def nack(
        self,
        consumer_id: str,
        ids: Sequence[str],
        delay_ms: int | None,
        reason: str | None = None,
    ) -> None:
        """``reason``: what a dead letter of these records says went wrong (PROTOCOL §8);
        None for a nack without one."""
        runtime = self._consumer(consumer_id)
        runtime.core.nack(ids, delay_ms, self._clock(), reason)
        runtime.wake()

    def extend(self, consumer_id: str, ids: Sequence[str], ms: int) -> None:
        runtime = self._consumer(consumer_id)
        runtime.core.extend(ids, ms, self._clock())
        runtime.wake()  # the timer may have to move

    # ------------------------------------------------------------------ pull (PROTOCOL §8)

    async def pull(
        self,
        name: str,
        max_messages: int,
        wait_s: float,
        stopping: asyncio.Event | None = None,
    ) -> list[Delivery]:
        """Up to ``max_messages`` records from the subscription's cursor (delivery/pull.py).
        Answers as soon as records came, else once ``wait_s`` has passed and the worker
        has looked at the log; at once on ``stopping`` (SIGTERM), a delete or shutdown."""
        runtime = self._runtime(name)
        if self._stopped or (stopping is not None and stopping.is_set()):
            return []
        sink = PullSink()
        consumer = f"{name}#pull{next(self._ids)}"
        runtime.core.attach(consumer, max_messages)
        runtime.sinks[consumer] = sink
        self._consumers[consumer] = runtime
        runtime.wake()
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        settle_by = end + SETTLE_S
        stop_events = [sink.changed] if stopping is None else [sink.changed, stopping]
        try:
            while not sink.deliveries and not sink.closed:
                if stopping is not None and stopping.is_set():
                    break
                now = loop.time()
                if now < end:
                    await first_of(stop_events, end - now)
                    continue
                # The wait is over: answer once the worker has looked at the log.
                if runtime.idle.is_set() or now >= settle_by:
                    break
                await first_of([*stop_events, runtime.idle], settle_by - now)
        except BaseException:
            self.detach(consumer)  # the client went away: its records go back at once
            raise
        # Released, not detached: what the response carries stays in flight.
        self._consumers.pop(consumer, None)
        runtime.sinks.pop(consumer, None)
        runtime.core.release(consumer)
        return sink.deliveries

    def ack_in(self, name: str, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """PROTOCOL §8 `/ack`: (ok, unknown) over any in-flight record of ``name``."""
        runtime = self._runtime(name)
        result = runtime.core.ack(ids)
        if result[0]:
            runtime.wake()
        return result

    def nack_in(
        self, name: str, ids: Sequence[str], delay_ms: int | None, reason: str | None
    ) -> None:
        """PROTOCOL §8 `/nack`: as a consumer's nack; unknown ids are ignored."""
        runtime = self._runtime(name)
        runtime.core.nack(ids, delay_ms, self._clock(), reason)
        runtime.wake()

    # ------------------------------------------------------------------ internals

    def _runtime(self, name: str) -> SubscriptionRuntime:
        runtime = self._runtimes.get(name)
        if runtime is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")
        return runtime

    def _consumer(self, consumer_id: str) -> SubscriptionRuntime:
        runtime = self._consumers.get(consumer_id)
        if runtime is None:
            raise SubscriptionNotFound(f"consumer {consumer_id!r} is not attached")
        return runtime

    def _open_runtime(
        self, name: str, config: SubscriptionConfig, topic: Topic, cursor: CursorSnapshot
    ) -> None:
        core = SubscriptionCore(config, cursor, wall_ms=self._wall_ms)
        runtime = SubscriptionRuntime(name, config, topic, core, self.storage, self._clock)
        self._runtimes[name] = runtime
        runtime.refresh_bounds()
        runtime.start()

    async def _discard(self, runtime: SubscriptionRuntime) -> None:
        for consumer in runtime.close_sinks(CloseCode.DELETED, "subscription deleted"):
            self._consumers.pop(consumer, None)
        await runtime.stop()
        async with runtime.save_lock:  # a flush in progress must not resurrect the file
            await asyncio.to_thread(self.storage.cursors.delete, runtime.name)

    async def _initial_cursor(self, topic: Topic, start: StartAt) -> CursorSnapshot:
        offsets = await start.offsets_in(topic.partitions)
        return CursorSnapshot({p: PartitionCursor(o) for p, o in offsets.items()}, {})

    async def _save(self, runtime: SubscriptionRuntime, *, with_attempts: bool = False) -> None:
        async with runtime.save_lock:
            if self._runtimes.get(runtime.name) is not runtime:
                return  # deleted or released meanwhile (maybe running anew: not this one)
            snapshot = runtime.core.snapshot(with_attempts=with_attempts)
            try:
                await asyncio.to_thread(self.storage.cursors.save, runtime.name, snapshot)
            except BaseException:
                runtime.core.dirty = True  # try again on the next flush
                raise
            if self._cursor_saved is not None and self._runtimes.get(runtime.name) is runtime:
                # A cluster's next coordinator takes the attempt counts over too (issue
                # 15): max_deliveries holds across a coordinator's crash, not only across a
                # graceful restart as on a single node.
                if not with_attempts:
                    snapshot = runtime.core.snapshot(with_attempts=True)
                self._cursor_saved(runtime.name, snapshot)

    async def _flush_dirty(self) -> None:
        """Persist the cursors changed since the last flush; run every flush interval
        (PROTOCOL §3: acks are persisted with the cursor; ≤ 1 s may be lost to a crash)."""
        dirty = [r for r in self._runtimes.values() if r.core.dirty]
        if not dirty:
            return
        results = await asyncio.gather(*(self._save(r) for r in dirty), return_exceptions=True)
        for runtime, result in zip(dirty, results, strict=True):
            if isinstance(result, Exception):
                _cursor_not_saved(runtime.name, result)


def config_matches(
    existing: SubscriptionConfig, wanted: SubscriptionConfig, given: Collection[str] | None
) -> bool:
    """PROTOCOL §2 PUT: 200 if every field given (default: all) equals the config's.
    `start` only says where a *new* subscription begins: never compared."""
    fields = _CONFIG_FIELDS if given is None else given
    return all(getattr(existing, f) == getattr(wanted, f) for f in fields if f != "start")


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(SubscriptionConfig))


def _fit_cursor(cursor: CursorSnapshot, topic: Topic) -> CursorSnapshot:
    """One cursor per partition of the topic (a cursor file from an older layout might
    lack some): missing partitions start at the log start."""
    partitions = {
        p.partition: cursor.partitions.get(p.partition) or PartitionCursor(p.start_offset)
        for p in topic.partitions
    }
    return CursorSnapshot(partitions, cursor.attempts)


def _cursor_not_saved(name: str, error: BaseException) -> None:
    # A failing disk is one line (every save would repeat the same traceback); anything
    # else is a bug, with its traceback.
    if isinstance(error, OSError):
        log.error("persisting the cursor of %s failed: %s", name, error)
    else:
        log.error("persisting the cursor of %s failed", name, exc_info=error)
