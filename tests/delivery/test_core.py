"""Behaviour of the sans-I/O delivery core, one behaviour per test (PROTOCOL §2, §3, §5)."""

from __future__ import annotations

import tracemalloc

from delivery.config import Backoff, DeliveryMode, SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import PauseReason, ReadRequest
from storage.cursors import CursorSnapshot, PartitionCursor

from .harness import Harness


def config(**kw) -> SubscriptionConfig:
    kw.setdefault("topic", "t")
    return SubscriptionConfig(**kw)


# -- credit and flow control --------------------------------------------------------


def test_nothing_is_sent_without_credit():
    h = Harness()
    h.publish(n=5)
    h.attach("c1", credit=0)
    assert h.sends == []
    assert h.core.pause_reason() is PauseReason.NO_CREDIT


def test_credit_is_never_exceeded():
    h = Harness()
    h.publish(n=10)
    h.attach("c1", credit=3)
    assert h.ids("c1") == ["0-0", "0-1", "0-2"]
    h.ack_all("c1")
    assert len(h.received["c1"]) == 3  # acks do not give credit back


def test_credit_adds_up():
    h = Harness()
    h.publish(n=10)
    h.attach("c1", credit=2)
    h.credit("c1", 3)
    assert len(h.received["c1"]) == 5


def test_outstanding_credit_is_capped_at_one_million():
    h = Harness()
    h.attach("c1", credit=2_000_000)
    assert h.core.consumers.credit_of("c1") == 1_000_000
    h.credit("c1", 5)
    assert h.core.consumers.credit_of("c1") == 1_000_000


def test_records_published_later_are_pushed_to_waiting_credit():
    h = Harness()
    h.attach("c1", credit=5)
    h.publish(n=2)
    h.step()
    assert h.ids("c1") == ["0-0", "0-1"]


def test_max_in_flight_bounds_unacked_records_across_consumers():
    h = Harness(config(max_in_flight=3))
    h.publish(n=10)
    h.attach("c1", credit=10)
    h.attach("c2", credit=10)
    assert h.core.in_flight == 3
    assert h.core.pause_reason() is PauseReason.MAX_IN_FLIGHT
    h.ack(h.ids("c1")[0])
    assert h.core.in_flight == 3
    assert len(h.received["c1"]) + len(h.received["c2"]) == 4


def test_records_are_spread_over_consumers_with_credit():
    h = Harness()
    h.attach("c1", credit=100)
    h.attach("c2", credit=100)
    h.publish(n=10)
    h.step()
    assert len(h.received["c1"]) == 5
    assert len(h.received["c2"]) == 5


def test_single_records_alternate_between_consumers():
    h = Harness()
    h.attach("c1", credit=100)
    h.attach("c2", credit=100)
    for _ in range(4):
        h.publish(n=1)
        h.step()
    assert len(h.received["c1"]) == 2
    assert len(h.received["c2"]) == 2


def test_a_consumer_without_credit_gets_nothing():
    h = Harness()
    h.attach("c1", credit=0)
    h.attach("c2", credit=100)
    h.publish(n=10)
    h.step()
    assert h.received["c1"] == []
    assert len(h.received["c2"]) == 10


def test_first_deliveries_leave_each_partition_in_offset_order():
    h = Harness(partitions=3)
    h.attach("c1", credit=7)
    h.attach("c2", credit=3)
    for _ in range(5):
        for p in range(3):
            h.publish(p, n=2)
    h.step()
    h.credit("c1", 100)
    sent = [d.record for _, batch in h.sends for d in batch]
    assert len(sent) == 30
    for p in range(3):
        offsets = [r.offset for r in sent if r.partition == p]
        assert offsets == sorted(offsets) == list(range(10))


def test_the_core_reads_only_what_it_can_send():
    h = Harness(config(max_in_flight=5))
    h.publish(n=1000)
    h.attach("c1", credit=1000)
    reads = [r for r in h.reads if isinstance(r, ReadRequest)]
    assert sum(r.max_records for r in reads) == 5


def test_nothing_is_read_without_credit():
    h = Harness()
    h.publish(n=100)
    h.attach("c1", credit=0)
    assert h.reads == []


# -- acks ---------------------------------------------------------------------------


def test_ack_moves_the_ack_floor_and_reports_unknown_ids():
    h = Harness()
    h.publish(n=3)
    h.attach("c1", credit=3)
    ok, unknown = h.ack("0-0", "0-1", "0-7", "junk")
    assert ok == ["0-0", "0-1"]
    assert unknown == ["0-7", "junk"]
    assert h.core.ack_floor(0) == 2


def test_ack_of_an_already_acked_record_is_unknown():
    h = Harness()
    h.publish(n=1)
    h.attach("c1", credit=1)
    h.ack("0-0")
    assert h.ack("0-0") == ([], ["0-0"])


def test_ack_floor_waits_for_the_gap_below_it():
    h = Harness()
    h.publish(n=3)
    h.attach("c1", credit=3)
    h.ack("0-1", "0-2")
    assert h.core.ack_floor(0) == 0
    h.ack("0-0")
    assert h.core.ack_floor(0) == 3


def test_acks_from_another_consumer_apply():
    h = Harness()
    h.attach("c1", credit=1)
    h.attach("c2", credit=0)
    h.publish(n=1)
    h.step()
    assert h.core.ack(["0-0"]) == (["0-0"], [])


# -- redelivery ---------------------------------------------------------------------


def test_unacked_record_is_redelivered_after_deadline_with_attempt_2():
    h = Harness(config(ack_deadline_ms=1000, retry_backoff=Backoff(100, 1000)))
    h.publish(n=1)
    h.attach("c1", credit=2)
    h.advance(0.999)
    assert h.attempts("c1") == [("0-0", 1)]
    h.advance(0.001)  # deadline passed: waits out the first backoff (100 ms)
    h.advance(0.099)
    assert h.attempts("c1") == [("0-0", 1)]
    h.advance(0.001)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]
    assert h.core.stats().redelivered_total == 1


def test_backoff_doubles_between_redeliveries():
    h = Harness(config(ack_deadline_ms=1000, retry_backoff=Backoff(100, 10_000), max_deliveries=0))
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.advance(0.1)
    h.nack("0-0")
    h.advance(0.199)
    assert len(h.received["c1"]) == 2
    h.advance(0.002)
    assert h.attempts("c1")[-1] == ("0-0", 3)


def test_nack_delay_overrides_backoff():
    h = Harness(config(retry_backoff=Backoff(10_000, 60_000)))
    h.publish(n=1)
    h.attach("c1", credit=2)
    h.nack("0-0", delay_ms=50)
    h.advance(0.05)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]


def test_nack_with_zero_delay_redelivers_at_once():
    h = Harness()
    h.publish(n=1)
    h.attach("c1", credit=2)
    h.nack("0-0", delay_ms=0)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]


def test_nack_of_unknown_ids_is_ignored():
    h = Harness()
    h.attach("c1", credit=2)
    h.nack("0-5", "x")
    assert h.sends == []


def test_waiting_for_backoff_is_reported_as_paused_by_backoff():
    h = Harness(config(retry_backoff=Backoff(1000, 1000)))
    h.publish(n=1)
    h.attach("c1", credit=5)
    h.nack("0-0")
    assert h.core.pause_reason() is PauseReason.BACKOFF


def test_a_nacked_record_beside_records_in_flight_is_not_a_pause():
    h = Harness(config(retry_backoff=Backoff(1000, 1000)))
    h.publish(n=2)
    h.attach("c1", credit=2)
    h.nack("0-0")  # waits out its backoff; 0-1 is still in flight
    assert h.core.pause_reason() is PauseReason.NONE
    h.ack("0-1")
    assert h.core.pause_reason() is PauseReason.BACKOFF


def test_extend_moves_deadline():
    h = Harness(config(ack_deadline_ms=1000, retry_backoff=Backoff(1, 1)))
    h.publish(n=1)
    h.attach("c1", credit=5)
    h.advance(0.5)
    h.core.extend(["0-0"], 5000, h.now)
    h.advance(4.999)
    assert len(h.received["c1"]) == 1
    h.advance(0.002)  # expired; then 1 ms of backoff
    h.advance(0.001)
    assert h.attempts("c1")[-1] == ("0-0", 2)


def test_extend_can_shorten_the_deadline():
    h = Harness(config(ack_deadline_ms=30_000, retry_backoff=Backoff(1, 1)))
    h.publish(n=1)
    h.attach("c1", credit=5)
    h.core.extend(["0-0"], 100, h.now)
    h.advance(0.1)  # expired; then 1 ms of backoff
    h.advance(0.002)
    assert h.attempts("c1")[-1] == ("0-0", 2)


def test_acked_record_is_never_redelivered():
    h = Harness(config(ack_deadline_ms=1000))
    h.publish(n=1)
    h.attach("c1", credit=5)
    h.ack("0-0")
    h.advance(100)
    assert len(h.received["c1"]) == 1


def test_redeliveries_go_before_first_deliveries():
    h = Harness(config(retry_backoff=Backoff(10, 10)))
    h.publish(n=3)
    h.attach("c1", credit=1)
    h.nack("0-0")
    h.advance(0.01)
    h.credit("c1", 1)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]


def test_next_wakeup_is_the_nearest_deadline():
    h = Harness(config(ack_deadline_ms=2000))
    h.publish(n=1)
    h.attach("c1", credit=1)
    assert h.core.next_wakeup() == h.now + 2.0


# -- dead letters -------------------------------------------------------------------


def test_dead_letter_after_max_deliveries():
    h = Harness(config(max_deliveries=2, retry_backoff=Backoff(10, 10)))
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.advance(0.01)
    h.nack("0-0")
    h.advance(10)
    assert h.attempts("c1") == [("0-0", 1), ("0-0", 2)]
    assert [(d.record.id, d.deliveries, d.reason.value) for d in h.dead] == [
        ("0-0", 2, "max_deliveries")
    ]
    stats = h.core.stats()
    assert stats.dead_lettered_total == 1
    assert stats.backlog == 0
    assert h.core.ack_floor(0) == 1


def test_dead_letter_carries_whatever_went_wrong_last():
    """PROTOCOL §8: the nack's reason, "nack", "ack deadline" or "disconnect": the last."""
    h = Harness(config(max_deliveries=2, ack_deadline_ms=1000, retry_backoff=Backoff(10, 10)))
    h.publish(n=3)
    h.attach("c1", credit=10)
    h.nack("0-0", reason="bad payload")
    h.nack("0-1")
    h.nack("0-2", reason="first")
    h.advance(0.01)
    assert h.attempts("c1")[-3:] == [("0-0", 2), ("0-1", 2), ("0-2", 2)]
    h.nack("0-0")  # a bare nack after a reason: "nack"
    h.nack("0-1", reason="schema")  # a reason after a bare nack: the reason
    h.advance(1.0)  # 0-2's deadline passes: "ack deadline", not "first"
    h.publish(n=1)
    h.step()
    h.nack("0-3", reason="y")
    h.advance(0.01)
    h.core.detach("c1", h.now)  # 0-3, on its last delivery, goes back: "disconnect"
    h.step()
    assert {d.record.id: d.last_error for d in h.dead} == {
        "0-0": "nack",
        "0-1": "schema",
        "0-2": "ack deadline",
        "0-3": "disconnect",
    }
    assert h.core._last_error == {}, "nothing is remembered past the dead letter"


def test_expired_deadline_of_last_delivery_dead_letters_without_backoff():
    h = Harness(
        config(max_deliveries=1, ack_deadline_ms=1000, retry_backoff=Backoff(60_000, 60_000))
    )
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.advance(1.0)
    assert [d.record.id for d in h.dead] == ["0-0"]


def test_max_deliveries_zero_never_dead_letters():
    h = Harness(config(max_deliveries=0))
    h.publish(n=1)
    h.attach("c1", credit=100)
    for _ in range(20):
        h.nack("0-0", delay_ms=0)
    assert h.dead == []
    assert h.attempts("c1")[-1] == ("0-0", 21)


def test_dead_lettered_record_is_not_acked_until_published():
    h = Harness(config(max_deliveries=1), auto_dead_letter=False)
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    assert h.core.ack_floor(0) == 0
    h.core.dead_letter_done(h.dead[0])
    assert h.core.ack_floor(0) == 1


def test_failed_dead_letter_publish_is_retried():
    h = Harness(config(max_deliveries=1), auto_dead_letter=False)
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.core.dead_letter_failed(h.dead[0], h.now)
    h.advance(1.0)
    assert len(h.dead) == 2
    assert h.dead[1].deliveries == 1
    assert len(h.received["c1"]) == 1  # never sent to a consumer again


def test_ack_of_a_dead_lettered_record_is_unknown():
    h = Harness(config(max_deliveries=1))
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    assert h.ack("0-0") == ([], ["0-0"])


# -- detach -------------------------------------------------------------------------


def test_detach_returns_in_flight_at_once():
    h = Harness(config(ack_deadline_ms=30_000, retry_backoff=Backoff(60_000, 60_000)))
    h.publish(n=2)
    h.attach("c1", credit=2)
    h.attach("c2", credit=5)
    h.core.detach("c1", h.now)
    h.step()
    assert h.attempts("c2") == [("0-0", 2), ("0-1", 2)]
    assert h.core.stats().consumers == 1


def test_detach_counts_toward_max_deliveries():
    h = Harness(config(max_deliveries=1))
    h.publish(n=1)
    h.attach("c1", credit=1)
    h.attach("c2", credit=5)
    h.core.detach("c1", h.now)
    h.step()
    assert h.received["c2"] == []
    assert [d.record.id for d in h.dead] == ["0-0"]


def test_detach_of_unknown_consumer_is_harmless():
    h = Harness()
    h.core.detach("nobody", h.now)
    assert h.core.stats().consumers == 0


def test_ack_after_detach_is_unknown():
    h = Harness()
    h.publish(n=1)
    h.attach("c1", credit=1)
    h.core.detach("c1", h.now)
    assert h.core.ack(["0-0"]) == ([], ["0-0"])


# -- at most once -------------------------------------------------------------------


def test_at_most_once_counts_sent_as_acked():
    h = Harness(config(delivery=DeliveryMode.AT_MOST_ONCE, max_in_flight=1))
    h.publish(n=5)
    h.attach("c1", credit=5)
    stats = h.core.stats()
    assert len(h.received["c1"]) == 5  # max_in_flight does not bound: nothing is in flight
    assert (stats.acked_total, stats.in_flight, stats.backlog) == (5, 0, 0)
    assert h.core.ack_floor(0) == 5
    assert h.ack("0-0") == ([], ["0-0"])


# -- ordered by key -----------------------------------------------------------------


def test_ordered_by_key_holds_only_same_key():
    h = Harness(config(ordered_by_key=True))
    h.publish(key="a")
    h.publish(key="a")
    h.publish(key="b")
    h.publish(key=None)
    h.publish(key="a")
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-0", "0-2", "0-3"]
    h.ack("0-0")
    assert h.ids("c1")[-1] == "0-1"
    h.ack("0-1")
    assert h.ids("c1")[-1] == "0-4"


def test_ordered_by_key_redelivers_before_the_next_record_of_the_key():
    h = Harness(config(ordered_by_key=True, retry_backoff=Backoff(100, 100)))
    h.publish(key="a", n=2)
    h.publish(key="b")
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.advance(0.1)
    assert h.attempts("c1") == [("0-0", 1), ("0-2", 1), ("0-0", 2)]
    h.ack("0-0")
    assert h.attempts("c1")[-1] == ("0-1", 1)


def test_ordered_by_key_dead_letter_releases_the_key():
    h = Harness(config(ordered_by_key=True, max_deliveries=1))
    h.publish(key="a", n=2)
    h.attach("c1", credit=10)
    h.nack("0-0")
    assert h.ids("c1") == ["0-0", "0-1"]


def test_ordered_by_key_held_records_do_not_block_the_partition():
    h = Harness(config(ordered_by_key=True, max_in_flight=2))
    h.publish(key="a", n=50)
    h.publish(key="b", n=1)
    h.attach("c1", credit=100)
    assert h.ids("c1") == ["0-0", "0-50"]


# -- seek ---------------------------------------------------------------------------


def test_seek_drops_in_flight_and_restarts_attempts():
    h = Harness(config(retry_backoff=Backoff(10, 10)))
    h.publish(n=3)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.advance(0.01)
    assert h.attempts("c1")[-1] == ("0-0", 2)
    h.core.seek({0: 0})
    h.step()
    assert h.attempts("c1")[-3:] == [("0-0", 1), ("0-1", 1), ("0-2", 1)]
    assert h.core.stats().backlog == 3


def test_ack_of_a_record_dropped_by_seek_is_unknown():
    h = Harness()
    h.publish(n=2)
    h.attach("c1", credit=2)
    h.core.seek({0: 2})
    assert h.core.ack(["0-0"]) == ([], ["0-0"])
    assert h.core.ack_floor(0) == 2
    assert h.core.stats().backlog == 0


def test_seek_leaves_other_partitions_untouched():
    h = Harness(partitions=2)
    h.publish(0, n=1)
    h.publish(1, n=1)
    h.attach("c1", credit=2)
    h.core.seek({0: 1})
    assert h.core.ack(["1-0"]) == (["1-0"], [])


def test_seek_drops_a_pending_redelivery():
    h = Harness(config(retry_backoff=Backoff(100, 100)))
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.core.seek({0: 1})
    h.advance(1)
    assert len(h.received["c1"]) == 1


# -- cursor snapshot and restore ----------------------------------------------------


def test_restore_from_snapshot_skips_acked_records():
    h = Harness()
    h.publish(n=5)
    h.attach("c1", credit=5)
    h.ack("0-1", "0-3")
    snapshot = h.core.snapshot()
    assert snapshot.partitions[0] == PartitionCursor(0, ((1, 2), (3, 4)))
    restored = Harness(cursor=snapshot)
    restored.publish(n=5)
    restored.attach("c1", credit=10)
    assert restored.ids("c1") == ["0-0", "0-2", "0-4"]


def test_attempts_survive_a_restore():
    h = Harness(config(retry_backoff=Backoff(10, 10)))
    h.publish(n=2)
    h.attach("c1", credit=10)
    h.nack("0-0")
    h.advance(0.01)
    snapshot = h.core.snapshot(with_attempts=True)
    assert snapshot.attempts == {(0, 0): 2, (0, 1): 1}
    restored = Harness(cursor=snapshot)
    restored.publish(n=2)
    restored.attach("c1", credit=10)
    assert restored.attempts("c1") == [("0-0", 3), ("0-1", 2)]


def test_restored_record_with_max_deliveries_is_dead_lettered():
    cursor = CursorSnapshot({0: PartitionCursor(0)}, {(0, 0): 5})
    h = Harness(config(max_deliveries=5), cursor=cursor)
    h.publish(n=2)
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-1"]
    assert [d.record.id for d in h.dead] == ["0-0"]


def test_snapshot_clears_the_dirty_flag():
    h = Harness()
    h.publish(n=1)
    h.attach("c1", credit=1)
    h.ack("0-0")
    assert h.core.dirty
    h.core.snapshot()
    assert not h.core.dirty


# -- retention and stats ------------------------------------------------------------


def test_retention_past_the_cursor_skips_forward_and_counts_expired():
    h = Harness()
    h.publish(n=10)
    h.truncate_head(0, 6)
    h.core.set_start(0, 6)
    h.attach("c1", credit=100)
    assert h.ids("c1") == ["0-6", "0-7", "0-8", "0-9"]
    stats = h.core.stats()
    assert stats.expired_total == 6
    assert h.core.ack_floor(0) == 6


def test_a_read_that_lands_past_the_log_start_expires_the_gap():
    h = Harness()
    h.publish(n=10)
    h.truncate_head(0, 4)
    h.attach("c1", credit=100)
    assert h.ids("c1")[0] == "0-4"
    assert h.core.stats().expired_total == 4


def test_stats_follow_protocol_section_5():
    h = Harness(config(retry_backoff=Backoff(10, 10)), partitions=2)
    h.publish(0, n=3)
    h.publish(1, n=2)
    h.attach("c1", credit=4)
    h.ack("0-0")
    h.nack("0-1")
    h.advance(0.01)
    stats = h.core.stats().as_dict()
    assert stats == {
        "backlog": 4,
        "in_flight": 2,  # 0-1 waits for credit after its backoff
        "consumers": 1,
        "delivered_total": 4,
        "redelivered_total": 0,
        "acked_total": 1,
        "dead_lettered_total": 0,
        "expired_total": 0,
        "filtered_total": 0,
        "delayed": 0,
        "partitions": [{"partition": 0, "ack_floor": 1}, {"partition": 1, "ack_floor": 0}],
    }


# -- change in place (PROTOCOL §8) ------------------------------------------------------


def test_shorter_deadline_applies_to_new_sends_and_in_flight_keep_theirs():
    h = Harness(config(ack_deadline_ms=10_000, retry_backoff=Backoff(10_000, 10_000)))
    h.publish(n=1)
    h.attach("c1", credit=10)
    h.core.reconfigure(config(ack_deadline_ms=1000, retry_backoff=Backoff(10_000, 10_000)))
    h.publish(n=1)
    h.step()
    assert h.attempts("c1") == [("0-0", 1), ("0-1", 1)]
    assert h.core.next_wakeup() == h.now + 1.0
    h.advance(1.0)  # the new send expires though it was sent after the old one
    assert h.core.in_flight == 1
    assert h.ack("0-0") == (["0-0"], [])
    h.advance(9.0)
    assert h.core.in_flight == 0


def test_raising_max_in_flight_makes_room_at_once():
    h = Harness(config(max_in_flight=1))
    h.publish(n=3)
    h.attach("c1", credit=10)
    assert len(h.received["c1"]) == 1
    h.core.reconfigure(config(max_in_flight=3))
    h.step()
    assert [d.record.id for d in h.received["c1"]] == ["0-0", "0-1", "0-2"]


def test_records_not_matching_the_filter_are_acked_unsent_and_hold_no_key():
    """PROTOCOL §8 Filter: acked without being sent, counted in filtered_total, not in
    delivered_total, never dead-lettered; a filtered record never holds its key."""
    h = Harness(config(filter='key = "a"', ordered_by_key=True, max_deliveries=1))
    for key in ("b", "a", "b", "a"):
        h.publish(key=key)
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-1"], "one per key in flight: 0-3 waits for 0-1"
    h.ack("0-1")
    assert h.ids("c1") == ["0-1", "0-3"]
    h.ack("0-3")
    stats = h.core.stats()
    assert (stats.filtered_total, stats.delivered_total, stats.acked_total) == (2, 2, 2)
    assert (stats.backlog, h.core.ack_floor(0), h.dead) == (0, 4, [])


def test_a_filtered_subscription_reads_ahead_of_a_small_credit():
    """PROTOCOL §8 Filter: dropped records take no credit, so a consumer with credit 1
    does not make the subscription read the log one record at a time."""
    h = Harness(config(filter='key = "a"'))
    for n in range(2500):
        h.publish(key="a" if n % 1000 == 999 else "b")
    h.attach("c1", credit=1)
    assert h.ids("c1") == ["0-999"]
    # Batches of up to 1000, less what the buffer holds: only the matching 0-1999, which
    # waits for credit.
    assert [(r.offset, r.max_records) for r in h.reads] == [(0, 1000), (1000, 1000), (2000, 999)]
    h.ack("0-999")
    h.credit("c1", 1)
    assert h.ids("c1") == ["0-999", "0-1999"]
    stats = h.core.stats()
    assert (stats.filtered_total, stats.delivered_total, h.core.ack_floor(0)) == (2498, 2, 1999)
    assert stats.backlog == 1  # 0-1999, in flight: the skipped records are acked


def test_a_filter_skips_records_with_no_consumer_attached():
    """PROTOCOL §8 (settled 2026-11-26): skipping happens whether or not a consumer is
    attached, so `backlog` counts only matching records; what matches waits, bounded."""
    h = Harness(config(filter='key = "a"'))
    for n in range(2500):
        h.publish(key="a" if n in (5, 2400) else "b")
    h.step()
    stats = h.core.stats()
    assert (stats.filtered_total, stats.delivered_total, stats.backlog) == (2498, 0, 2)
    assert h.core.ack_floor(0) == 5
    h.attach("c1", credit=10)
    assert h.ids("c1") == ["0-5", "0-2400"]


def test_an_unfiltered_subscription_reads_only_what_credit_allows():
    h = Harness()
    h.publish(n=50)
    h.attach("c1", credit=3)
    assert [(r.offset, r.max_records) for r in h.reads] == [(0, 3)]


def test_a_changed_filter_applies_to_waiting_redeliveries():
    h = Harness(config(retry_backoff=Backoff(10, 10)))
    h.publish(key="a")
    h.publish(key="b")
    h.attach("c1", credit=10)
    h.nack("0-0", "0-1")
    h.core.reconfigure(config(retry_backoff=Backoff(10, 10), filter='key = "b"'))
    h.advance(0.01)
    assert h.attempts("c1")[2:] == [("0-1", 2)]
    assert h.core.stats().filtered_total == 1 and h.core.ack_floor(0) == 1


# -- memory (issue 27 §3: every tail has a core of its own) -----------------------------


def test_an_idle_subscription_makes_no_queue_before_something_waits_in_it():
    """An empty deque holds 760 bytes: a tail of a topic of four partitions held six of
    them (4.5 KiB, a partition buffer each and the two refetch queues) before any record
    came. Its whole state is less than that now."""
    cursor = CursorSnapshot({p: PartitionCursor(0) for p in range(4)}, {})
    tail = config(delivery=DeliveryMode.AT_MOST_ONCE)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cores = [SubscriptionCore(tail, cursor) for _ in range(50)]
        each = (tracemalloc.get_traced_memory()[0] - before) / len(cores)
    finally:
        tracemalloc.stop()
    assert each < 4096, f"{each:.0f} bytes per idle subscription state"
