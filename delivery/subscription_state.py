"""The state of one subscription's delivery, and what is read from it.

:class:`SubscriptionState` holds everything the sans-I/O core (delivery/core.py) keeps
for a subscription — a cursor per partition, the in-flight table, the redelivery,
refetch and delay queues, the key gate, the counters — with the queries on it (PROTOCOL
§5 stats, the console's pause reason, the durable cursor snapshot) and the small
bookkeeping every transition shares (releasing a key, forgetting a record's last error,
the room credit and max_in_flight leave). The transitions themselves are the core's,
in one module (STYLE principle 6). No asyncio, no I/O; time comes in as ``now``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from delivery.backoff import jittered_backoff_ms
from delivery.config import DeliveryMode, SubscriptionConfig
from delivery.credit import Consumers
from delivery.cursor import PartitionState
from delivery.delay import DelayQueue
from delivery.events import DeadLetter, PauseReason
from delivery.inflight import InFlightTable
from delivery.ordering import KeyGate, Ref
from delivery.redelivery import RedeliveryQueue, RedeliveryRef
from herald.protocol.filter import Matcher, compile_filter, parse
from herald.protocol.stats import PartitionStats, SubscriptionStats
from storage.cursors import CursorSnapshot
from storage.record import Record

# Delayed records one subscription keeps as refs, waiting for their deliver_at: the
# look-ahead of PROTOCOL §8 delayed delivery. Past it, a partition's first deliveries wait
# at the next delayed record (still in the log) until one of those held comes due.
MAX_DELAYED = 10_000
_NO_DELAYS = 2**63  # a wall clock past every deliver_at: nothing waits


class SubscriptionState:
    """Delivery state of one subscription. Not thread-safe; owned by the event loop."""

    # Slotted: 33 fields are more than the 30 an instance dict shares its keys for, so
    # each state had a dict of its own sized for 64 (1.6 KiB); every tail has a state
    # (issue 27 §3: memory per tail).
    __slots__ = (
        "_at_most_once", "_buffered", "_dead_letters", "_deadline_s", "_delayed",
        "_dl_pending", "_gate", "_in_flight", "_last_error", "_match", "_max_delayed",
        "_max_deliveries", "_max_in_flight", "_now", "_part_rr", "_parts", "_prior",
        "_rand", "_reading", "_redelivery", "_refetch_wait", "_refetched", "_refetching",
        "_wall_ms", "acked_total", "config", "consumers", "dead_lettered_total",
        "delivered_total", "dirty", "expired_total", "filtered_total", "redelivered_total",
    )  # fmt: skip

    def __init__(
        self,
        config: SubscriptionConfig,
        cursor: CursorSnapshot,
        *,
        rand: Callable[[], float] = random.random,
        wall_ms: Callable[[], int] | None = None,
        max_delayed: int = MAX_DELAYED,
    ) -> None:
        """``wall_ms``: the wall clock (ms since the epoch) that deliver_at is compared
        with; None sends delayed records at once (an ephemeral tail: PROTOCOL §8 delays
        first sends to subscriptions only)."""
        self.config = config
        self._rand = rand
        self._wall_ms = wall_ms
        self._max_delayed = max_delayed
        self._delayed = DelayQueue()  # PROTOCOL §8: waiting for their deliver_at
        self._now = 0.0  # the clock at the last tick or pump: deliver_at -> a wake-up time
        self._at_most_once = config.delivery is DeliveryMode.AT_MOST_ONCE
        self._deadline_s = config.ack_deadline_ms / 1000
        self._max_in_flight = config.max_in_flight
        self._max_deliveries = config.max_deliveries  # 0: never dead-letter
        # At-most-once has nothing in flight, so per-key ordering has nothing to hold.
        self._gate = KeyGate() if config.ordered_by_key and not self._at_most_once else None
        self._parts = {p: PartitionState(p, c) for p, c in sorted(cursor.partitions.items())}
        # Sends made before a restart (PROTOCOL §3: attempt counts survive a graceful
        # restart); consumed when the record is sent again.
        self._prior: dict[Ref, int] = {
            (p, o): n
            for (p, o), n in cursor.attempts.items()
            if n > 0 and p in self._parts and not self._parts[p].is_done(o)
        }
        self.consumers = Consumers()
        self._in_flight = InFlightTable()
        self._redelivery = RedeliveryQueue()  # waiting out a backoff or nack delay
        # Due, to be re-read; and re-read: (record, prior, epoch). None while empty: an
        # empty deque holds 760 bytes, and most subscriptions (every tail) seldom redeliver
        # (issue 27 §3: memory per tail).
        self._refetch_wait: deque[RedeliveryRef] | None = None
        self._refetched: deque[tuple[Record, int, int]] | None = None
        self._buffered = 0  # records in partition buffers
        self._reading = 0  # records asked for by ReadRequests still out
        self._refetching = 0  # refs in RefetchRequests still out
        self._dead_letters: list[DeadLetter] = []
        # PROTOCOL §8: what went wrong last with a record that left flight unacked, until
        # it is acked, dead-lettered or dropped (as many entries as records waiting).
        self._last_error: dict[Ref, str] = {}
        self._dl_pending: dict[tuple[int, int, int], int] = {}  # (p, o, epoch) -> deliveries
        self._part_rr = 0
        self.dirty = False  # cursor changed since the last snapshot
        self.delivered_total = 0
        self.redelivered_total = 0
        self.acked_total = 0
        self.dead_lettered_total = 0
        self.expired_total = 0
        self.filtered_total = 0
        self._match = _matcher(config)

    def reconfigure(self, config: SubscriptionConfig) -> None:
        """PROTOCOL §8 change in place (the fields PATCH may change): from now on sends get
        the new deadline, room is the new max_in_flight, and give-backs use the new
        max_deliveries and backoff. Records in flight keep the deadline they were sent with."""
        assert config.delivery is self.config.delivery
        assert config.ordered_by_key == self.config.ordered_by_key
        deadline_s = config.ack_deadline_ms / 1000
        if deadline_s < self._deadline_s:
            # New sends would expire before older ones: the table's send order is no longer
            # its deadline order.
            self._in_flight.unorder()
        self.config = config
        self._deadline_s = deadline_s
        self._max_in_flight = config.max_in_flight
        self._max_deliveries = config.max_deliveries
        self._match = _matcher(config)  # compiled once per change, not per record

    # ------------------------------------------------------------------ observation

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def partitions(self) -> list[int]:
        return list(self._parts)

    def in_flight_of(self, consumer: str) -> int:
        """Records in flight to one consumer (read-only, for the console)."""
        return sum(1 for entry in self._in_flight if entry.consumer == consumer)

    def ack_floor(self, partition: int) -> int:
        return self._parts[partition].ack_floor

    def stats(self) -> SubscriptionStats:
        """PROTOCOL §5 stats."""
        return SubscriptionStats(
            backlog=sum(state.backlog() for state in self._parts.values()),
            in_flight=len(self._in_flight),
            consumers=len(self.consumers),
            delivered_total=self.delivered_total,
            redelivered_total=self.redelivered_total,
            acked_total=self.acked_total,
            dead_lettered_total=self.dead_lettered_total,
            expired_total=self.expired_total,
            filtered_total=self.filtered_total,
            delayed=len(self._delayed),
            partitions=tuple(PartitionStats(p, s.ack_floor) for p, s in self._parts.items()),
        )

    def pause_reason(self) -> PauseReason:
        """Why nothing is being sent right now, for the console."""
        ready = (
            self._refetched
            or self._buffered
            or self._refetch_wait
            or any(state.has_unread() for state in self._parts.values())
        )
        if ready:
            if not self._at_most_once and len(self._in_flight) >= self._max_in_flight:
                return PauseReason.MAX_IN_FLIGHT
            if self.consumers.total_credit <= 0:
                return PauseReason.NO_CREDIT
            return PauseReason.NONE
        # Records in flight: the subscription is delivering (waiting for acks), whatever
        # waits out a retry delay beside them.
        if len(self._redelivery) and not self._in_flight:
            return PauseReason.BACKOFF
        if self._delayed and not self._in_flight:
            return PauseReason.DELAYED
        return PauseReason.NONE

    @property
    def delayed(self) -> int:
        """Records read from the log and waiting for their deliver_at (PROTOCOL §8)."""
        return len(self._delayed)

    @property
    def scans_without_credit(self) -> bool:
        """A filter skips records whether or not a consumer is attached (PROTOCOL §8): an
        append is worth a step even with no credit anywhere."""
        return self._match is not None

    # ------------------------------------------------------------------ the durable cursor

    def snapshot(self, *, with_attempts: bool = False) -> CursorSnapshot:
        """The durable cursor. Attempt counts only need to survive a graceful restart
        (PROTOCOL §3), so periodic flushes leave them out and stop() includes them."""
        partitions = {p: state.snapshot() for p, state in self._parts.items()}
        self.dirty = False
        if not with_attempts:
            return CursorSnapshot(partitions, {})
        attempts: dict[Ref, int] = dict(self._prior)
        for entry in self._in_flight:
            attempts[(entry.record.partition, entry.record.offset)] = entry.attempt
        current = {p: state.epoch for p, state in self._parts.items()}
        for ref in [*self._redelivery.refs(), *(self._refetch_wait or ()), *self._delayed.refs()]:
            if current.get(ref.partition) == ref.epoch and ref.prior:
                attempts[(ref.partition, ref.offset)] = ref.prior
        for record, prior, epoch in self._refetched or ():
            if current.get(record.partition) == epoch and prior:
                attempts[(record.partition, record.offset)] = prior
        for (p, o, epoch), n in self._dl_pending.items():
            if current.get(p) == epoch:
                attempts[(p, o)] = n
        return CursorSnapshot(
            partitions,
            {ref: n for ref, n in attempts.items() if not self._parts[ref[0]].is_done(ref[1])},
        )

    # ------------------------------------------------------------------ shared bookkeeping

    def _wall_now(self) -> int:
        """The wall clock for deliver_at; with delays off (a tail) every record is due."""
        return _NO_DELAYS if self._wall_ms is None else self._wall_ms()

    def _room(self) -> int:
        # PROTOCOL §3 Rules: a record is sent only while the consumer has credit and the
        # subscription's in-flight count is under max_in_flight.
        credit = self.consumers.total_credit
        if self._at_most_once:
            return credit
        return min(credit, self._max_in_flight - len(self._in_flight))

    def _backoff_s(self, attempt: int) -> float:
        """The jittered delay before the redelivery that follows ``attempt``."""
        backoff = self.config.retry_backoff
        return jittered_backoff_ms(attempt, backoff.min_ms, backoff.max_ms, self._rand) / 1000

    def _forget_error(self, partition: int, offset: int) -> None:
        if self._last_error:
            self._last_error.pop((partition, offset), None)

    def _filter_out(self, record: Record) -> None:
        self._parts[record.partition].mark_done(record.offset)
        self._forget_error(record.partition, record.offset)
        self.filtered_total += 1
        self.dirty = True

    def _release_key(self, key: str, ref: Ref) -> None:
        gate = self._gate
        assert gate is not None
        following = gate.release(key, ref)
        while following is not None:
            state = self._parts[following[0]]
            if not state.is_done(following[1]):
                self._enqueue_promoted(following, key)
                return
            following = gate.release(key, following)

    def _release_record_key(self, record: Record) -> None:
        if self._gate is not None and record.key is not None:
            self._release_key(record.key, (record.partition, record.offset))

    def _release_ref_key(self, ref: RedeliveryRef) -> None:
        if self._gate is not None and ref.key is not None:
            self._release_key(ref.key, (ref.partition, ref.offset))

    def _enqueue_promoted(self, ref: Ref, key: str) -> None:
        """A record that waited for its key holds it now; it is re-read from the log."""
        partition, offset = ref
        prior = self._prior.pop(ref, 0) if self._prior else 0
        epoch = self._parts[partition].epoch
        self._queue_refetch(RedeliveryRef(partition, offset, prior, epoch, key))

    def _queue_refetch(self, ref: RedeliveryRef) -> None:
        """``ref`` is due: take_reads re-reads it from the log."""
        if self._refetch_wait is None:
            self._refetch_wait = deque()
        self._refetch_wait.append(ref)


def _matcher(config: SubscriptionConfig) -> Matcher | None:
    """The subscription's filter, compiled (PROTOCOL §8); None matches everything."""
    return None if config.filter is None else compile_filter(parse(config.filter))
