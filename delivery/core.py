"""The sans-I/O delivery core of one subscription: every state transition lives here.

Plain methods in, decisions out (python-websockets `protocol.py`, h11 `_state.py`): no
asyncio, no sockets, no files. Time comes in as ``now`` (seconds of a monotonic clock)
and the jitter source is injected. The async engine (delivery/engine.py) feeds it
records it asked for, calls it on acks/credit/timers, and carries out what it decides:

- ``pump(now)``: deliveries to hand to consumer sinks, within credit and max_in_flight;
- ``take_reads()``: log reads it needs (first deliveries by range, redeliveries by offset);
- ``take_dead_letters()``: records to dead-letter (report back with ``dead_letter_done``);
- ``next_wakeup()``: when the nearest deadline, backoff or delayed record's deliver_at
  comes.

It keeps no backlog in memory: only records in flight (≤ max_in_flight), a bounded read
buffer, and small refs for records waiting for redelivery, for their key, or for their
deliver_at (PROTOCOL §8 delayed delivery; at most MAX_DELAYED of those).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from delivery.backoff import jittered_backoff_ms
from delivery.config import DeliveryMode, SubscriptionConfig
from delivery.credit import Consumers
from delivery.cursor import PartitionState
from delivery.dead_letter import ACK_DEADLINE, BEFORE_RESTART, DISCONNECT, NACKED
from delivery.delay import DelayQueue
from delivery.events import DeadLetter, Delivery, PauseReason, ReadRequest, RefetchRequest
from delivery.inflight import InFlight, InFlightTable
from delivery.ordering import KeyGate, Ref
from delivery.redelivery import RedeliveryQueue, RedeliveryRef
from herald.protocol.filter import Matcher, compile_filter, parse
from herald.protocol.stats import PartitionStats, SubscriptionStats
from storage.cursors import CursorSnapshot
from storage.record import Record, slot_constructor

READ_BATCH = 1000  # most records one ReadRequest asks for
# Delayed records one subscription keeps as refs, waiting for their deliver_at: the
# look-ahead of PROTOCOL §8 delayed delivery. Past it, a partition's first deliveries wait
# at the next delayed record (still in the log) until one of those held comes due.
MAX_DELAYED = 10_000
DEAD_LETTER_RETRY_S = 1.0  # a failed dead-letter publish is tried again after this
_delivery = slot_constructor(Delivery)  # per sent record: skips the frozen __init__


class SubscriptionCore:
    """Delivery state of one subscription. Not thread-safe; owned by the event loop."""

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
        self._refetch_wait: deque[RedeliveryRef] = deque()  # due, to be re-read
        self._refetched: deque[tuple[Record, int, int]] = deque()  # re-read: (record, prior, epoch)
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

    # ------------------------------------------------------------------ consumers

    def attach(self, consumer: str, credit: int) -> None:
        self.consumers.attach(consumer, credit)

    def detach(self, consumer: str, now: float) -> None:
        """PROTOCOL §3: a consumer that leaves gives its in-flight records back at once,
        without waiting for the deadline or the backoff; the next send is the next attempt."""
        if not self.consumers.detach(consumer):
            return
        given_back = self._in_flight.remove_where(lambda e: e.consumer == consumer)
        given_back.sort(key=lambda e: (e.record.partition, e.record.offset))
        for entry in given_back:
            self._give_back(entry, now, 0.0, DISCONNECT)

    def release(self, consumer: str) -> None:
        """The consumer leaves but its in-flight records stay in flight, to be acked,
        nacked or expired like any other (PROTOCOL §8 pull: the records a response
        carried)."""
        self.consumers.detach(consumer)

    def grant_credit(self, consumer: str, n: int) -> None:
        # PROTOCOL §3: credit adds up, capped at 1,000,000 outstanding.
        self.consumers.grant(consumer, n)

    # ------------------------------------------------------------------ consumer verdicts

    def ack(self, ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Acks from any consumer of the subscription apply (PROTOCOL §3). Returns
        (ok, unknown); unknown = not in flight (acked, dead-lettered, dropped, never sent).
        Acks never give credit back."""
        ok: list[str] = []
        unknown: list[str] = []
        pop = self._in_flight.pop
        parts = self._parts
        gate = self._gate
        for id in ids:
            entry = pop(id)
            if entry is None:
                unknown.append(id)
                continue
            record = entry.record
            parts[record.partition].mark_done(record.offset)
            if self._last_error:
                self._last_error.pop((record.partition, record.offset), None)
            if gate is not None and record.key is not None:
                self._release_key(record.key, (record.partition, record.offset))
            ok.append(id)
        if ok:
            self.acked_total += len(ok)
            self.dirty = True
        return ok, unknown

    def nack(
        self, ids: Iterable[str], delay_ms: int | None, now: float, reason: str | None = None
    ) -> None:
        """Redeliver after ``delay_ms``, else after the backoff; unknown ids are ignored.
        ``reason`` is what a dead letter of these records will say went wrong (PROTOCOL §8)."""
        delay = None if delay_ms is None else delay_ms / 1000
        error = NACKED if reason is None else reason
        entries = [e for e in map(self._in_flight.pop, ids) if e is not None]
        if delay is None and len(entries) > 1:
            # PROTOCOL §8: records that failed together (a webhook batch) are retried
            # together: one jittered backoff for the group, not one each.
            delay = self._backoff_s(max(e.attempt for e in entries))
        # ... and in offset order within a partition: the redelivery queue keeps the order
        # of scheduling for records due at the same time.
        entries.sort(key=lambda e: (e.record.partition, e.record.offset))
        for entry in entries:
            self._give_back(entry, now, delay, error)

    def extend(self, ids: Iterable[str], ms: int, now: float) -> None:
        """The ack deadline becomes now + ms (PROTOCOL §3 `extend`); unknown ids ignored."""
        deadline = now + ms / 1000
        for id in ids:
            self._in_flight.extend(id, deadline)

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Expire deadlines and release records whose backoff is over or whose
        deliver_at has come."""
        self._now = now
        if self._delayed and self._wall_ms is not None:
            for ref in self._delayed.pop_due(self._wall_ms()):
                state = self._parts.get(ref.partition)
                if state is None or state.epoch != ref.epoch:
                    continue  # a seek dropped it
                if state.is_done(ref.offset):
                    self._release_ref_key(ref)
                    continue
                self._refetch_wait.append(ref)
        for entry in self._in_flight.pop_expired(now):
            self._give_back(entry, now, None, ACK_DEADLINE)
        for ref in self._redelivery.pop_ready(now):
            state = self._parts.get(ref.partition)
            if state is None or state.epoch != ref.epoch:
                continue  # a seek dropped it, and released its key then
            if state.is_done(ref.offset):
                self._release_ref_key(ref)  # expired by retention meanwhile
                self._forget_error(ref.partition, ref.offset)
                continue
            self._refetch_wait.append(ref)

    def next_wakeup(self) -> float | None:
        times = [self._in_flight.next_deadline(), self._redelivery.next_ready()]
        due = self._delayed.next_due()
        if due is not None and self._wall_ms is not None:
            times.append(self._now + max(0, due - self._wall_ms()) / 1000)
        return min((t for t in times if t is not None), default=None)

    # ------------------------------------------------------------------ the log

    def set_end(self, partition: int, end_offset: int) -> None:
        state = self._parts.get(partition)
        if state is not None and end_offset > state.end_offset:
            state.end_offset = end_offset

    def set_start(self, partition: int, start_offset: int) -> None:
        """PROTOCOL §1 Retention: a cursor behind the log start skips forward and counts
        the skipped records in expired_total."""
        state = self._parts.get(partition)
        if state is None:
            return
        if start_offset <= state.ack_floor:
            state.start_offset = max(state.start_offset, start_offset)
            return
        expired, dropped = state.expire_below(start_offset)
        self._buffered -= dropped
        self.expired_total += expired
        self.dirty = True

        def gone(record: Record) -> bool:
            return record.partition == partition and record.offset < start_offset

        for entry in self._in_flight.remove_where(lambda e: gone(e.record)):
            self._release_record_key(entry.record)
        if self._last_error:
            self._last_error = {
                ref: error
                for ref, error in self._last_error.items()
                if ref[0] != partition or ref[1] >= start_offset
            }
        kept: deque[tuple[Record, int, int]] = deque()
        for item in self._refetched:
            if gone(item[0]):
                self._release_record_key(item[0])
            else:
                kept.append(item)
        self._refetched = kept
        if self._delayed:
            # Delayed records may wait for days: free their room now.
            for ref in self._delayed.remove_where(
                lambda r: r.partition == partition and r.offset < start_offset
            ):
                self._release_ref_key(ref)
        # Refs waiting for backoff, refetch or their key are checked when they come due.

    def take_reads(self) -> list[ReadRequest | RefetchRequest]:
        """The reads needed to fill the room that credit and max_in_flight leave.
        Every request must be answered with feed/feed_refetch or read_failed/refetch_failed."""
        room = self._room() - len(self._refetched) - self._refetching  # sends still possible
        want = room - self._buffered - self._reading  # records to read for them
        if self._match is None and (room <= 0 or want <= 0):
            return []
        requests: list[ReadRequest | RefetchRequest] = []
        if self._refetch_wait and want > 0:
            taken = self._take_refetches(want, requests)
            room -= taken
            want -= taken
        if self._match is not None:
            # PROTOCOL §8: records the filter drops are acked unsent and take no room,
            # whether or not a consumer is attached (so `backlog` counts only matching
            # records), and a consumer with little credit must not cost a log read per
            # record scanned: a filtered subscription reads a batch ahead. The buffer
            # keeps only matching records (feed drops the rest) and stays bounded
            # (READ_BATCH, or the room when that is larger).
            want = max(want, READ_BATCH - self._buffered - self._reading)
        if want > 0:
            self._take_range_reads(want, requests)
        return requests

    def feed(self, request: ReadRequest, records: Sequence[Record]) -> None:
        """The answer to a ReadRequest: records from ``request.offset`` on (maybe fewer)."""
        self._reading -= request.max_records
        state = self._parts.get(request.partition)
        if state is None or state.epoch != request.epoch:
            return  # a seek made it stale
        state.reading = False
        if not records:
            return
        first = records[0].offset
        if first > state.fetch_offset and first > state.ack_floor:
            # The log starts past what we asked for: retention removed the gap.
            self.set_start(request.partition, first)
        fetch = state.fetch_offset
        buffer = state.buffer
        before = len(buffer)
        match = self._match
        for record in records:
            if record.offset >= fetch:
                fetch = record.offset + 1
                if match is not None and not match(record) and not state.is_done(record.offset):
                    # PROTOCOL §8: acked unsent as soon as it is read, consumer or not.
                    self._filter_out(record)
                    if self._prior:
                        self._prior.pop((record.partition, record.offset), None)
                    continue
                buffer.append(record)
        state.fetch_offset = fetch
        if fetch > state.end_offset:
            state.end_offset = fetch
        self._buffered += len(buffer) - before

    def read_failed(self, request: ReadRequest) -> None:
        self._reading -= request.max_records
        state = self._parts.get(request.partition)
        if state is not None and state.epoch == request.epoch:
            state.reading = False

    def feed_refetch(self, request: RefetchRequest, records: Sequence[Record]) -> None:
        """The answer to a RefetchRequest. A requested offset missing from ``records`` is
        gone from the log (retention): it counts as expired."""
        self._refetching -= len(request.refs)
        state = self._parts.get(request.partition)
        if state is None or state.epoch != request.epoch:
            return
        by_offset = {record.offset: record for record in records}
        for ref in request.refs:
            record = by_offset.get(ref.offset)
            if record is None or state.is_done(ref.offset):
                if state.mark_done(ref.offset):
                    self.expired_total += 1
                    self.dirty = True
                self._release_ref_key(ref)
                self._forget_error(ref.partition, ref.offset)
                continue
            self._refetched.append((record, ref.prior, ref.epoch))

    def refetch_failed(self, request: RefetchRequest, now: float) -> None:
        self._refetching -= len(request.refs)
        for ref in request.refs:
            self._redelivery.schedule(now + DEAD_LETTER_RETRY_S, ref)

    # ------------------------------------------------------------------ sending

    def pump(self, now: float) -> list[tuple[str, list[Delivery]]]:
        """Hand out what credit and max_in_flight allow (PROTOCOL §3 Rules): redeliveries
        first (they are older), then first deliveries, each partition in offset order."""
        self._now = now
        room = self._room()
        if room <= 0:
            return []
        picked: list[tuple[Record, int]] = []
        refetched = self._refetched
        max_deliveries = self._max_deliveries
        match = self._match
        wall_now = self._wall_now()
        while refetched and len(picked) < room:
            record, prior, epoch = refetched.popleft()
            if match is not None and not match(record):
                # The filter changed (PATCH) since its first send: acked unsent now.
                self._filter_out(record)
                self._release_record_key(record)
                continue
            deliver_at = record.deliver_at
            if deliver_at is not None and deliver_at > wall_now:
                # A delayed record that waited for its key: it holds the key now, and
                # waits for its deliver_at (PROTOCOL §8).
                ref = RedeliveryRef(record.partition, record.offset, prior, epoch, record.key)
                self._delayed.schedule(deliver_at, ref)
                continue
            if max_deliveries and prior >= max_deliveries:
                self._dead_letter(record, prior, epoch)
                continue
            picked.append((record, prior + 1))
        if len(picked) < room and self._buffered:
            self._pick_first_deliveries(picked, room, wall_now)
        if not picked:
            return []
        return self._send(picked, now)

    def take_dead_letters(self) -> list[DeadLetter]:
        out, self._dead_letters = self._dead_letters, []
        return out

    def dead_letter_done(self, dead_letter: DeadLetter) -> None:
        """The dead letter was published (or dropped, with no dead-letter topic)."""
        record = dead_letter.record
        if self._dl_pending.pop((record.partition, record.offset, dead_letter.epoch), None) is None:
            return
        self.dead_lettered_total += 1
        self._forget_error(record.partition, record.offset)
        state = self._parts.get(record.partition)
        if state is None or state.epoch != dead_letter.epoch:
            return
        state.mark_done(record.offset)
        self.dirty = True
        self._release_record_key(record)

    def dead_letter_failed(self, dead_letter: DeadLetter, now: float) -> None:
        """Publishing failed: try again later (the record is dead-lettered again when due,
        since its deliveries already reach max_deliveries)."""
        record = dead_letter.record
        if self._dl_pending.pop((record.partition, record.offset, dead_letter.epoch), None) is None:
            return
        ref = RedeliveryRef(
            record.partition, record.offset, dead_letter.deliveries, dead_letter.epoch, record.key
        )
        self._redelivery.schedule(now + DEAD_LETTER_RETRY_S, ref)

    # ------------------------------------------------------------------ seek / snapshot

    def seek(self, offsets: Mapping[int, int]) -> None:
        """PROTOCOL §2 seek: replay the named partitions from these offsets. Their in-flight
        records leave flight (a later ack is unknown) and restart at attempt 1; partitions
        not named are untouched."""
        targets = {p: o for p, o in offsets.items() if p in self._parts}
        if not targets:
            return
        for p, offset in targets.items():
            self._buffered -= self._parts[p].reset(offset)
        self._in_flight.remove_where(lambda e: e.record.partition in targets)
        self._refetch_wait = deque(r for r in self._refetch_wait if r.partition not in targets)
        self._refetched = deque(i for i in self._refetched if i[0].partition not in targets)
        self._prior = {ref: n for ref, n in self._prior.items() if ref[0] not in targets}
        self._last_error = {r: e for r, e in self._last_error.items() if r[0] not in targets}
        self._delayed.remove_where(lambda r: r.partition in targets)
        # Refs in the redelivery heap and pending dead letters carry the old epoch.
        if self._gate is not None:
            for key, ref in self._gate.drop_partitions(targets):
                self._enqueue_promoted(ref, key)
        self.dirty = True

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
        for ref in [*self._redelivery.refs(), *self._refetch_wait, *self._delayed.refs()]:
            if current.get(ref.partition) == ref.epoch and ref.prior:
                attempts[(ref.partition, ref.offset)] = ref.prior
        for record, prior, epoch in self._refetched:
            if current.get(record.partition) == epoch and prior:
                attempts[(record.partition, record.offset)] = prior
        for (p, o, epoch), n in self._dl_pending.items():
            if current.get(p) == epoch:
                attempts[(p, o)] = n
        return CursorSnapshot(
            partitions,
            {ref: n for ref, n in attempts.items() if not self._parts[ref[0]].is_done(ref[1])},
        )

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

    # ------------------------------------------------------------------ internals

    def _wall_now(self) -> int:
        """The wall clock for deliver_at; with delays off (a tail) every record is due."""
        return _NO_DELAYS if self._wall_ms is None else self._wall_ms()

    @property
    def scans_without_credit(self) -> bool:
        """A filter skips records whether or not a consumer is attached (PROTOCOL §8): an
        append is worth a step even with no credit anywhere."""
        return self._match is not None

    def _room(self) -> int:
        # PROTOCOL §3 Rules: a record is sent only while the consumer has credit and the
        # subscription's in-flight count is under max_in_flight.
        credit = self.consumers.total_credit
        if self._at_most_once:
            return credit
        return min(credit, self._max_in_flight - len(self._in_flight))

    def _give_back(self, entry: InFlight, now: float, delay_s: float | None, error: str) -> None:
        """An in-flight record left flight unacked because of ``error``: dead-letter it if
        it had its max_deliveries, else schedule its redelivery (PROTOCOL §2 retry_backoff)."""
        record = entry.record
        state = self._parts[record.partition]
        self._last_error[(record.partition, record.offset)] = error
        if self._max_deliveries and entry.attempt >= self._max_deliveries:
            self._dead_letter(record, entry.attempt, state.epoch)
            return
        ref = RedeliveryRef(record.partition, record.offset, entry.attempt, state.epoch, record.key)
        if delay_s is None:
            delay_s = self._backoff_s(entry.attempt)
        if delay_s <= 0:
            self._refetch_wait.append(ref)
        else:
            self._redelivery.schedule(now + delay_s, ref)

    def _backoff_s(self, attempt: int) -> float:
        """The jittered delay before the redelivery that follows ``attempt``."""
        backoff = self.config.retry_backoff
        return jittered_backoff_ms(attempt, backoff.min_ms, backoff.max_ms, self._rand) / 1000

    def _dead_letter(self, record: Record, deliveries: int, epoch: int) -> None:
        # The key stays held until the dead letter is published: order is kept.
        self._dl_pending[(record.partition, record.offset, epoch)] = deliveries
        error = self._last_error.get((record.partition, record.offset), BEFORE_RESTART)
        self._dead_letters.append(DeadLetter(record, deliveries, epoch=epoch, last_error=error))

    def _filter_out(self, record: Record) -> None:
        self._parts[record.partition].mark_done(record.offset)
        self._forget_error(record.partition, record.offset)
        self.filtered_total += 1
        self.dirty = True

    def _forget_error(self, partition: int, offset: int) -> None:
        if self._last_error:
            self._last_error.pop((partition, offset), None)

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
        self._refetch_wait.append(RedeliveryRef(partition, offset, prior, epoch, key))

    def _take_refetches(self, room: int, requests: list[ReadRequest | RefetchRequest]) -> int:
        by_partition: dict[int, list[RedeliveryRef]] = {}
        taken = 0
        wait = self._refetch_wait
        while wait and taken < room:
            ref = wait.popleft()
            state = self._parts.get(ref.partition)
            if state is None or state.epoch != ref.epoch:
                continue
            if state.is_done(ref.offset):
                self._release_ref_key(ref)
                self._forget_error(ref.partition, ref.offset)
                continue
            by_partition.setdefault(ref.partition, []).append(ref)
            taken += 1
        for partition, refs in by_partition.items():
            refs.sort(key=lambda r: r.offset)
            epoch = self._parts[partition].epoch
            requests.append(RefetchRequest(partition, tuple(refs), epoch))
        self._refetching += taken
        return taken

    def _take_range_reads(self, room: int, requests: list[ReadRequest | RefetchRequest]) -> None:
        candidates = [s for s in self._parts.values() if not s.reading and s.has_unread()]
        if not candidates:
            return
        start = self._part_rr % len(candidates)
        self._part_rr += 1
        candidates = candidates[start:] + candidates[:start]
        share = max(1, min(READ_BATCH, -(-room // len(candidates))))
        for state in candidates:
            if room <= 0:
                break
            n = min(share, room)
            state.reading = True
            self._reading += n
            room -= n
            requests.append(ReadRequest(state.partition, state.fetch_offset, n, state.epoch))

    def _pick_first_deliveries(
        self, picked: list[tuple[Record, int]], room: int, wall_now: int
    ) -> None:
        """Take first deliveries from the partition buffers, round-robin across
        partitions; within a partition in offset order (PROTOCOL §3 Rules). A record
        whose deliver_at is after ``wall_now`` is set aside as a ref (PROTOCOL §8)."""
        parts = [s for s in self._parts.values() if s.buffer]
        if not parts:
            return
        start = self._part_rr % len(parts)
        parts = parts[start:] + parts[:start]
        gate = self._gate
        prior_of = self._prior
        max_deliveries = self._max_deliveries
        match = self._match
        delayed = self._delayed
        want = room - len(picked)
        consumed = 0
        while want > 0 and parts:
            share = -(-want // len(parts))
            still = []
            for state in parts:
                buffer = state.buffer
                p = state.partition
                done = state.done
                limit = min(share, want)
                taken = 0
                stalled = False
                while buffer and taken < limit:
                    record = buffer.popleft()
                    consumed += 1
                    offset = record.offset
                    if offset < state.ack_floor or (done and offset in done):
                        continue  # acked before a restart
                    if match is not None and not match(record):
                        # PROTOCOL §8: acked without being sent, never dead-lettered.
                        self._filter_out(record)
                        if prior_of:
                            prior_of.pop((p, offset), None)
                        continue
                    key = record.key
                    deliver_at = record.deliver_at
                    if deliver_at is not None and deliver_at > wall_now:
                        # PROTOCOL §8: not sent before deliver_at; later records of other
                        # keys go on, later records of its key wait behind it.
                        if len(delayed) >= self._max_delayed:
                            buffer.appendleft(record)  # no room: wait here, in the log
                            consumed -= 1
                            stalled = True
                            break
                        if (
                            gate is not None
                            and key is not None
                            and not gate.try_take(key, (p, offset))
                        ):
                            continue  # waits behind its key; its delay is checked again
                        prior = prior_of.pop((p, offset), 0) if prior_of else 0
                        delayed.schedule(
                            deliver_at, RedeliveryRef(p, offset, prior, state.epoch, key)
                        )
                        continue
                    if gate is not None and key is not None and not gate.try_take(key, (p, offset)):
                        continue  # waits, as a ref, behind its key (PROTOCOL §2)
                    prior = prior_of.pop((p, offset), 0) if prior_of else 0
                    if prior and max_deliveries and prior >= max_deliveries:
                        self._dead_letter(record, prior, state.epoch)
                        continue
                    picked.append((record, prior + 1))
                    taken += 1
                want -= taken
                if buffer and not stalled:
                    still.append(state)
                if want <= 0:
                    break
            parts = still
        self._buffered -= consumed

    def _send(
        self, picked: list[tuple[Record, int]], now: float
    ) -> list[tuple[str, list[Delivery]]]:
        out: list[tuple[str, list[Delivery]]] = []
        redelivered = 0
        index = 0
        parts = self._parts
        if self._at_most_once:
            # PROTOCOL §2: at-most-once counts as acked when sent.
            for consumer, n in self.consumers.split(len(picked)):
                deliveries = []
                for record, attempt in picked[index : index + n]:
                    parts[record.partition].mark_done(record.offset)
                    deliveries.append(_delivery(record, attempt))
                    if attempt > 1:
                        redelivered += 1
                index += n
                out.append((consumer.id, deliveries))
            self.acked_total += index
            self.dirty = True
        else:
            deadline = now + self._deadline_s
            add = self._in_flight.add
            for consumer, n in self.consumers.split(len(picked)):
                cid = consumer.id
                deliveries = []
                for record, attempt in picked[index : index + n]:
                    add(InFlight(record.id, record, cid, attempt, deadline))
                    deliveries.append(_delivery(record, attempt))
                    if attempt > 1:
                        redelivered += 1
                index += n
                out.append((cid, deliveries))
        assert index == len(picked), "room never exceeds the total credit"
        self.delivered_total += index
        self.redelivered_total += redelivered
        return out


_NO_DELAYS = 2**63  # a wall clock past every deliver_at: nothing waits


def _matcher(config: SubscriptionConfig) -> Matcher | None:
    """The subscription's filter, compiled (PROTOCOL §8); None matches everything."""
    return None if config.filter is None else compile_filter(parse(config.filter))
