"""A topic: its partitions, partition choice and deduplicated publish (PROTOCOL §1, §2)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c

from herald.protocol.errors import PartitionNotFound, StorageUnavailable, TopicNotFound
from storage.config import TopicConfig
from storage.dedup import DedupIndex
from storage.errors import WrittenNotSynced
from storage.partition import Partition
from storage.record import Acks, NewRecord, message_size, slot_constructor
from storage.writer import wall_clock_ms

log = logging.getLogger("herald.storage")

# Rebuilding the dedup index reads the last window in bounded batches.
_REBUILD_RECORDS = 1000
_REBUILD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PublishItem:
    record: NewRecord
    partition: int | None = None  # explicit partition, validated by the caller


@dataclass(frozen=True, slots=True)
class PublishResult:
    partition: int
    offset: int
    duplicate: bool


# Fast positional constructors for the per-record objects of a publish.
publish_item = slot_constructor(PublishItem)
_publish_result = slot_constructor(PublishResult)


# What a publish in flight promises the publishes racing it for the same producer id:
# (partition, offset) once appended, None if its append failed (the racer then appends).
_Landing = asyncio.Future[tuple[int, int] | None]


@dataclass(slots=True)
class _PublishPlan:
    """One publish, decided before anything is appended: an answer slot per item."""

    results: list[PublishResult | None]
    groups: dict[int, list[int]] = field(default_factory=dict)  # partition -> indexes there
    repeats: list[tuple[int, int]] = field(default_factory=list)  # (index, first with its id)
    racing: list[tuple[int, _Landing]] = field(default_factory=list)  # publish in flight
    owned: dict[str, _Landing] = field(default_factory=dict)  # ids appended here, promised
    originals: dict[int, int] = field(default_factory=dict)  # partition -> end of duplicates'

    def answers(self, count: int) -> list[PublishResult]:
        """The results in request order, a repeated id answered as its first item."""
        for index, first in self.repeats:
            original = self.results[first]
            assert original is not None
            self.results[index] = PublishResult(original.partition, original.offset, True)
        final = [r for r in self.results if r is not None]
        assert len(final) == count
        return final


class Topic:
    """Owns the partitions of one topic. Build it with :meth:`open`."""

    def __init__(
        self,
        name: str,
        config: TopicConfig,
        partitions: list[Partition],
        *,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if len(partitions) != config.partitions:
            raise ValueError("one Partition per configured partition is required")
        self.name = name
        self.config = config
        self.partitions = partitions
        # PROTOCOL §1 Auto-create: created by a publish or a subscription, not a PUT
        # (kept in meta.db; Storage sets it when it opens or creates the topic).
        self.auto_created = False
        self.messages_total = 0  # appended since the server started; duplicates not counted
        self.bytes_total = 0  # sum of message_size() of those
        self._wall_ms = wall_ms
        self._dedup = DedupIndex(config.dedup_window_ms)
        self._pending: dict[str, _Landing] = {}  # producer id -> publish in flight
        self._next_spread = 0  # round-robin partition for keyless batches
        self._appends: set[asyncio.Future[Any]] = set()  # in flight: close() waits
        self._rebuilding: asyncio.Task[None] | None = None  # the dedup index, after open
        self._rebuild_error: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        name: str,
        config: TopicConfig,
        partitions: list[Partition],
        *,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> Topic:
        """Wrap opened partitions; the dedup index is rebuilt from their last window in
        the background (see :meth:`dedup_ready`)."""
        topic = cls(name, config, partitions, wall_ms=wall_ms)
        # A window of millions of ids takes seconds to re-read: the topic serves reads,
        # deliveries and publishes without ids meanwhile; publishes with ids wait.
        topic._rebuilding = asyncio.create_task(
            topic._rebuild_dedup(), name=f"herald-dedup-rebuild-{name}"
        )
        topic._rebuilding.add_done_callback(topic._rebuild_done)
        return topic

    def _rebuild_done(self, task: asyncio.Task[None]) -> None:
        self._rebuilding = None
        if task.cancelled():
            self._rebuild_error = StorageUnavailable(f"topic {self.name!r} is closing")
        elif (error := task.exception()) is not None:
            log.error("rebuilding the dedup index of topic %s failed", self.name, exc_info=error)
            self._rebuild_error = error

    async def dedup_ready(self) -> None:
        """Return once producer ids can be checked; StorageUnavailable if they cannot
        (the rebuild failed: publishes with ids are refused rather than risk duplicates)."""
        if self._rebuilding is not None:
            # wait(), not shield(): neither the rebuild's error nor its cancellation (the
            # topic closing) is raised here, and a cancelled caller leaves the rebuild be.
            await asyncio.wait([self._rebuilding])
        if self._rebuild_error is not None:
            raise StorageUnavailable(
                f"producer ids of topic {self.name!r} cannot be checked: {self._rebuild_error}"
            )

    async def _rebuild_dedup(self) -> None:
        # PROTOCOL §2: dedup holds across a restart. The log frames keep producer_id, so
        # the index is re-read from the log instead of being a second file to keep in step.
        started = time.monotonic()
        since = self._wall_ms() - self.config.dedup_window_ms
        for partition in self.partitions:
            await self._read_ids(partition, since)
        self._dedup.expire(self._wall_ms())
        took = time.monotonic() - started
        log.log(
            logging.INFO if took >= 1 else logging.DEBUG,
            "dedup index of topic %s rebuilt: %d ids in %.1f s",
            self.name,
            len(self._dedup),
            took,
        )

    async def _read_ids(self, partition: Partition, since: int) -> None:
        # Up to the log end, visible or not: an id written but not yet committed (or
        # refused after its append) must not be appended twice by a retry (PROTOCOL §7).
        offset = await partition.log_offset_for_timestamp(since)
        end = partition.log_end_offset
        while offset < end:
            records = await partition.read_log(offset, _REBUILD_RECORDS, _REBUILD_BYTES)
            if not records:
                break
            for record in records:
                if record.producer_id is not None:
                    self._dedup.add(
                        record.producer_id, partition.partition, record.offset, record.timestamp
                    )
            offset = records[-1].offset + 1

    async def rebuild_dedup(self, partition: int) -> None:
        """Re-read the last dedup window of ``partition`` up to its log end (a node that
        becomes its leader: ids that arrived by replication are deduplicated from now
        on). Await it before letting publishes with ids through to the partition."""
        if not 0 <= partition < len(self.partitions):
            raise PartitionNotFound(f"partition {partition} of topic {self.name!r}")
        await self._read_ids(
            self.partitions[partition], self._wall_ms() - self.config.dedup_window_ms
        )
        self._dedup.expire(self._wall_ms())

    def forget_dedup_from(self, partition: int, offset: int) -> int:
        """A replica truncated ``partition`` at ``offset``: forget the ids whose records
        were cut (a retry appends them again). Returns how many were forgotten."""
        return self._dedup.forget(partition, offset)

    # --- partition choice -----------------------------------------------------------

    def choose_partition(self, key: str | None) -> int | None:
        """PROTOCOL §1: the same key always lands on the same partition."""
        if key is None:
            return None
        return crc32c.crc32c(key.encode()) % len(self.partitions)

    def _spread_partition(self) -> int:
        # Keyless records of one batch share a partition (one append, one fsync); batches
        # rotate so that load spreads over the partitions.
        partition = self._next_spread % len(self.partitions)
        self._next_spread = partition + 1
        return partition

    # --- publish ---------------------------------------------------------------------

    async def publish(self, items: Sequence[PublishItem], acks: Acks) -> list[PublishResult]:
        """Append ``items``, skipping producer ids already published within the window.

        Results come back in request order. Raises StorageUnavailable if an append fails;
        records of other partitions of the batch may have been written (and are then
        registered for dedup, so a retry by the producer does not duplicate them).
        """
        await self._check_publishable(items)
        plan = self._plan(items)
        # Shielded: once records are handed to the writer they may land even if this
        # request is cancelled, so the bookkeeping (dedup, promises, counters) must still
        # run to completion. close() waits for these appends.
        if len(plan.groups) == 1 and not self._replicated(plan.groups):
            await asyncio.shield(self._submit_group(items, plan, acks))
        elif plan.groups:
            task = asyncio.ensure_future(
                self._append_groups(items, plan.groups, acks, plan.owned, plan.results)
            )
            self._appends.add(task)
            task.add_done_callback(self._append_done)
            await asyncio.shield(task)
        await self._settle_racing(plan, items, acks)
        if plan.originals and acks is Acks.ALL:
            # The first publish of an id may have been acks=1 (or is still unsynced after a
            # restart): a duplicate answered at acks=all promises that it is on disk too
            # (replicated: committed, on every ISR member's disk).
            await asyncio.gather(
                *(self._make_durable(p, end, acks) for p, end in sorted(plan.originals.items()))
            )
        return plan.answers(len(items))

    async def _check_publishable(self, items: Sequence[PublishItem]) -> None:
        """The topic is open, its dedup index ready for the ids in ``items``, and every
        explicit partition exists: checked before any producer id is claimed."""
        if self._closed:
            raise TopicNotFound(f"topic {self.name!r} does not exist")
        if (self._rebuilding is not None or self._rebuild_error is not None) and any(
            item.record.producer_id is not None for item in items
        ):
            await self.dedup_ready()
            if self._closed:
                raise TopicNotFound(f"topic {self.name!r} does not exist")
        for item in items:
            if item.partition is not None and not 0 <= item.partition < len(self.partitions):
                raise PartitionNotFound(f"partition {item.partition} of topic {self.name!r}")

    def _plan(self, items: Sequence[PublishItem]) -> _PublishPlan:
        """Answer the duplicates already known, claim the new producer ids and group the
        rest by partition. Nothing is awaited: the claims are made in one step."""
        now = self._wall_ms()
        self._dedup.expire(now)
        plan = _PublishPlan([None] * len(items))
        first_in_batch: dict[str, int] = {}  # producer id -> index of its first item here
        spread: int | None = None
        for index, item in enumerate(items):
            producer_id = item.record.producer_id
            if producer_id is not None:
                if producer_id in first_in_batch:
                    plan.repeats.append((index, first_in_batch[producer_id]))
                    continue
                first_in_batch[producer_id] = index
                if not self._claim(plan, index, producer_id, now):
                    continue
            partition = self._partition_for(item)
            if partition is None:
                if spread is None:
                    spread = self._spread_partition()
                partition = spread
            plan.groups.setdefault(partition, []).append(index)
        return plan

    def _claim(self, plan: _PublishPlan, index: int, producer_id: str, now: int) -> bool:
        """True if this publish appends the item with ``producer_id``; otherwise it is a
        duplicate (answered now) or waits for the publish in flight with the same id."""
        entry = self._dedup.lookup(producer_id, now)
        if entry is not None:
            plan.results[index] = PublishResult(entry.partition, entry.offset, True)
            _note_original(plan.originals, entry.partition, entry.offset)
            return False
        landing = self._pending.get(producer_id)
        if landing is not None:
            plan.racing.append((index, landing))
            return False
        landing = asyncio.get_running_loop().create_future()
        self._pending[producer_id] = landing
        plan.owned[producer_id] = landing
        return True

    async def _settle_racing(
        self, plan: _PublishPlan, items: Sequence[PublishItem], acks: Acks
    ) -> None:
        """Answer the items another publish was appending: with where it landed, or by
        appending them here if that append failed."""
        retry: list[int] = []
        for index, landing in plan.racing:
            landed = await landing
            if landed is None:
                retry.append(index)  # the racing append failed: this publish appends it
            else:
                plan.results[index] = PublishResult(landed[0], landed[1], True)
                _note_original(plan.originals, landed[0], landed[1])
        if retry:
            again = await self.publish([items[i] for i in retry], acks)
            for index, result in zip(retry, again, strict=True):
                plan.results[index] = result

    async def _make_durable(self, partition: int, end: int, acks: Acks) -> None:
        target = self.partitions[partition]
        if target.replicated:
            await target.wait_commit(min(end, target.log_end_offset), acks)
        else:
            await target.flush()

    def _partition_for(self, item: PublishItem) -> int | None:
        if item.partition is not None:
            return item.partition
        return self.choose_partition(item.record.key)

    def _replicated(self, groups: dict[int, list[int]]) -> bool:
        return any(self.partitions[p].hooks is not None for p in groups)

    def _submit_group(
        self, items: Sequence[PublishItem], plan: _PublishPlan, acks: Acks
    ) -> asyncio.Future[tuple[int, int]]:
        """The common publish (one partition, not replicated) without a task of its own:
        the records go to the writer now, and the bookkeeping runs as the writer's
        future's first callback, before the publish resumes (one loop turn and a task's
        cost less per publish)."""
        ((partition, indexes),) = plan.groups.items()
        records = [items[i].record for i in indexes]
        try:
            future = self.partitions[partition].submit_local(records, acks)
        except BaseException:
            self._release(plan.owned)
            raise
        self._appends.add(future)
        future.add_done_callback(
            lambda f: self._submitted_done(f, partition, indexes, records, plan)
        )
        return future

    def _submitted_done(
        self,
        future: asyncio.Future[tuple[int, int]],
        partition: int,
        indexes: list[int],
        records: list[NewRecord],
        plan: _PublishPlan,
    ) -> None:
        self._appends.discard(future)
        try:
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                first_offset, timestamp = future.result()
            elif isinstance(error, WrittenNotSynced):  # in the log all the same
                first_offset, timestamp = error.first_offset, error.timestamp
            else:
                return
            self._landed(
                partition, indexes, records, first_offset, timestamp, plan.owned, plan.results
            )
        finally:
            self._release(plan.owned)

    def _release(self, owned: dict[str, _Landing]) -> None:
        """The producer ids this publish claimed are settled: waiters on one that did not
        land retry it themselves."""
        for producer_id, landing in owned.items():
            if not landing.done():
                landing.set_result(None)
            if self._pending.get(producer_id) is landing:
                del self._pending[producer_id]

    async def _append_groups(
        self,
        items: Sequence[PublishItem],
        groups: dict[int, list[int]],
        acks: Acks,
        owned: dict[str, _Landing],
        results: list[PublishResult | None],
    ) -> None:
        try:
            if len(groups) == 1:  # the common case: no gather, no task per partition
                ((partition, indexes),) = groups.items()
                outcomes: list[BaseException | None] = [None]
                await self._append_group(partition, indexes, items, acks, owned, results)
            else:
                # gather, not a TaskGroup: one failing partition must not cancel appends
                # that are already with other writers; each one that lands is recorded
                # for dedup.
                outcomes = await asyncio.gather(
                    *(
                        self._append_group(p, indexes, items, acks, owned, results)
                        for p, indexes in groups.items()
                    ),
                    return_exceptions=True,
                )
        finally:
            self._release(owned)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _append_group(
        self,
        partition: int,
        indexes: list[int],
        items: Sequence[PublishItem],
        acks: Acks,
        owned: dict[str, _Landing],
        results: list[PublishResult | None],
    ) -> None:
        records = [items[i].record for i in indexes]
        target = self.partitions[partition]
        hooks = target.hooks  # those the append runs under, if replicated
        # Replicated, the commit is awaited after the bookkeeping below: records whose
        # commit fails are in the log all the same, and a retry must find their ids. So
        # must records written whose fsync failed.
        try:
            first_offset, timestamp = await target.append_local(records, acks)
        except WrittenNotSynced as exc:
            self._landed(
                partition, indexes, records, exc.first_offset, exc.timestamp, owned, results
            )
            raise
        self._landed(partition, indexes, records, first_offset, timestamp, owned, results)
        if hooks is not None:
            await hooks.wait_commit(first_offset + len(records), acks)

    def _landed(
        self,
        partition: int,
        indexes: list[int],
        records: list[NewRecord],
        first_offset: int,
        timestamp: int,
        owned: dict[str, _Landing],
        results: list[PublishResult | None],
    ) -> None:
        """The bookkeeping of records written to the log: results, dedup, counters."""
        size = 0
        for delta, (index, record) in enumerate(zip(indexes, records, strict=True)):
            offset = first_offset + delta
            results[index] = _publish_result(partition, offset, False)
            if record.producer_id is not None:
                self._dedup.add(record.producer_id, partition, offset, timestamp)
                owned[record.producer_id].set_result((partition, offset))
            if record.key is None and not record.headers:
                size += len(record.value)  # message_size of the common record
            else:
                size += message_size(record.value, record.key, record.headers)
        self.bytes_total += size
        self.messages_total += len(records)

    def _append_done(self, task: asyncio.Task[None]) -> None:
        self._appends.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the awaiting publish (if any) re-raises it

    def expire_dedup(self) -> int:
        """Forget ids whose window has passed (publish does this too; this is for idle topics)."""
        return self._dedup.expire(self._wall_ms())

    async def close(self) -> None:
        """Let in-flight appends finish, then close the partitions."""
        self._closed = True
        if (rebuilding := self._rebuilding) is not None:
            rebuilding.cancel()
            await asyncio.gather(rebuilding, return_exceptions=True)
        while self._appends:
            await asyncio.gather(*self._appends, return_exceptions=True)
        errors = await asyncio.gather(*(p.close() for p in self.partitions), return_exceptions=True)
        for error in errors:
            if isinstance(error, BaseException):
                raise error


def _note_original(originals: dict[int, int], partition: int, offset: int) -> None:
    if originals.get(partition, 0) <= offset:
        originals[partition] = offset + 1
