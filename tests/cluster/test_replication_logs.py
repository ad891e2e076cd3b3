"""A leader and two followers on real directories, driven through the replication state
machines (tests/cluster/replicas.py): records reach every replica byte for byte, the
marks advance as followers fetch, a change of leader truncates exactly the old leader's
unreplicated tail (KIP-101), a follower that stops fetching leaves the ISR — and the
replica checker (tests/cluster/checker.py) proves the invariants of issue 14 after each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.follower import Action
from cluster.replication import AppendRefusal
from storage.batch import encode_batch
from storage.partition_log import PartitionLog
from storage.record import NewRecord
from tests.cluster.checker import CheckReport, check_replicas
from tests.cluster.replicas import SMALL, Cluster

LAG_MS = 10_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, ("a", "b", "c"), min_insync=2, replica_lag_ms=LAG_MS)
    c.elect("a")
    try:
        yield c
    finally:
        c.close()


def values(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def stored_bytes(log: PartitionLog) -> bytes:
    return log.read_batches(0, 1 << 30)


def check(c: Cluster, must_hold: tuple[str, ...] | None = None) -> CheckReport:
    leader = c.leader
    return check_replicas(
        {name: node.log for name, node in c.nodes.items() if node.live},
        high_watermark=leader.high_watermark,
        acknowledged=c.acked,
        must_hold=must_hold,
    )


def test_records_reach_every_follower_byte_for_byte_and_the_marks_follow(
    cluster: Cluster,
) -> None:
    c = cluster
    for i in range(30):  # enough to roll segments (SMALL) and need several fetches
        assert c.publish(values(f"r{i}", 5)) == i * 5
    leader = c.leader
    assert leader.log.end_offset == 150 and leader.high_watermark == 0 and c.acked == []
    c.round()  # the followers fetch (max_bytes keeps each answer small) ...
    assert leader.high_watermark == 0
    c.round()  # ... and report what they wrote with their next fetch
    assert 0 < leader.high_watermark < 150
    rounds = c.replicate()
    assert rounds > 2
    assert len(leader.log.segments) > 1
    for name in ("b", "c"):
        assert stored_bytes(c.nodes[name].log) == stored_bytes(leader.log)
        assert c.nodes[name].high_watermark == 150
    assert [o for o, _ in c.acked] == list(range(150))  # every acks=all batch answered
    report = check(c)
    assert report.compared_offsets == 150 and report.acknowledged == 150


def test_an_acks_all_batch_is_answered_only_once_every_isr_member_fsynced(
    cluster: Cluster,
) -> None:
    c = cluster
    c.publish(values("x", 3))
    assert c.step("b") is Action.APPEND  # b has it now, but has not told the leader
    assert c.step("c") is Action.APPEND
    assert c.acked == []
    c.step("b")  # b reports written and fsynced through 3
    assert c.acked == []
    c.step("c")
    assert [o for o, _ in c.acked] == [0, 1, 2]
    check(c)


def test_a_new_leader_and_the_old_leaders_unreplicated_tail(cluster: Cluster) -> None:
    c = cluster
    for i in range(4):
        c.publish(values(f"one-{i}", 5))
    c.replicate()
    assert len(c.acked) == 20
    # a writes a tail no follower copies (acks=1), then one more round reaches b and c
    # only halfway: their high watermark lags their log end (KIP-101's setting).
    for i in range(3):
        c.publish(values(f"tail-{i}", 4), acks="1")
    tail = {v for i in range(3) for v in values(f"tail-{i}", 4)}
    c.nodes["b"].fetching = c.nodes["c"].fetching = False
    c.crash("a")
    # b leads epoch 2 from its own log end; c must keep what it has (never truncate to
    # its high watermark), then copies b's epoch-2 records.
    c.elect("b", settle=False)
    c.nodes["b"].fetching = c.nodes["c"].fetching = True
    assert c.state is not None and c.state.epoch == 2
    c.publish(values("two", 6))
    assert c.step("c") is Action.TRUNCATE
    assert c.nodes["c"].log.end_offset == 20
    c.replicate()
    # The old leader returns: it truncates exactly its 12 unreplicated records...
    a = c.nodes["a"]
    c.restart("a")
    assert a.log.end_offset == 32
    assert c.step("a") is Action.TRUNCATE
    assert a.log.end_offset == 20
    assert a.log.end_offset_for_epoch(1) == (1, 20)
    # ... and converges on the new leader's log, byte for byte.
    c.replicate()
    leader_bytes = stored_bytes(c.nodes["b"].log)
    assert stored_bytes(a.log) == leader_bytes == stored_bytes(c.nodes["c"].log)
    held = {r.value for r in a.log.read(0, 1000, 1 << 20)}
    assert not held & tail
    assert a.log.epochs.entries == [(1, 0), (2, 20)]
    assert len(c.acked) == 26
    check(c)


def test_a_returning_replica_behind_its_hw_keeps_what_the_leader_has(tmp_path: Path) -> None:
    """KIP-101's first case: b copied records 0..9 and knows HW 0 when a dies; truncating
    to its HW and refetching from a new leader would lose them. It truncates by epoch."""
    c = Cluster(tmp_path, ("a", "b", "c"), min_insync=1, replica_lag_ms=LAG_MS)
    try:
        c.elect("a")
        c.publish(values("x", 10))
        c.step("b")
        c.step("c")
        assert c.nodes["b"].log.end_offset == 10 and c.nodes["b"].high_watermark == 0
        c.crash("a")
        c.elect("c", settle=False)  # c knew HW 0 as well; it leads with what it has
        assert c.step("b") is Action.TRUNCATE
        assert c.nodes["b"].log.end_offset == 10
        c.replicate()
        assert c.leader.high_watermark == 10
        check(c)
    finally:
        c.close()


def test_a_follower_that_stops_fetching_leaves_the_isr_and_acks_all_waits_only_for_it(
    cluster: Cluster,
) -> None:
    c = cluster
    c.publish(values("x", 5))
    c.replicate()
    c.nodes["c"].fetching = False  # alive, but silent
    c.publish(values("y", 5))
    c.round()
    c.round()
    assert len(c.acked) == 5  # y waits for c, still in the ISR
    c.clock.advance(LAG_MS)
    c.tick()
    assert c.state is not None and c.state.isr == ("a", "b", "c")  # exactly the lag: in
    c.clock.advance(1)
    c.tick()
    assert c.state.isr == ("a", "b")
    assert len(c.acked) == 10  # the ISR without c had y fsynced
    assert c.publish(values("z", 5)) == 10
    c.round()
    c.round()
    assert len(c.acked) == 15
    check(c, must_hold=("a", "b"))
    # c comes back, catches up and rejoins.
    c.nodes["c"].fetching = True
    c.replicate()
    assert c.state.isr == ("a", "b", "c")
    check(c)


def test_below_min_insync_acks_all_is_refused_before_the_append(tmp_path: Path) -> None:
    c = Cluster(tmp_path, ("a", "b", "c"), min_insync=3, replica_lag_ms=LAG_MS)
    try:
        c.elect("a")
        c.publish(values("x", 5))
        c.replicate()
        c.nodes["c"].fetching = False
        c.publish(values("y", 5))  # appended while the ISR was whole; c then goes quiet
        c.round()
        c.round()
        c.clock.advance(LAG_MS + 1)
        c.tick()
        assert c.state is not None and c.state.isr == ("a", "b")
        assert [v for _, v in c.refused] == values("y", 5)  # answered 503, not 200
        end = c.leader.log.end_offset
        assert c.publish(values("z", 5)) is AppendRefusal.NOT_ENOUGH_REPLICAS
        assert c.leader.log.end_offset == end  # nothing appended
        assert c.publish(values("w", 2), acks="1") == end  # acks=1 still goes in
        check(c, must_hold=("a", "b"))
    finally:
        c.close()


def test_a_fenced_follower_stops(cluster: Cluster) -> None:
    c = cluster
    c.publish(values("x", 2))
    c.replicate()
    # etcd moves to epoch 2 with b leading, but c still follows a (it has not seen it):
    # a is no longer leader; b refuses c's epoch-1 fetch.
    stale = c.nodes["c"].role
    c.elect("b")
    c.nodes["c"].role = stale
    assert c.step("c") is Action.STOP


# --- the checker finds what it must find -------------------------------------------------


def _log(path: Path, batches: list[tuple[int, list[bytes], int, int]]) -> PartitionLog:
    log = PartitionLog(path, 0, SMALL)
    for offset, vals, ts, epoch in batches:
        log.append_batches(
            encode_batch(
                offset, [NewRecord(v, producer_id=v.decode()) for v in vals], ts, epoch
            ).data
        )
    return log


def test_the_checker_finds_two_records_at_one_offset(tmp_path: Path) -> None:
    a = _log(tmp_path / "a", [(0, [b"1", b"2"], 10, 1), (2, [b"3"], 11, 1)])
    b = _log(tmp_path / "b", [(0, [b"1", b"2"], 10, 1), (2, [b"other"], 11, 2)])
    try:
        check_replicas({"a": a, "b": b}, high_watermark=2)  # they agree below 2
        with pytest.raises(AssertionError, match="offset 2: different records"):
            check_replicas({"a": a, "b": b}, high_watermark=3)
    finally:
        a.close()
        b.close()


def test_the_checker_finds_a_lost_acknowledged_record_and_duplicates(tmp_path: Path) -> None:
    a = _log(tmp_path / "a", [(0, [b"1", b"2"], 10, 1)])
    b = _log(tmp_path / "b", [(0, [b"1"], 10, 1)])
    try:
        with pytest.raises(AssertionError, match="b: acknowledged record at 1"):
            check_replicas({"a": a, "b": b}, high_watermark=2, acknowledged=[(1, b"2")])
        check_replicas(
            {"a": a, "b": b}, high_watermark=2, acknowledged=[(1, b"2")], must_hold=("a",)
        )
        with pytest.raises(AssertionError, match="not below the HW"):
            check_replicas({"a": a}, high_watermark=1, acknowledged=[(1, b"2")])
        a.append_batches(encode_batch(2, [NewRecord(b"1", producer_id="1")], 12, 1).data)
        with pytest.raises(AssertionError, match="producer ids twice"):
            check_replicas({"a": a}, high_watermark=3)
    finally:
        a.close()
        b.close()


def test_the_checker_reads_directories_and_finds_falling_timestamps(tmp_path: Path) -> None:
    _log(tmp_path / "a", [(0, [b"1"], 20, 1), (1, [b"2"], 10, 1)]).close()
    with pytest.raises(AssertionError, match="timestamp goes down at offset 1"):
        check_replicas({"a": tmp_path / "a"}, high_watermark=2)
