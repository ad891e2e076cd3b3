"""Random credits, acks, nacks, extends, detaches and time: the core's invariants hold
(PROTOCOL §2 max_in_flight/ordered_by_key, §3 credit rules) and every record ends up
acked or dead-lettered."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delivery.config import Backoff, DeliveryMode, SubscriptionConfig

from .harness import Harness

KEYS = st.sampled_from(["a", "b", "c", None])
CONSUMERS = st.sampled_from(["c1", "c2", "c3"])


class CoreMachine(RuleBasedStateMachine):
    @initialize(
        max_in_flight=st.integers(1, 6),
        max_deliveries=st.integers(0, 3),
        ordered=st.booleans(),
        at_most_once=st.booleans(),
        partitions=st.integers(1, 3),
    )
    def setup(self, max_in_flight, max_deliveries, ordered, at_most_once, partitions):
        config = SubscriptionConfig(
            topic="t",
            max_in_flight=max_in_flight,
            max_deliveries=max_deliveries,
            ordered_by_key=ordered,
            delivery=DeliveryMode.AT_MOST_ONCE if at_most_once else DeliveryMode.AT_LEAST_ONCE,
            ack_deadline_ms=1000,
            retry_backoff=Backoff(100, 400),
        )
        self.h = Harness(config, partitions=partitions, jitter=0.5)
        self.partitions = partitions
        self.ordered = ordered
        self.at_most_once = at_most_once
        self.granted: dict[str, int] = defaultdict(int)  # effective credit granted
        self.attached: set[str] = set()
        self.seen_sends = 0
        self.last_attempt: dict[str, int] = {}
        self.finished: set[str] = set()  # acked or dead-lettered
        self.first_sent: dict[int, int] = defaultdict(lambda: -1)

    # -- rules ----------------------------------------------------------------------

    @rule(partition=st.integers(0, 2), n=st.integers(1, 4), key=KEYS)
    def publish(self, partition, n, key):
        partition %= self.partitions
        if key is not None:
            partition = {"a": 0, "b": 1, "c": 2}[key] % self.partitions  # same key, same partition
        self.h.publish(partition, n=n, key=key)
        self.h.step()
        self.check_sends()

    @rule(consumer=CONSUMERS, credit=st.integers(0, 5))
    def attach(self, consumer, credit):
        if consumer in self.attached:
            return
        self.attached.add(consumer)
        self.granted[consumer] += credit
        self.h.attach(consumer, credit)
        self.check_sends()

    @rule(consumer=CONSUMERS, n=st.integers(1, 5))
    def grant(self, consumer, n):
        if consumer in self.attached:
            self.granted[consumer] += n
        self.h.credit(consumer, n)
        self.check_sends()

    @rule(consumer=CONSUMERS)
    def detach(self, consumer):
        self.attached.discard(consumer)
        self.h.core.detach(consumer, self.h.now)
        self.h.step()
        self.check_sends()

    @rule(data=st.data())
    def ack(self, data):
        ids = self.outstanding()
        chosen = data.draw(st.lists(st.sampled_from(ids), max_size=4)) if ids else []
        ok, unknown = self.h.core.ack([*chosen, "9-999"])
        assert "9-999" in unknown
        self.finished.update(ok)
        self.h.step()
        self.check_sends()

    @rule(data=st.data(), delay=st.one_of(st.none(), st.integers(0, 300)))
    def nack(self, data, delay):
        ids = self.outstanding()
        if ids:
            self.h.nack(*data.draw(st.lists(st.sampled_from(ids), max_size=3)), delay_ms=delay)
        self.check_sends()

    @rule(data=st.data(), ms=st.integers(100, 2000))
    def extend(self, data, ms):
        ids = self.outstanding()
        if ids:
            self.h.core.extend(
                data.draw(st.lists(st.sampled_from(ids), max_size=3)), ms, self.h.now
            )
            self.h.step()
        self.check_sends()

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.5, 1.0, 3.0]))
    def advance(self, seconds):
        self.h.advance(seconds)
        self.check_sends()

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def never_more_in_flight_than_max_in_flight(self):
        if hasattr(self, "h"):
            assert self.h.core.in_flight <= self.h.config.max_in_flight

    @invariant()
    def never_more_sent_than_credit(self):
        if hasattr(self, "h"):
            for consumer, received in self.h.received.items():
                assert len(received) <= self.granted[consumer]

    def outstanding(self) -> list[str]:
        """Ids whose latest send is unacked, as a consumer sees them."""
        latest = {}
        for _, batch in self.h.sends:
            for d in batch:
                latest[d.record.id] = d
        return sorted(i for i in latest if i not in self.finished)

    def check_sends(self):
        """Check the sends made since the last check."""
        new = self.h.sends[self.seen_sends :]
        self.seen_sends = len(self.h.sends)
        for _, batch in new:
            for d in batch:
                rid = d.record.id
                assert rid not in self.finished, rid  # never sent after its ack or dead letter
                previous = self.last_attempt.get(rid, 0)
                assert d.attempt == previous + 1  # every send counts (PROTOCOL §3)
                self.last_attempt[rid] = d.attempt
                if self.at_most_once:
                    self.finished.add(rid)
                if d.attempt == 1 and not self.ordered:
                    # PROTOCOL §3: first deliveries leave each partition in offset order.
                    assert d.record.offset > self.first_sent[d.record.partition]
                    self.first_sent[d.record.partition] = d.record.offset
        for dead in self.h.dead:
            self.finished.add(dead.record.id)
        if self.ordered and not self.at_most_once:
            self.check_key_order()

    def check_key_order(self):
        # PROTOCOL §2 ordered_by_key: per key, one record at a time, in offset order.
        active: dict[str, list[int]] = defaultdict(list)
        for rid in self.last_attempt:
            if rid in self.finished:
                continue
            p, o = map(int, rid.split("-"))
            record = self.h.log[p][o]
            if record.key is not None:
                active[record.key].append(o)
        for key, offsets in active.items():
            assert len(offsets) == 1, (key, offsets)
            partition = {"a": 0, "b": 1, "c": 2}[key] % self.partitions
            earlier = [r for r in self.h.log[partition][: offsets[0]] if r.key == key]
            assert all(r.id in self.finished for r in earlier), key

    def teardown(self):
        if not hasattr(self, "h"):
            return
        # Drain: one consumer with ample credit acks everything it gets.
        h = self.h
        h.attach("drain", 10_000)
        for _ in range(200):
            self.check_sends()
            ids = self.outstanding()
            if ids:
                ok, _ = h.core.ack(ids)
                self.finished.update(ok)
                h.step()
                self.check_sends()
            h.advance(1.0)
            self.check_sends()
            if h.core.stats().backlog == 0:
                break
        everything = {r.id for records in h.log.values() for r in records}
        assert everything <= self.finished, sorted(everything - self.finished)
        assert h.core.stats().backlog == 0
        for p, records in h.log.items():
            assert h.core.ack_floor(p) == len(records)


CoreMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase
