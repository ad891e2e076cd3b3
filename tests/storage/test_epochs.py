"""Leader epochs in the log (KIP-101): batches carry the epoch they were appended under,
version 1 batches read as epoch 0, the epoch cache answers "where did epoch E end", and a
returning replica that truncates there and copies the leader's stored batches ends up
with the leader's log byte for byte — on real directories."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from storage.batch import HEADER_SIZE, HEADER_V1_SIZE, decode_batch, encode_batch, read_header
from storage.epochs import CHECKPOINT_FILE, UNDEFINED, LeaderEpochCache, StaleEpoch
from storage.errors import CorruptLog
from storage.partition_log import LogConfig, PartitionLog
from storage.record import NewRecord

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=300)


def records(tag: str, n: int) -> list[NewRecord]:
    return [NewRecord(f"{tag}-{i}".encode(), key=f"k{i}") for i in range(n)]


def as_version_1(batch: bytes) -> bytes:
    """The same batch framed as version 1 (what logs written before epochs hold)."""
    header = bytearray(batch[:HEADER_V1_SIZE])
    header[8] = 0x48
    buf = header + batch[HEADER_SIZE:]
    struct.pack_into("<I", buf, 0, len(buf))
    struct.pack_into("<I", buf, 4, crc32c.crc32c(memoryview(buf)[8:]))
    return bytes(buf)


def contents(log: PartitionLog) -> list[tuple[int, int, bytes, str | None]]:
    return [(r.offset, r.timestamp, r.value, r.key) for r in log.read(0, 10**6, 10**9)]


def open_log(path: Path) -> PartitionLog:
    return PartitionLog(path, 0, SMALL)


# --- the batch format --------------------------------------------------------------------


def test_a_batch_carries_its_leader_epoch() -> None:
    batch = encode_batch(100, records("a", 3), 5000, leader_epoch=7)
    header = read_header(batch.data)
    assert (header.leader_epoch, header.size, header.base_offset) == (7, HEADER_SIZE, 100)
    assert [r.value for r in decode_batch(batch.data, 0, header, 0)] == [b"a-0", b"a-1", b"a-2"]


def test_a_version_1_batch_reads_as_epoch_0() -> None:
    old = as_version_1(encode_batch(5, records("old", 2), 42, leader_epoch=0).data)
    header = read_header(old)
    assert (header.leader_epoch, header.size, header.record_count) == (0, HEADER_V1_SIZE, 2)
    decoded = decode_batch(old, 0, header, 0)
    assert [(r.offset, r.value, r.key) for r in decoded] == [
        (5, b"old-0", "k0"),
        (6, b"old-1", "k1"),
    ]


def test_a_log_written_before_epochs_opens_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = open_log(path)
    log.append(records("new", 3), 1000)  # a version 2 batch at offset 0
    log.close()
    # Rewrite the segment as a version 1 log of the same records, then reopen it.
    segment = path / "00000000000000000000.log"
    batch = segment.read_bytes()
    segment.write_bytes(as_version_1(batch))
    for index in path.glob("*index"):
        index.write_bytes(b"")
    log = open_log(path)
    try:
        assert log.end_offset == 3 and log.recovered_bytes == 0
        log.append(records("after", 2), 1001, leader_epoch=1)
        assert [v for _, _, v, _ in contents(log)] == [
            b"new-0",
            b"new-1",
            b"new-2",
            b"after-0",
            b"after-1",
        ]
        assert log.epochs.entries == [(0, 0), (1, 3)]
    finally:
        log.close()


def test_a_bad_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match="leader_epoch"):
        encode_batch(0, records("x", 1), 1, leader_epoch=-1)


# --- the epoch cache ---------------------------------------------------------------------


def test_end_offset_for_epoch_answers_as_kip_279(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        log.append(records("a", 4), 1000, leader_epoch=0)  # 0..3
        log.append(records("b", 3), 1001, leader_epoch=2)  # 4..6
        log.append(records("c", 2), 1002, leader_epoch=2)  # 7..8
        log.append(records("d", 5), 1003, leader_epoch=5)  # 9..13
        assert log.epochs.entries == [(0, 0), (2, 4), (5, 9)]
        assert log.end_offset_for_epoch(0) == (0, 4)
        assert log.end_offset_for_epoch(1) == (0, 4)  # the largest epoch <= 1 is 0
        assert log.end_offset_for_epoch(2) == (2, 9)
        assert log.end_offset_for_epoch(5) == (5, 14)
        assert log.end_offset_for_epoch(9) == (5, 14)
        assert [log.epochs.epoch_at(o) for o in (0, 3, 4, 8, 9, 13)] == [0, 0, 2, 2, 5, 5]
    finally:
        log.close()


def test_an_older_epoch_is_stale_and_changes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        log.append(records("a", 2), 1000, leader_epoch=3)
        with pytest.raises(StaleEpoch):
            log.append(records("b", 2), 1001, leader_epoch=2)
        assert log.end_offset == 2
        assert log.epochs.entries == [(3, 0)]
    finally:
        log.close()


def test_the_cache_survives_a_reopen_and_is_rebuilt_when_damaged_or_lost(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = open_log(path)
    for epoch in (0, 0, 1, 4, 4, 6):
        log.append(records(f"e{epoch}", 30), 1000 + epoch, leader_epoch=epoch)
    expected = log.epochs.entries
    assert len(log.segments) > 2
    log.close()
    assert open_log(path).epochs.entries == expected
    (path / CHECKPOINT_FILE).write_text("0\n3\n1 30\n")  # torn
    reopened = open_log(path)
    assert reopened.epochs.entries == expected
    reopened.close()
    (path / CHECKPOINT_FILE).unlink()
    reopened = open_log(path)
    assert reopened.epochs.entries == expected
    assert reopened.end_offset_for_epoch(3) == (1, 90)
    reopened.close()


def test_a_single_node_log_writes_no_checkpoint(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        log.append(records("a", 5), 1000)
        assert not (tmp_path / "p" / CHECKPOINT_FILE).exists()
        assert log.end_offset_for_epoch(0) == (0, 5)
    finally:
        log.close()


def test_an_epoch_noted_before_a_torn_batch_is_forgotten_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = open_log(path)
    log.append(records("a", 3), 1000, leader_epoch=1)
    log.append(records("b", 3), 1001, leader_epoch=2)
    log.close()
    segment = next(path.glob("*.log"))
    segment.write_bytes(segment.read_bytes()[:-5])  # the epoch-2 batch is torn
    log = open_log(path)
    try:
        assert log.end_offset == 3
        assert log.epochs.entries == [(1, 0)]
        assert LeaderEpochCache.load(path, 0).entries == [(1, 0)]
    finally:
        log.close()


def test_retention_moves_the_oldest_epoch_to_the_log_start(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        for epoch in (1, 2, 3):
            for _ in range(3):
                log.append(records(f"e{epoch}", 20), 1000 * epoch, leader_epoch=epoch)
        log.apply_retention(now_ms=3500, retention_ms=1000, retention_bytes=None)
        assert log.start_offset > 60
        assert log.epochs.entries[0] == (2, log.start_offset) or log.epochs.entries[0][0] == 3
        assert log.end_offset_for_epoch(1) == (UNDEFINED, UNDEFINED)
    finally:
        log.close()


def test_truncating_inside_a_batch_keeps_the_batch_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        log.append(records("a", 5), 1000, leader_epoch=1)
        log.append(records("b", 5), 1001, leader_epoch=3)
        log.truncate_to(7)
        assert log.end_offset == 7
        assert log.epochs.entries == [(1, 0), (3, 5)]
        log.truncate_to(3)
        assert log.epochs.entries == [(1, 0)]
        assert log.end_offset_for_epoch(3) == (1, 3)
        assert read_header(log.read_batches(0, 10**6)).leader_epoch == 1
    finally:
        log.close()


# --- copying stored batches ------------------------------------------------------------------


def copy(leader: PartitionLog, follower: PartitionLog, chunk: int = 700) -> None:
    """What replication does: fetch stored batches from the follower's end, append them."""
    for _ in range(10_000):
        data = leader.read_batches(follower.end_offset, chunk)
        if not data:
            return
        follower.append_batches(data)
    raise AssertionError("copy did not finish")


def test_a_follower_copying_stored_batches_has_the_leaders_log(tmp_path: Path) -> None:
    leader, follower = open_log(tmp_path / "l"), open_log(tmp_path / "f")
    try:
        for i, epoch in enumerate((0, 0, 1, 1, 1, 4)):
            leader.append(records(f"b{i}", 1 + i * 7), 1000 + i, leader_epoch=epoch)
        copy(leader, follower)
        assert contents(follower) == contents(leader)
        assert follower.epochs.entries == leader.epochs.entries
        assert follower.read_batches(0, 10**9) == leader.read_batches(0, 10**9)
    finally:
        leader.close()
        follower.close()


def test_read_batches_returns_whole_batches_within_the_budget(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        for i in range(6):
            log.append(records(f"b{i}", 4), 1000 + i)
        one = read_header(log.read_batches(0, 10**9)).length
        assert len(log.read_batches(0, 1)) == one  # at least one, even over the budget
        assert len(log.read_batches(0, 3 * one)) == 3 * one
        assert read_header(log.read_batches(9, 1)).base_offset == 8  # the batch holding 9
        assert log.read_batches(9, 10**9, end_offset=12) == log.read_batches(8, one)
        assert len(log.read_batches(9, 10**9, end_offset=13)) == 2 * one
        assert log.read_batches(24, 10**9) == b""
    finally:
        log.close()


def test_a_corrupt_gapped_or_stale_copy_is_refused_whole(tmp_path: Path) -> None:
    leader, follower = open_log(tmp_path / "l"), open_log(tmp_path / "f")
    try:
        leader.append(records("a", 1), 1000, leader_epoch=2)
        leader.append(records("b", 3), 1001, leader_epoch=2)
        data = leader.read_batches(0, 10**9)
        tampered = data[:-1] + bytes([data[-1] ^ 1])  # the second batch's last byte
        with pytest.raises(CorruptLog):
            follower.append_batches(tampered)
        assert follower.end_offset == 0  # the first, good batch was not written either
        with pytest.raises(ValueError, match="offset 1 where offset 0"):
            follower.append_batches(leader.read_batches(1, 10**9))
        follower.append(records("own", 1), 999, leader_epoch=5)
        with pytest.raises(StaleEpoch):
            follower.append_batches(leader.read_batches(1, 10**9))
        assert contents(follower) == [(0, 999, b"own-0", "k0")]
    finally:
        leader.close()
        follower.close()


def test_a_returning_replica_truncates_to_the_leaders_epoch_end_then_converges(
    tmp_path: Path,
) -> None:
    """KIP-101's case: the old leader wrote records no follower copied, then a follower
    became leader (epoch 1) and wrote others at the same offsets."""
    old, new = open_log(tmp_path / "old"), open_log(tmp_path / "new")
    try:
        old.append(records("shared", 10), 1000, leader_epoch=0)
        copy(old, new)
        old.append(records("lost", 2), 1001, leader_epoch=0)  # never replicated
        new.append(records("epoch1", 5), 1002, leader_epoch=1)  # the new leader's writes
        # The old leader returns as a follower: where did its latest epoch end?
        epoch, end = new.end_offset_for_epoch(old.epochs.latest_epoch)
        assert (epoch, end) == (0, 10)
        old.truncate_to(end)
        copy(new, old)
        assert contents(old) == contents(new)
        assert all(not v.startswith(b"lost") for _, _, v, _ in contents(old))
        assert old.epochs.entries == new.epochs.entries == [(0, 0), (1, 10)]
    finally:
        old.close()
        new.close()


def test_reset_to_empties_the_log_and_starts_it_at_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = open_log(path)
    for epoch in (1, 2):
        log.append(records(f"e{epoch}", 40), 1000 + epoch, leader_epoch=epoch)
    assert len(log.segments) > 1
    log.reset_to(500)
    assert (log.start_offset, log.end_offset, log.last_timestamp) == (500, 500, None)
    assert log.read(0, 10, 10**6) == []
    assert log.epochs.entries == []
    assert [p.name for p in sorted(path.glob("*.log"))] == ["00000000000000000500.log"]
    # A leader's batches from its start offset on follow, with their epochs.
    leader = open_log(tmp_path / "leader")
    leader.reset_to(500)
    leader.append(records("x", 3), 2000, leader_epoch=4)
    log.append_batches(leader.read_batches(500, 10**6))
    assert [(o, v) for o, _, v, _ in contents(log)] == [(500, b"x-0"), (501, b"x-1"), (502, b"x-2")]
    assert log.epochs.entries == [(4, 500)]
    log.close()
    leader.close()
    reopened = open_log(path)
    try:
        assert (reopened.start_offset, reopened.end_offset) == (500, 503)
        assert reopened.epochs.entries == [(4, 500)]
    finally:
        reopened.close()


def test_reset_to_the_active_segments_own_base_empties_it(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    try:
        log.append(records("a", 3), 1000, leader_epoch=1)
        log.reset_to(0)
        assert (log.start_offset, log.end_offset) == (0, 0)
        log.append(records("b", 2), 1001, leader_epoch=2)
        assert [v for _, _, v, _ in contents(log)] == [b"b-0", b"b-1"]
    finally:
        log.close()
