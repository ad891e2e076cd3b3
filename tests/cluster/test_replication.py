"""The leader's replication state machine on a fake clock: ISR, high watermark, commit
point, not_enough_replicas before the append, fencing (cluster/replication.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.replication import (
    AppendRefusal,
    FetchError,
    IsrChange,
    LeaderReplica,
)
from tests.cluster.replicas import FakeClock

LAG_MS = 10_000


def leader(
    clock: FakeClock,
    *,
    log_end: int = 0,
    min_insync: int = 2,
    isr: tuple[str, ...] = (),
    epoch: int = 3,
    replicas: tuple[str, ...] = ("a", "b", "c"),
    **state: int,
) -> LeaderReplica:
    """Node "a" leading ``replicas`` (the ISR all of them unless ``isr``) under
    ``epoch``; ``state`` is what a new leader starts from (``high_watermark``,
    ``fsynced_end``)."""
    return LeaderReplica(
        "a",
        epoch=epoch,
        replicas=replicas,
        isr=isr or replicas,
        min_insync_replicas=min_insync,
        replica_lag_ms=LAG_MS,
        clock=clock,
        log_end=log_end,
        **state,
    )


def in_sync_at(end: int, clock: FakeClock, **kwargs: Any) -> LeaderReplica:
    """A :func:`leader` with ``end`` records appended that both followers, "b" and "c",
    have fetched, written and fsynced."""
    r = leader(clock, **kwargs)
    r.on_append(end)
    r.on_fetch("b", 3, end, end)
    r.on_fetch("c", 3, end, end)
    return r


def test_the_high_watermark_is_the_smallest_written_end_over_the_isr() -> None:
    clock = FakeClock()
    r = leader(clock)
    assert r.on_append(10).high_watermark == 0  # no follower has fetched yet
    assert r.on_fetch("b", 3, 10, 0).progress.high_watermark == 0
    decision = r.on_fetch("c", 3, 7, 0)
    assert decision.error is None and decision.progress.high_watermark == 7
    assert r.on_fetch("c", 3, 10, 0).progress.high_watermark == 10


def test_the_high_watermark_never_goes_down() -> None:
    clock = FakeClock()
    r = in_sync_at(10, clock)
    assert r.high_watermark == 10
    # A follower fetching from lower (it truncated) does not pull the mark down...
    assert r.on_fetch("c", 3, 4, 4).progress.high_watermark == 10
    # ... nor does an ISR that grows with a follower that is behind.
    r2 = leader(clock, isr=("a", "b"))
    r2.on_append(10)
    r2.on_fetch("b", 3, 10, 10)
    assert r2.high_watermark == 10
    assert r2.on_fetch("c", 3, 10, 10).progress.isr_change == IsrChange(3, ("a", "b", "c"), True)
    r2.on_append(20)
    assert r2.isr_stored(("a", "b", "c")).high_watermark == 10
    assert r2.on_fetch("c", 3, 0, 0).progress.high_watermark == 10  # "c" truncated to 0


def test_a_new_leader_starts_from_the_mark_it_knew_bounded_by_its_log() -> None:
    clock = FakeClock()
    r = leader(clock, epoch=1, replicas=("a", "b"), min_insync=1, log_end=5, high_watermark=9)
    assert (r.high_watermark, r.commit_point) == (5, 5)


def test_the_commit_point_waits_for_every_isr_member_to_fsync() -> None:
    clock = FakeClock()
    r = leader(clock)
    r.on_append(10)
    r.on_flush(10)
    assert r.wait_commit(10).committed == ()
    r.on_fetch("b", 3, 10, 10)
    progress = r.on_fetch("c", 3, 10, 6).progress  # written, not all fsynced
    assert (progress.high_watermark, progress.commit_point, progress.committed) == (10, 6, ())
    progress = r.on_fetch("c", 3, 10, 10).progress
    assert (progress.commit_point, progress.committed) == (10, (10,))
    # The leader's own fsync counts as well.
    r2 = leader(clock)
    r2.on_append(5)
    r2.wait_commit(5)
    r2.on_fetch("b", 3, 5, 5)
    assert r2.on_fetch("c", 3, 5, 5).progress.committed == ()
    assert r2.on_flush(5).committed == (5,)


def test_waiters_are_answered_in_offset_order_as_the_commit_point_passes_them() -> None:
    clock = FakeClock()
    r = leader(clock)
    for end in (3, 6, 9):
        r.on_append(end)
        r.on_flush(end)
        assert r.wait_commit(end).committed == ()
    r.on_fetch("b", 3, 9, 9)
    assert r.on_fetch("c", 3, 9, 6).progress.committed == (3, 6)
    assert r.on_fetch("c", 3, 9, 9).progress.committed == (9,)
    assert r.wait_commit(9).committed == (9,)  # already committed: answered at once


def test_a_follower_leaves_the_isr_after_replica_lag_ms_without_catching_up() -> None:
    clock = FakeClock()
    r = in_sync_at(10, clock)
    r.on_append(20)  # "c" stops fetching from here on
    for _ in range(10):
        clock.advance(LAG_MS / 10)
        r.on_fetch("b", 3, 20, 20)
        assert r.tick().isr_change is None  # exactly replica_lag_ms: still in
    clock.advance(1)
    r.on_fetch("b", 3, 20, 20)
    progress = r.tick()
    assert progress.isr_change == IsrChange(3, ("a", "b"), False)
    assert progress.high_watermark == 10  # the shrink counts once etcd holds it
    assert r.tick().isr_change is None  # one change at a time
    assert r.isr_stored(("a", "b")).high_watermark == 20
    assert r.isr == ("a", "b")


def test_a_follower_that_fetches_but_never_reaches_the_log_end_leaves_too() -> None:
    clock = FakeClock()
    r = in_sync_at(100, clock)
    # "c" keeps fetching, but each time from behind what the leader had at its last fetch.
    written = 100
    for _ in range(20):
        r.on_append(r.log_end + 10)
        clock.advance(LAG_MS / 5)
        written += 1
        r.on_fetch("b", 3, r.log_end, r.log_end)
        r.on_fetch("c", 3, written, written)
    assert r.tick().isr_change == IsrChange(3, ("a", "b"), False)


def test_a_follower_keeping_up_under_load_stays_in() -> None:
    clock = FakeClock()
    r = leader(clock)
    # Every fetch has what the leader had at the previous one, never the very end.
    previous_end = 0
    for _ in range(50):
        r.on_append(r.log_end + 10)
        clock.advance(LAG_MS / 4)
        r.on_fetch("b", 3, previous_end, previous_end)
        r.on_fetch("c", 3, previous_end, previous_end)
        previous_end = r.log_end
        assert r.tick().isr_change is None


def test_an_idle_follower_at_the_log_end_stays_in() -> None:
    clock = FakeClock()
    r = in_sync_at(5, clock)
    clock.advance(LAG_MS * 5)
    assert r.tick().isr_change is None


def test_a_follower_rejoins_once_it_has_the_high_watermark_of_this_epoch() -> None:
    clock = FakeClock()
    r = leader(clock, isr=("a", "b"), log_end=10)
    r.on_fetch("b", 3, 10, 10)
    assert r.high_watermark == 10
    assert r.on_fetch("c", 3, 4, 4).progress.isr_change is None  # behind
    assert r.on_fetch("c", 3, 9, 9).progress.isr_change is None
    change = r.on_fetch("c", 3, 10, 10).progress.isr_change
    assert change == IsrChange(3, ("a", "b", "c"), True)
    # Counted at once for the marks (the maximal ISR), and for acks=all once stored.
    assert r.maximal_isr == ("a", "b", "c") and r.minimal_isr == ("a", "b")
    r.isr_stored(change.isr)
    assert r.isr == ("a", "b", "c") and r.pending is None


def test_a_follower_at_the_high_watermark_rejoins_only_once_it_keeps_up() -> None:
    # Under load the high watermark trails the log end. A follower back after an
    # absence reached it on its first fetch and was admitted, and the next tick dropped
    # it again (it had not had the log end within replica_lag_ms): the ISR flapped.
    clock = FakeClock()
    r = leader(clock, isr=("a", "b"), log_end=10)
    r.on_fetch("b", 3, 10, 10)
    clock.advance(LAG_MS * 3)
    r.on_fetch("b", 3, 10, 10)
    r.on_append(20)  # b has not fetched these yet: the high watermark stays at 10
    assert r.high_watermark == 10
    assert r.on_fetch("c", 3, 10, 10).progress.isr_change is None
    assert r.tick().isr_change is None
    # Its next fetch has what the leader had at its previous one: it keeps up, it rejoins.
    clock.advance(1)
    change = r.on_fetch("c", 3, 20, 20).progress.isr_change
    assert change == IsrChange(3, ("a", "b", "c"), True)
    r.isr_stored(change.isr)
    clock.advance(1)
    r.on_append(30)
    assert r.tick().isr_change is None and r.isr == ("a", "b", "c")


def test_a_follower_that_may_not_join_is_noted_but_stays_out() -> None:
    clock = FakeClock()
    r = leader(clock, isr=("a", "b"), log_end=10)
    r.on_fetch("b", 3, 10, 10)
    assert r.on_fetch("c", 3, 10, 10, may_join=False).progress.isr_change is None
    assert r.followers["c"].fsynced == 10 and r.isr == ("a", "b")
    change = r.on_fetch("c", 3, 10, 10).progress.isr_change
    assert change == IsrChange(3, ("a", "b", "c"), True)


def test_a_failed_isr_write_is_proposed_again() -> None:
    clock = FakeClock()
    r = leader(clock, isr=("a", "b"), log_end=10)
    r.on_fetch("b", 3, 10, 10)
    assert r.on_fetch("c", 3, 10, 10).progress.isr_change is not None
    r.isr_write_failed()
    assert r.isr == ("a", "b")
    assert r.on_fetch("c", 3, 10, 10).progress.isr_change == IsrChange(3, ("a", "b", "c"), True)


def test_acks_all_is_refused_before_the_append_below_min_insync() -> None:
    clock = FakeClock()
    r = leader(clock, isr=("a",), min_insync=2)
    assert r.check_append("all") is AppendRefusal.NOT_ENOUGH_REPLICAS
    assert r.check_append("1") is None and r.check_append("0") is None
    r2 = leader(clock, isr=("a", "b"), min_insync=2)
    assert r2.check_append("all") is None
    r2.on_append(5)
    clock.advance(LAG_MS + 1)
    assert r2.tick().isr_change == IsrChange(3, ("a",), False)
    # A proposed shrink below the minimum already refuses new acks=all appends.
    assert r2.check_append("all") is AppendRefusal.NOT_ENOUGH_REPLICAS


def test_waiters_are_refused_when_the_isr_falls_below_min_insync() -> None:
    clock = FakeClock()
    r = in_sync_at(5, clock, min_insync=2)
    r.on_append(8)
    assert r.wait_commit(8).committed == ()
    clock.advance(LAG_MS + 1)
    progress = r.tick()
    assert progress.isr_change == IsrChange(3, ("a",), False)
    assert progress.refused == (8,)
    assert r.wait_commit(8).refused == (8,)


def test_acks_all_waits_only_for_the_isr_once_a_follower_left() -> None:
    clock = FakeClock()
    r = in_sync_at(5, clock, min_insync=2)
    r.on_append(8)
    r.on_flush(8)
    r.wait_commit(8)
    clock.advance(LAG_MS + 1)
    r.on_fetch("b", 3, 8, 8)
    progress = r.tick()
    assert progress.isr_change == IsrChange(3, ("a", "b"), False)
    assert progress.committed == () and progress.refused == ()  # "c" counts until stored
    assert r.isr_stored(("a", "b")).committed == (8,)


@pytest.mark.parametrize(
    ("follower", "epoch", "offset", "error"),
    [
        ("b", 2, 0, FetchError.FENCED_LEADER_EPOCH),
        ("b", 4, 0, FetchError.UNKNOWN_LEADER_EPOCH),
        ("z", 3, 0, FetchError.NOT_REPLICA),
        ("a", 3, 0, FetchError.NOT_REPLICA),
        ("b", 3, 11, FetchError.OFFSET_OUT_OF_RANGE),
        ("b", 3, -1, FetchError.OFFSET_OUT_OF_RANGE),
    ],
)
def test_a_fetch_under_another_epoch_or_out_of_range_is_refused_and_changes_nothing(
    follower: str, epoch: int, offset: int, error: FetchError
) -> None:
    clock = FakeClock()
    r = leader(clock, log_end=10)
    r.on_fetch("c", 3, 10, 10)
    decision = r.on_fetch(follower, epoch, offset, offset)
    assert decision.error is error
    assert r.followers["b"].written == -1 and r.high_watermark == 0


def test_the_leader_is_always_in_the_isr_and_must_be_a_replica() -> None:
    clock = FakeClock()
    r = leader(clock, isr=("b", "c"))
    assert r.isr == ("a", "b", "c")
    with pytest.raises(ValueError, match="ISR without its leader"):
        r.isr_stored(("b",))
    with pytest.raises(ValueError, match="does not replicate"):
        LeaderReplica(
            "z",
            epoch=0,
            replicas=("a",),
            isr=("a",),
            min_insync_replicas=1,
            replica_lag_ms=1,
            clock=clock,
            log_end=0,
        )
    with pytest.raises(ValueError, match="does not shrink"):
        r.on_append(-1)


def test_follower_lag_counts_records_behind_the_log_end() -> None:
    clock = FakeClock()
    r = leader(clock, log_end=10)
    r.on_fetch("b", 3, 7, 7)
    assert r.follower_lag() == {"b": 3, "c": None}  # c has not fetched: unknown


def test_a_new_leaders_mark_is_settled_once_it_reaches_the_epoch_start() -> None:
    clock = FakeClock()
    r = leader(
        clock,
        epoch=2,
        replicas=("a", "b"),
        min_insync=1,
        log_end=10,
        high_watermark=4,  # what its last fetch response said; the old leader had more
    )
    assert r.high_watermark == 4 and not r.high_watermark_settled
    r.on_append(12)
    r.on_fetch("b", 2, 10, 10)
    assert r.high_watermark == 10 and r.high_watermark_settled


def test_a_follower_whose_node_is_gone_leaves_the_isr_at_once_even_when_idle() -> None:
    # Nothing to fall behind on, so the lag rule never fires; its node's key is gone.
    clock = FakeClock()
    r = in_sync_at(0, clock, min_insync=3)  # b and c fetched the empty log
    clock.advance(60_000)
    assert r.tick().isr_change is None  # caught up at the log end: in sync by the lag rule
    progress = r.followers_gone(["c", "a"])  # the leader's own id is never dropped
    assert progress.isr_change is not None
    assert progress.isr_change.isr == ("a", "b") and not progress.isr_change.expands
    assert r.minimal_isr == ("a", "b")
    assert r.check_append("all") is not None  # 2 < min_insync 3: refused before appending
    assert r.followers_gone(["b"]).isr_change is None  # one change at a time
    r.isr_stored(("a", "b"))
    assert r.isr == ("a", "b")


def test_a_new_leader_answers_no_waiter_from_its_inherited_commit_point() -> None:
    # Raft's rule (Kafka: the leader epoch start offset): what a new leader inherited is
    # committed only once the ISR of this epoch has fsynced up to the epoch's start. A
    # duplicate id answered at acks=all waits for an offset below that start.
    clock = FakeClock()
    r = leader(
        clock,
        epoch=2,
        log_end=10,
        high_watermark=10,  # the old leader's mark, as its last fetch response carried it
        fsynced_end=10,
    )
    assert r.wait_commit(6).committed == ()  # no follower has fetched in this epoch
    assert r.on_fetch("b", 2, 10, 10).progress.committed == ()
    assert r.on_fetch("c", 2, 10, 8).progress.committed == ()  # c has fsynced 8 only
    assert r.on_fetch("c", 2, 10, 10).progress.committed == (6,)
    assert r.wait_commit(3).committed == (3,)  # settled: answered at once from now on


def test_a_new_leader_alone_in_the_isr_settles_on_its_own_fsync() -> None:
    clock = FakeClock()
    r = leader(
        clock,
        epoch=2,
        replicas=("a", "b"),
        isr=("a",),
        min_insync=1,
        log_end=10,
        high_watermark=10,
        fsynced_end=7,  # a tail written before a restart, not yet fsynced
    )
    assert r.wait_commit(5).committed == ()
    assert r.on_flush(10).committed == (5,)


def test_a_follower_that_writes_but_cannot_fsync_leaves_the_isr_and_acks_all_goes_on() -> None:
    # Issue 25 item 9: its fetches reach the log end, its fsynced end stays behind (a
    # failing disk). It held every acks=all publish for as long as it kept fetching.
    clock = FakeClock()
    r = in_sync_at(0, clock, min_insync=2)  # b and c fetched the empty log
    r.on_append(10)
    r.on_flush(10)
    assert r.wait_commit(10).committed == ()
    r.on_fetch("b", 3, 10, 10)
    for _ in range(10):
        clock.advance(LAG_MS / 10)
        assert r.on_fetch("c", 3, 10, 0).progress.committed == ()  # written, not fsynced
        assert r.tick().isr_change is None
    clock.advance(1)
    r.on_fetch("c", 3, 10, 0)
    assert r.tick().isr_change == IsrChange(3, ("a", "b"), False)
    assert r.isr_stored(("a", "b")).committed == (10,)  # over the ISR that can fsync
    # It does not rejoin while it cannot fsync: that would hold acks=all again.
    assert r.on_fetch("c", 3, 10, 0).progress.isr_change is None
    assert r.on_fetch("c", 3, 10, 10).progress.isr_change == IsrChange(3, ("a", "b", "c"), True)
