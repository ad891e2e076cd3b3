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
deliver_at (PROTOCOL §8 delayed delivery; at most MAX_DELAYED of those). That state,
its queries (stats, the durable snapshot) and the bookkeeping the transitions share are
:class:`delivery.subscription_state.SubscriptionState`, which the core extends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from delivery.cursor import PartitionState
from delivery.dead_letter import ACK_DEADLINE, BEFORE_RESTART, DISCONNECT, NACKED
from delivery.events import DeadLetter, Delivery, ReadRequest, RefetchRequest
from delivery.inflight import InFlight
from delivery.redelivery import RedeliveryRef
from delivery.subscription_state import SubscriptionState
from storage.record import Record, slot_constructor

READ_BATCH = 1000  # most records one ReadRequest asks for
DEAD_LETTER_RETRY_S = 1.0  # a failed dead-letter publish is tried again after this
_delivery = slot_constructor(Delivery)  # per sent record: skips the frozen __init__
_T = TypeVar("_T")


def _kept(items: Iterable[_T]) -> deque[_T] | None:
    """``items`` as a queue, None if there are none (the core's queues are None while
    empty: delivery/subscription_state.py)."""
    queue = deque(items)
    return queue if queue else None


class SubscriptionCore(SubscriptionState):
    """Every state transition of one subscription's delivery (plain methods in,
    decisions out); the state and its queries are :class:`SubscriptionState`'s."""

    __slots__ = ()

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
                self._queue_refetch(ref)
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
            self._queue_refetch(ref)

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
        for item in self._refetched or ():
            if gone(item[0]):
                self._release_record_key(item[0])
            else:
                kept.append(item)
        self._refetched = kept or None
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
        room = self._room() - len(self._refetched or ()) - self._refetching  # sends possible
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
        if buffer is None:
            buffer = state.buffer = deque()
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
        if not buffer:
            state.buffer = None

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
            if self._refetched is None:
                self._refetched = deque()
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
        if refetched is not None and not refetched:
            self._refetched = None
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

    # ------------------------------------------------------------------ seek

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
        self._refetch_wait = _kept(
            r for r in self._refetch_wait or () if r.partition not in targets
        )
        self._refetched = _kept(i for i in self._refetched or () if i[0].partition not in targets)
        self._prior = {ref: n for ref, n in self._prior.items() if ref[0] not in targets}
        self._last_error = {r: e for r, e in self._last_error.items() if r[0] not in targets}
        self._delayed.remove_where(lambda r: r.partition in targets)
        # Refs in the redelivery heap and pending dead letters carry the old epoch.
        if self._gate is not None:
            for key, ref in self._gate.drop_partitions(targets):
                self._enqueue_promoted(ref, key)
        self.dirty = True

    # ------------------------------------------------------------------ internals

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
            self._queue_refetch(ref)
        else:
            self._redelivery.schedule(now + delay_s, ref)

    def _dead_letter(self, record: Record, deliveries: int, epoch: int) -> None:
        # The key stays held until the dead letter is published: order is kept.
        self._dl_pending[(record.partition, record.offset, epoch)] = deliveries
        error = self._last_error.get((record.partition, record.offset), BEFORE_RESTART)
        self._dead_letters.append(DeadLetter(record, deliveries, epoch=epoch, last_error=error))

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
        if not wait:
            self._refetch_wait = None
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
        want = room - len(picked)
        consumed = 0
        while want > 0 and parts:
            share = -(-want // len(parts))
            still = []
            for state in parts:
                taken, used, stalled = self._take_from(state, min(share, want), wall_now, picked)
                consumed += used
                want -= taken
                if state.buffer and not stalled:
                    still.append(state)
                if want <= 0:
                    break
            parts = still
        self._buffered -= consumed

    def _take_from(
        self, state: PartitionState, limit: int, wall_now: int, picked: list[tuple[Record, int]]
    ) -> tuple[int, int, bool]:
        """Up to ``limit`` first deliveries from one partition's buffer, in offset order:
        (taken, records consumed from the buffer, stalled: a delayed record found the
        delayed set full and waits at the head of the buffer)."""
        buffer = state.buffer
        assert buffer is not None  # only partitions with buffered records are asked
        p = state.partition
        done = state.done
        gate = self._gate
        prior_of = self._prior
        max_deliveries = self._max_deliveries
        match = self._match
        taken = consumed = 0
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
            deliver_at = record.deliver_at
            if deliver_at is not None and deliver_at > wall_now:
                if not self._hold_delayed(record, deliver_at, state):
                    buffer.appendleft(record)  # no room: wait here, in the log
                    return taken, consumed - 1, True
                continue
            key = record.key
            if gate is not None and key is not None and not gate.try_take(key, (p, offset)):
                continue  # waits, as a ref, behind its key (PROTOCOL §2)
            prior = prior_of.pop((p, offset), 0) if prior_of else 0
            if prior and max_deliveries and prior >= max_deliveries:
                self._dead_letter(record, prior, state.epoch)
                continue
            picked.append((record, prior + 1))
            taken += 1
        if not buffer:
            state.buffer = None
        return taken, consumed, False

    def _hold_delayed(self, record: Record, deliver_at: int, state: PartitionState) -> bool:
        """PROTOCOL §8: a record is not sent before ``deliver_at``; it is set aside as a ref,
        later records of other keys go on, later records of its key wait behind it. False
        when the delayed set is full: the record waits in the log."""
        if len(self._delayed) >= self._max_delayed:
            return False
        p, offset, key = state.partition, record.offset, record.key
        gate = self._gate
        if gate is not None and key is not None and not gate.try_take(key, (p, offset)):
            return True  # waits behind its key; its delay is checked again
        prior = self._prior.pop((p, offset), 0) if self._prior else 0
        self._delayed.schedule(deliver_at, RedeliveryRef(p, offset, prior, state.epoch, key))
        return True

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
