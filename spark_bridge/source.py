"""The `herald` streaming source: a push receiver (a WebSocket subscription) feeding
Spark micro-batches, with Herald's per-partition offsets as the source offsets.

Where things run (pyspark's Python Data Source API): `initialOffset`, `latestOffset`,
`partitions`, `commit` and `stop` run in one long-lived Python worker per query; `read`
runs on executors on a pickled copy of the reader. The receiver therefore lives in that
worker, starts lazily on the first `latestOffset`/`partitions`, and is left out of the
pickled state; the rows of a batch travel to the executors inside its InputPartitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from herald.admin import Admin
from herald.consumer import Consumer
from herald.errors import HeraldClientError
from herald.lifecycle import periodic
from herald.message import Message
from herald.protocol.filter import FilterSyntaxError, Matcher, compile_filter, parse
from herald.protocol.frames import ExtendFrame

from .arrow import Encoded, encode, schema_batch, shipped_batch
from .nodes import node_urls

log = logging.getLogger(__name__)

READ_PAGE = 10_000  # PROTOCOL §2 read: limit 1..10000
DEFAULT_CREDIT = 50_000
ACK_DEADLINE_MS = 300_000  # bridge subscriptions: records may wait minutes for a commit
EXTEND_EVERY_S = 60.0
MAX_IN_FLIGHT_CAP = 100_000  # PROTOCOL §2: max_in_flight 1..100000


@dataclass(frozen=True, slots=True)
class Starting:
    """`startingOffsets`, in the terms of a PROTOCOL §2 seek request: {"to": "earliest"}
    or {"to": "latest"}, or {"timestamp": T} (the first record at or after T)."""

    to: str | None = "latest"
    timestamp: int | None = None

    @classmethod
    def parse(cls, raw: str) -> Starting:
        if raw in ("earliest", "latest"):
            return cls(to=raw)
        if raw.isascii() and raw.isdigit():
            return cls(to=None, timestamp=int(raw))
        raise ValueError(
            f"startingOffsets must be 'earliest', 'latest' or a timestamp in ms, got {raw!r}"
        )


@dataclass(frozen=True)
class Options:
    urls: tuple[str, ...]
    topic: str
    subscription: str
    token: str | None
    starting: Starting
    max_records_per_trigger: int | None
    credit: int
    filter: str | None = None  # PROTOCOL §8 filter of the subscription; checked in parse()

    @classmethod
    def parse(cls, given: dict[str, str]) -> Options:
        # Spark hands options over case-insensitively (lower-cased keys).
        options = {k.lower(): v for k, v in given.items()}
        topic = options.get("topic")
        if not topic:
            raise ValueError("the herald source needs option 'topic'")
        starting = Starting.parse(str(options.get("startingoffsets", "latest")).strip().lower())
        limit = options.get("maxrecordspertrigger")
        max_records = int(limit) if limit not in (None, "") else None
        if max_records is not None and max_records < 1:
            raise ValueError("maxRecordsPerTrigger must be ≥ 1")
        credit = int(options.get("credit") or DEFAULT_CREDIT)
        if not 1 <= credit <= 1_000_000:
            raise ValueError("credit must be 1..1000000")
        filter_ = options.get("filter") or None
        if filter_ is not None:
            try:
                parse(filter_)
            except FilterSyntaxError as exc:
                raise ValueError(f"option 'filter' is not a Herald filter: {exc}") from None
        return cls(
            urls=node_urls(options),
            topic=topic,
            subscription=options.get("subscription") or f"spark-{topic}",
            token=options.get("token") or None,
            starting=starting,
            max_records_per_trigger=max_records,
            credit=credit,
            filter=filter_,
        )


def apportion(available: dict[int, int], budget: int) -> dict[int, int]:
    """Split `budget` rows fairly over partitions with `available` rows each."""
    taken = dict.fromkeys(available, 0)
    left = budget
    open_parts = [p for p, n in available.items() if n > 0]
    while left > 0 and open_parts:
        share = max(1, left // len(open_parts))
        for p in list(open_parts):
            grant = min(share, available[p] - taken[p], left)
            taken[p] += grant
            left -= grant
            if taken[p] >= available[p]:
                open_parts.remove(p)
            if left == 0:
                break
    return taken


async def _admin_call(opts: Options, fn: Any) -> Any:
    async with Admin(opts.urls, opts.token) as admin:
        return await fn(admin)


def call_admin(opts: Options, fn: Any) -> Any:
    """Run one Admin coroutine from synchronous code (a fresh loop in this thread)."""
    return asyncio.run(_admin_call(opts, fn))


def read_range(
    opts: Options, partition: int, start: int, end: int, matches: Matcher | None = None
) -> list[Encoded]:
    """Records [start, end) of one partition from the read API (PROTOCOL §2 Read); with
    ``matches`` (the subscription's filter), only those it lets through."""

    async def fetch(admin: Admin) -> list[Encoded]:
        records: list[Encoded] = []
        offset = start
        while offset < end:
            page = await admin.read_messages(
                opts.topic, partition, offset=offset, limit=min(READ_PAGE, end - offset)
            )
            messages = page["messages"]
            if not messages:
                raise RuntimeError(
                    f"herald: {opts.topic}/{partition} has no records from offset {offset} "
                    f"(next_offset {page['next_offset']}); they were deleted by retention"
                )
            for m in messages:
                if m["offset"] < end:
                    message = Message.from_json(m)
                    if matches is None or matches(message):
                        records.append(encode(message))
            offset = page["next_offset"]
        return records

    result: list[Encoded] = call_admin(opts, fetch)
    return result


class Receiver:
    """The push receiver: a WebSocket consumer of the bridge's subscription running
    in a background thread, buffering at most `credit` records for the next batches.

    Offsets here are Herald's. `planned[p]`: every offset below it belongs to a batch
    already planned (its records are not buffered again). `committed[p]`: every offset
    below it is committed by Spark, so a redelivery of it is acked and dropped at once.
    Records delivered but not acked are `held` and acked by `commit(end)`; their ack
    deadline is extended while they wait.

    When the consumer's connection is lost (its node died) and it reconnects, to the
    same node or the next one, the server redelivers every held record with the same
    id: one already committed is acked at once, one planned is held again for its
    commit, one buffered is not buffered twice. Acks are by record id, so a commit's
    acks count on whichever connection carries them.
    """

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._cond = threading.Condition()
        self._buffer: dict[int, dict[int, Encoded]] = {}
        self._buffered = 0
        self._held: dict[int, dict[int, str]] = {}
        self._planned: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._stopping = False
        self._has_room: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"herald-receiver-{opts.subscription}", daemon=True
        )

    # -- the Spark side (the worker's main thread) ---------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30)

    def set_planned(self, floor: dict[int, int]) -> None:
        with self._cond:
            for p, offset in floor.items():
                if offset > self._planned.get(p, 0):
                    self._planned[p] = offset
                buffer = self._buffer.get(p)
                if buffer:
                    for o in [o for o in buffer if o < offset]:
                        del buffer[o]
                        self._buffered -= 1
            self._cond.notify_all()

    def available(self, start: dict[int, int]) -> dict[int, int]:
        """Per partition: one past the highest buffered offset at or after `start`."""
        self._raise_failure()
        with self._cond:
            ends: dict[int, int] = {}
            for p, first in start.items():
                buffer = self._buffer.get(p)
                top = max(buffer) + 1 if buffer else first
                ends[p] = max(first, top)
            return ends

    def take(self, partition: int, start: int, end: int) -> tuple[list[Encoded], list[int]]:
        """Buffered records of [start, end) in offset order, and the offsets missing."""
        with self._cond:
            buffer = self._buffer.setdefault(partition, {})
            records: list[Encoded] = []
            missing: list[int] = []
            for offset in range(start, end):
                record = buffer.pop(offset, None)
                if record is None:
                    missing.append(offset)
                else:
                    records.append(record)
            self._buffered -= len(records)
        self._wake_receiver()
        return records, missing

    def _wake_receiver(self) -> None:
        loop, event = self._loop, self._has_room
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    def commit(self, end: dict[int, int]) -> None:
        ids: list[str] = []
        with self._cond:
            for p, offset in end.items():
                if offset > self._committed.get(p, 0):
                    self._committed[p] = offset
                held = self._held.get(p)
                if held:
                    for o in [o for o in held if o < offset]:
                        ids.append(held.pop(o))
        self._ack(ids)

    def stop(self) -> None:
        self._stopping = True
        loop, consumer = self._loop, self._consumer
        if loop is not None and consumer is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(consumer.close(), loop)
            try:
                future.result(timeout=10)
            except Exception:
                log.warning("herald receiver: closing the consumer failed", exc_info=True)
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"herald receiver failed: {self.failure!r}") from self.failure

    def _ack(self, ids: list[str]) -> None:
        loop, consumer = self._loop, self._consumer
        if not ids or loop is None or consumer is None:
            return

        def queue() -> None:
            for message_id in ids:
                consumer.queue_ack(message_id)

        loop.call_soon_threadsafe(queue)

    # -- the receiver thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            if not self._stopping:
                self.failure = exc
                log.exception("herald receiver stopped")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._has_room = asyncio.Event()
        # Given a cluster's nodes, the consumer moves to the next one when its node dies
        # (PROTOCOL §7); what was in flight comes back and is sorted out by _accept.
        consumer = Consumer(
            self.opts.urls,
            self.opts.subscription,
            self.opts.token,
            credit=self.opts.credit,
            compression=None,  # Spark and Herald are near: compressing costs both CPU
        )
        self._consumer = consumer
        self._started.set()
        extender = asyncio.create_task(
            periodic(
                EXTEND_EVERY_S,
                lambda: self._extend_held(consumer),
                what="extending held records",
                logger=log,
            ),
            name="herald-spark-extend",
        )
        try:
            async with consumer:
                while not self._stopping:
                    # In bulk: one wait, one lock and one wake-up per batch of records.
                    room = await self._room()
                    messages = await consumer.take_batch(room)
                    if not messages:
                        break
                    self._accept(messages)
        finally:
            extender.cancel()
            await asyncio.wait((extender,))

    async def _room(self) -> int:
        """How many records the buffer can take now, once it can take any."""
        # The buffer holds at most `credit` records; the consumer's own inbox at most
        # `credit` more, since the server sends no more than the credit given.
        event = self._has_room
        assert event is not None
        while self._buffered >= self.opts.credit and not self._stopping:
            event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):  # also notices stop()
                    await event.wait()
        return max(1, self.opts.credit - self._buffered)

    def _accept(self, messages: list[Message]) -> None:
        # Encoded here, as records arrive and outside the lock, not in partitions():
        # the batch that takes them only assembles columns.
        records = [encode(message) for message in messages]
        acks: list[str] = []
        with self._cond:
            for record in records:
                p, offset = record.partition, record.offset
                if offset < self._committed.get(p, 0):
                    acks.append(record.id)  # Spark already committed it: a redelivery
                    continue
                self._held.setdefault(p, {})[offset] = record.id
                buffer = self._buffer.setdefault(p, {})
                if offset >= self._planned.get(p, 0) and offset not in buffer:
                    buffer[offset] = record
                    self._buffered += 1
            self._cond.notify_all()
        if acks:
            assert self._consumer is not None
            for message_id in acks:
                self._consumer.queue_ack(message_id)

    async def _extend_held(self, consumer: Consumer) -> None:
        """PROTOCOL §3 extend: what Spark holds but has not committed keeps its deadline."""
        with self._cond:
            ids = [i for held in self._held.values() for i in held.values()]
        for chunk in range(0, len(ids), 10_000):
            consumer.queue_frame(ExtendFrame(ids=ids[chunk : chunk + 10_000], ms=ACK_DEADLINE_MS))

    def wait_for_records(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._buffered > 0 or self._stopping, timeout)


@dataclass(frozen=True)
class HeraldPartition(InputPartition):
    """The records of one Herald partition for one batch in the shipped Arrow form
    (pickled to an executor). `first` and `end` are the Herald offsets it covers."""

    batch: pa.RecordBatch
    first: int
    end: int


class HeraldStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.opts = Options.parse(options)
        self._receiver: Receiver | None = None
        self._partitions: list[int] | None = None
        self._available_now: dict[int, int] | None = None
        self._initial: dict[str, int] | None = None  # where this query started
        # The subscription's filter, as the server has it (the `filter` option, or the
        # one an existing subscription was made with); compiled in the planning worker.
        self._filter: str | None = None
        self._matches: Matcher | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_receiver"] = None  # the receiver stays in the planning worker
        state["_matches"] = None  # only the planning worker re-reads ranges
        return state

    # -- setup ----------------------------------------------------------------------------

    def _topic(self) -> dict[str, Any]:
        topic: dict[str, Any] = call_admin(
            self.opts, lambda admin: admin.get_topic(self.opts.topic)
        )
        return topic

    def _ensure_subscription(self) -> None:
        opts = self.opts
        config = {
            "start": "latest",
            "ack_deadline_ms": ACK_DEADLINE_MS,
            "max_in_flight": min(MAX_IN_FLIGHT_CAP, 4 * opts.credit),
            "max_deliveries": 0,  # never dead-letter: records may wait long for a commit
        }
        if opts.filter is not None:
            config["filter"] = opts.filter

        async def create(admin: Admin) -> dict[str, Any]:
            try:
                created: dict[str, Any] = await admin.create_subscription(
                    opts.subscription, opts.topic, **config
                )
                return created
            except HeraldClientError as exc:
                if exc.code != "subscription_conflict":
                    raise
                existing: dict[str, Any] = await admin.get_subscription(opts.subscription)
                if existing["config"]["topic"] != opts.topic:
                    raise ValueError(
                        f"subscription {opts.subscription!r} is on topic "
                        f"{existing['config']['topic']!r}, not {opts.topic!r}"
                    ) from exc
                return existing

        subscription = call_admin(opts, create)
        current = subscription["config"].get("filter")
        if opts.filter is not None and current != opts.filter:
            # A batch re-read from the log must hold what the subscription delivers.
            raise ValueError(
                f"subscription {opts.subscription!r} has filter {current!r}, not "
                f"{opts.filter!r}: change it (PATCH) or use another subscription"
            )
        self._filter = current
        self._matches = None if current is None else compile_filter(parse(current))

    def _receiver_started(self) -> Receiver:
        if self._receiver is None:
            self._ensure_subscription()
            receiver = Receiver(self.opts)
            receiver.start()
            self._receiver = receiver
        return self._receiver

    # -- the DataSourceStreamReader API -----------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """A new query: where `startingOffsets` points, and the subscription moved there
        once. Spark asks again on every trigger until a first batch has run (while
        nothing has arrived): seeking each time would send the records again and, with a
        filter, drop (and count) the records it dropped again."""
        if self._initial is not None:
            return self._initial
        self._ensure_subscription()
        # The server resolves the position (PROTOCOL §2 seek) and answers with the
        # subscription's stats: each partition's ack floor is where it now starts.
        starting = self.opts.starting
        sought = call_admin(
            self.opts,
            lambda admin: admin.seek(
                self.opts.subscription, to=starting.to, timestamp=starting.timestamp
            ),
        )
        offsets = {p["partition"]: p["ack_floor"] for p in sought["stats"]["partitions"]}
        self._initial = {str(p): o for p, o in sorted(offsets.items())}
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        parts = self._topic()["partitions"]
        self._available_now = {p["partition"]: p["end_offset"] for p in parts}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        receiver = self._receiver_started()
        begin = {int(p): int(o) for p, o in start.items()}
        receiver.set_planned(begin)
        if self._available_now is not None:
            # Drain up to what the topic held when the trigger started; records the
            # receiver has not been pushed yet are read from the read API.
            target = {p: max(begin.get(p, 0), o) for p, o in self._available_now.items()}
        else:
            target = receiver.available(begin)
        available = {p: target[p] - begin.get(p, 0) for p in target}
        if isinstance(limit, ReadMaxRows):
            granted = apportion(available, limit.max_rows)
        else:
            granted = available
        return {str(p): begin.get(p, 0) + granted[p] for p in sorted(target)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        receiver = self._receiver_started()
        begin = {int(p): int(o) for p, o in start.items()}
        finish = {int(p): int(o) for p, o in end.items()}
        result: list[InputPartition] = []
        for p in sorted(finish):
            first, last = begin.get(p, 0), finish[p]
            if last <= first:
                continue
            records, missing = receiver.take(p, first, last)
            if missing:
                # Records the checkpoint expects but the buffer does not hold (a restart,
                # a lost buffer, or availableNow; with a filter, also the records it
                # dropped): re-read them from the log, through the same filter, so that a
                # batch holds what the subscription delivers and a replay the same rows.
                fetched = read_range(self.opts, p, missing[0], missing[-1] + 1, self._matches)
                wanted = set(missing)
                records.extend(r for r in fetched if r.offset in wanted)
                records.sort(key=lambda r: r.offset)
            result.append(HeraldPartition(shipped_batch(records), first, last))
        receiver.set_planned(finish)
        return result

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, HeraldPartition)
        yield schema_batch(partition.batch)

    def commit(self, end: dict[str, int]) -> None:
        """Spark committed every batch up to `end`: ack those records to Herald."""
        self._receiver_started().commit({int(p): int(o) for p, o in end.items()})

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None
