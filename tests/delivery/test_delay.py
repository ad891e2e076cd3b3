"""PROTOCOL §8 delayed delivery in the sans-I/O core: a record is first sent no earlier
than its deliver_at, without holding other keys; under ordered_by_key it holds its own."""

from __future__ import annotations

from delivery.config import SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import PauseReason

from .harness import Harness


def config(**kw) -> SubscriptionConfig:
    kw.setdefault("topic", "t")
    return SubscriptionConfig(**kw)


def test_a_delayed_record_is_sent_at_its_deliver_at_and_not_before():
    h = Harness(delays=True)
    h.publish(delay_ms=5000)
    h.publish(n=2)
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-1", "0-2"]  # the records behind it are not held
    assert h.core.stats().delayed == 1
    assert h.core.next_wakeup() == h.now + 5.0
    h.advance(4.999)
    assert h.ids("c1") == ["0-1", "0-2"]
    h.advance(0.001)
    assert h.attempts("c1")[-1] == ("0-0", 1)
    assert h.core.stats().delayed == 0


def test_a_record_whose_deliver_at_has_passed_goes_at_once():
    h = Harness(delays=True)
    h.publish(delay_ms=1000)
    h.now += 2
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-0"]


def test_backlog_counts_a_delayed_record_and_the_ack_floor_waits_for_it():
    h = Harness(delays=True)
    h.publish(delay_ms=60_000)
    h.publish(n=3)
    h.attach("c1", credit=10)
    h.ack_all("c1")
    stats = h.core.stats()
    assert (stats.backlog, stats.delayed, h.core.ack_floor(0)) == (1, 1, 0)


def test_ordered_by_key_holds_later_records_of_its_key_only():
    h = Harness(config=config(ordered_by_key=True), delays=True)
    h.publish(key="a", delay_ms=3000)
    h.publish(key="a")
    h.publish(key="b")
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-2"]
    h.advance(3)
    assert h.ids("c1") == ["0-2", "0-0"]
    h.ack("0-0")
    assert h.ids("c1") == ["0-2", "0-0", "0-1"]


def test_a_delayed_record_behind_its_key_waits_for_the_key_then_for_its_deliver_at():
    h = Harness(config=config(ordered_by_key=True), delays=True)
    h.publish(key="a")
    h.publish(key="a", delay_ms=10_000)
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-0"]
    h.advance(1)
    h.ack("0-0")  # the key passes to 0-1, which still waits 9 s
    assert h.ids("c1") == ["0-0"]
    assert h.core.stats().delayed == 1
    h.advance(9)
    assert h.ids("c1") == ["0-0", "0-1"]


def test_without_ordering_records_of_the_same_key_are_not_held():
    h = Harness(delays=True)
    h.publish(key="a", delay_ms=3000)
    h.publish(key="a")
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-1"]


def test_a_nacked_delayed_record_is_redelivered_after_its_backoff_as_usual():
    h = Harness(delays=True)
    h.publish(delay_ms=2000)
    h.attach("c1", credit=10)
    h.advance(2)
    h.nack("0-0", delay_ms=500)
    h.advance(0.5)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]


def test_the_look_ahead_is_bounded_and_reading_resumes_as_records_come_due():
    h = Harness(delays=True, max_delayed=2)
    h.publish(delay_ms=1000)
    h.publish(delay_ms=2000)
    h.publish(delay_ms=3000)  # no room: the partition waits here, the record in the log
    h.publish(n=1)
    h.attach("c1", credit=10)
    assert h.ids("c1") == []
    assert h.core.stats().delayed == 2
    h.advance(1)
    # 0-0 is due; 0-2 now has room and the plain record behind it goes.
    assert h.ids("c1") == ["0-0", "0-3"]
    assert h.core.stats().delayed == 2
    h.advance(2)
    assert h.ids("c1") == ["0-0", "0-3", "0-1", "0-2"]


def test_the_pause_reason_says_delayed_when_only_delayed_records_wait():
    h = Harness(delays=True)
    h.publish(delay_ms=5000)
    h.publish()
    h.attach("c1", credit=10)
    assert h.core.pause_reason() is PauseReason.NONE  # 0-1 in flight
    h.ack("0-1")
    assert h.core.pause_reason() is PauseReason.DELAYED


def test_a_seek_drops_delayed_records():
    h = Harness(delays=True)
    h.publish(delay_ms=60_000)
    h.attach("c1", credit=10)
    assert h.core.stats().delayed == 1
    h.core.seek({0: 1})
    assert h.core.stats().delayed == 0


def test_a_restarted_core_delays_the_record_again():
    h = Harness(delays=True)
    h.publish(delay_ms=5000)
    h.publish()
    h.attach("c1", credit=10)
    h.ack_all("c1")
    snapshot = h.core.snapshot(with_attempts=True)
    again = Harness(delays=True, cursor=snapshot)
    again.now = h.now + 1
    again.log = h.log
    again.core.set_end(0, 2)
    again.attach("c2", credit=10)
    assert again.ids("c2") == []
    assert again.core.stats().delayed == 1
    again.advance(4)
    assert again.attempts("c2") == [("0-0", 1)]


def test_a_core_without_a_wall_clock_sends_delayed_records_at_once():
    h = Harness(delays=False)  # an ephemeral tail: reads and tails as usual
    h.publish(delay_ms=60_000)
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-0"]


def test_next_wakeup_is_none_without_a_wall_clock_or_anything_waiting():
    core = SubscriptionCore(config(), Harness().core.snapshot())
    assert core.next_wakeup() is None
