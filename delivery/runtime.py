"""The async runtime of one subscription: the I/O around its SubscriptionCore.

One supervised worker task per subscription does everything that awaits — log reads,
dead-letter publishes — in batches; sync callers (acks, credit, append listeners, the
timer) only update the core and set an event. So the hot path is per batch, never a
task or an await per record (STYLE: only what can block is async).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from delivery.config import SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.dead_letter import dead_letter_record
from delivery.events import DeadLetter, Delivery, ReadRequest, RefetchRequest
from delivery.flag import Flag
from herald.lifecycle import Backoff, supervised
from storage.config import TopicConfig
from storage.partition import Partition
from storage.record import Acks, Record
from storage.topic import PublishItem, Topic

log = logging.getLogger("herald.delivery")

READ_MAX_BYTES = 4 << 20  # per log read; a read still returns ≥ 1 record
REFETCH_RUN = 1000  # redelivery offsets this close together are re-read in one read
MAX_ROUNDS = 64  # pump/read rounds per wake-up before other subscriptions get a turn
TIMER_SLACK_S = 0.001  # loop timers may fire a hair early against our clock
# A failed step is retried after 0.1 s, then less often while it keeps failing.
RESTART_BACKOFF = Backoff(first_s=0.1, max_s=1.0, healthy_s=10.0)


class ConsumerSink(Protocol):
    """A consumer the engine pushes into (subscribers/: a WebSocket session, a webhook)."""

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        """Called on the loop, never blocks; never more records than the credit granted."""

    def close(self, code: int, reason: str) -> None:
        """4410 when the subscription is deleted, 1001 on shutdown."""


class Backpressure(Protocol):
    """A consumer whose outbox is bounded in bytes (STYLE 3): while ``congested`` no more
    is read for it, until ``drained`` returns (the ephemeral tail's connection)."""

    def congested(self) -> bool: ...

    async def drained(self) -> None: ...


class DeadLetterTopics(Protocol):
    """What the runtime needs of Storage to dead-letter (kept narrow for tests)."""

    def topic(self, name: str) -> Topic | None: ...

    async def ensure_topic(self, name: str, config: TopicConfig) -> tuple[Topic, bool]: ...


class SubscriptionRuntime:
    def __init__(
        self,
        name: str,
        config: SubscriptionConfig,
        topic: Topic,
        core: SubscriptionCore,
        storage: DeadLetterTopics,
        clock: Callable[[], float],
        *,
        read_max_bytes: int = READ_MAX_BYTES,
        backpressure: Backpressure | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.topic = topic
        self.core = core
        self.sinks: dict[str, ConsumerSink] = {}
        self._storage = storage
        self._clock = clock
        self._read_max_bytes = read_max_bytes
        self._backpressure = backpressure
        self._wake = Flag()
        # Set while the worker waits with nothing left to do: until an append, credit,
        # a verdict or a timer wakes it, it sends nothing (what tests wait on instead of
        # sleeping to see that nothing more comes).
        self.idle = Flag()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self.save_lock = asyncio.Lock()  # one cursor save at a time; delete waits for it
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Listen for appends and run the supervised worker as an app-wide task."""
        self.listen()
        self._task = asyncio.create_task(
            supervised(
                self._run_woken,
                what=f"delivery of subscription {self.name}",
                logger=log,
                backoff=RESTART_BACKOFF,
            ),
            name=f"herald-delivery-{self.name}",
        )

    def listen(self) -> None:
        """Follow the log's end through the partitions' append listeners (no polling)."""
        for partition in self.topic.partitions:
            self.core.set_end(partition.partition, partition.end_offset)
            self._unsubscribe.append(partition.add_append_listener(self._on_append))
        self.wake()

    async def stop(self) -> None:
        """Stop the worker and the timer; the core stays readable for a last snapshot."""
        self.closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # wait() does not raise the task's CancelledError, yet a cancel of the
            # caller still propagates.
            await asyncio.wait([task])

    def close_sinks(self, code: int, reason: str) -> list[str]:
        consumers = list(self.sinks)
        sinks, self.sinks = list(self.sinks.values()), {}
        for sink in sinks:
            try:
                sink.close(code, reason)
            except Exception:
                log.exception("closing a consumer of %s failed", self.name)
        return consumers

    def wake(self) -> None:
        self.idle.clear()
        self._wake.set()

    def refresh_bounds(self) -> None:
        """Pick up the log's current start (retention) and end."""
        core = self.core
        for partition in self.topic.partitions:
            core.set_start(partition.partition, partition.start_offset)
            core.set_end(partition.partition, partition.end_offset)

    # ------------------------------------------------------------------ events

    def _on_append(self, partition: Partition) -> None:
        self.core.set_end(partition.partition, partition.end_offset)
        # Nobody to send to: the record waits in the log, not in memory (a filter still
        # skips what it does not match, PROTOCOL §8).
        if self.core.consumers.total_credit > 0 or self.core.scans_without_credit:
            self.wake()

    def _on_timer(self) -> None:
        self._timer = None
        self.wake()

    # ------------------------------------------------------------------ the worker

    async def run(self) -> None:
        """The worker, unsupervised: a failed step raises. A connection that owns its
        runtime (an ephemeral tail) runs it in its own TaskGroup; after ``listen``."""
        while True:
            await self._next_wake()
            await self._step()

    async def _run_woken(self) -> None:
        """The worker as :meth:`start` supervises it: one failed step (a storage
        error...) must not end delivery for this subscription; it is restarted after a
        short backoff and steps again at once."""
        self.wake()
        await self.run()

    async def _next_wake(self) -> None:
        if not self._wake.is_set():
            self.idle.set()
        await self._wake.wait()
        if self._backpressure is not None and self._backpressure.congested():
            await self._backpressure.drained()
        self._wake.clear()

    async def _step(self) -> None:
        core = self.core
        core.tick(self._clock())
        backpressure = self._backpressure
        for round_ in range(MAX_ROUNDS):
            self._dispatch(core.pump(self._clock()))
            if backpressure is not None and backpressure.congested():
                self.wake()  # read on once the consumer's outbox has drained
                break
            requests = core.take_reads()
            if not requests:
                break
            for request in requests:
                if isinstance(request, ReadRequest):
                    await self._read(request)
                else:
                    await self._refetch(request)
            if round_:
                await asyncio.sleep(0)  # a long backlog must not starve the loop
        else:
            self.wake()  # more to do: continue after others had a turn
        dead_letters = core.take_dead_letters()
        if dead_letters:
            await self._dead_letter(dead_letters)
            self.wake()  # their keys and room may let more records go
        self._arm_timer(core.next_wakeup())

    def _dispatch(self, sends: list[tuple[str, list[Delivery]]]) -> None:
        for consumer, deliveries in sends:
            sink = self.sinks.get(consumer)
            if sink is None:  # the core only sends to attached consumers
                continue
            try:
                sink.send(self.topic.name, self.name, deliveries)
            except Exception:
                log.exception("consumer %s of %s failed to take records", consumer, self.name)
                self.sinks.pop(consumer, None)
                self.core.detach(consumer, self._clock())

    async def _read(self, request: ReadRequest) -> None:
        partition = self.topic.partitions[request.partition]
        self.core.set_start(request.partition, partition.start_offset)
        try:
            records = await partition.read(
                request.offset, request.max_records, self._read_max_bytes
            )
        except BaseException:
            self.core.read_failed(request)
            raise
        self.core.feed(request, records)

    async def _refetch(self, request: RefetchRequest) -> None:
        """Re-read the records of redeliveries by offset, in runs of nearby offsets, from
        the tail cache when it still has them."""
        partition = self.topic.partitions[request.partition]
        offsets = request.offsets
        wanted = set(offsets)
        found: list[Record] = []
        try:
            i, n = 0, len(offsets)
            while i < n:
                first = offsets[i]
                j = i
                while j + 1 < n and offsets[j + 1] - first < REFETCH_RUN:
                    j += 1
                last, position = offsets[j], first
                while position <= last:
                    count = last - position + 1
                    records = await partition.read(position, count, self._read_max_bytes)
                    if not records:
                        break
                    found.extend(r for r in records if r.offset in wanted)
                    position = records[-1].offset + 1
                i = j + 1
        except BaseException:
            self.core.refetch_failed(request, self._clock())
            raise
        # Offsets not found are gone from the log (retention); the core expires them.
        self.core.feed_refetch(request, found)

    async def _dead_letter(self, dead_letters: list[DeadLetter]) -> None:
        core = self.core
        target = self.config.dead_letter_topic
        if target is None:
            for dead in dead_letters:  # PROTOCOL §2: null -> dropped and counted
                core.dead_letter_done(dead)
            return
        try:
            topic = self._storage.topic(target)
            if topic is None:
                # PROTOCOL §1: dead-letter topics are always created when needed.
                topic, _ = await self._storage.ensure_topic(target, TopicConfig())
            items = [
                PublishItem(dead_letter_record(d, self.topic.name, self.name)) for d in dead_letters
            ]
            await topic.publish(items, Acks.ALL)
        except Exception:
            log.exception("dead-lettering to %s failed; retrying", target)
            now = self._clock()
            for dead in dead_letters:
                core.dead_letter_failed(dead, now)
            return
        for dead in dead_letters:
            core.dead_letter_done(dead)

    def _arm_timer(self, when: float | None) -> None:
        """Have the worker woken at ``when`` (the core's clock). A timer already due
        earlier is kept rather than cancelled and made again for every record (a
        deadline per delivery): its early wake is an extra step that finds little to
        do, and that step arms the timer for what is due then."""
        if when is None or self.closed:
            return
        loop = asyncio.get_running_loop()
        fires = loop.time() + max(0.0, when - self._clock()) + TIMER_SLACK_S
        if self._timer is not None:
            if self._timer.when() <= fires:
                return
            self._timer.cancel()
        self._timer = loop.call_at(fires, self._on_timer)
