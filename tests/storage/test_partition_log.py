"""PartitionLog, the synchronous core: appends, reads, rolls, timestamps, retention,
replication hooks — on real directories."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from herald.protocol.errors import StorageUnavailable
from storage.partition_log import DetachedSync, LogConfig, PartitionLog
from storage.record import NewRecord, ValueKind

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=300)


def rec(i: int, **kw) -> NewRecord:
    return NewRecord(f"value-{i}".encode(), **kw)


def fill(log: PartitionLog, batches: int, per_batch: int = 10, ts0: int = 1000) -> None:
    for b in range(batches):
        log.append([rec(b * per_batch + j) for j in range(per_batch)], ts0 + b)


@pytest.fixture
def log(tmp_path: Path):
    partition_log = PartitionLog(tmp_path / "t" / "0", 0, SMALL)
    yield partition_log
    partition_log.close()


def test_a_new_log_is_empty_and_starts_at_zero(log):
    assert (log.start_offset, log.end_offset, log.size_bytes) == (0, 0, 0)
    assert log.read(0, 10, 1000) == []
    assert [p.name for p in sorted(log.directory.iterdir())] == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]


def test_appends_get_contiguous_offsets_and_read_back(log):
    assert log.append([rec(0), rec(1)], 5) == 0
    assert log.append([rec(2, key="k", headers={"h": "v"}, kind=ValueKind.BYTES)], 6) == 2
    records = log.read(0, 10, 10_000)
    assert [(r.offset, r.timestamp, r.value) for r in records] == [
        (0, 5, b"value-0"),
        (1, 5, b"value-1"),
        (2, 6, b"value-2"),
    ]
    assert (records[2].key, records[2].headers, records[2].kind) == (
        "k",
        {"h": "v"},
        ValueKind.BYTES,
    )
    assert records[2].id == "0-2"


def test_segments_roll_at_segment_bytes_and_reads_cross_them(log):
    fill(log, 40)
    assert len(log.segments) > 3
    assert all(s.size <= SMALL.segment_bytes for s in log.segments)
    # Only the active segment keeps its files open; the others were fsynced and closed.
    assert [s.sealed for s in log.segments] == [True] * (len(log.segments) - 1) + [False]
    assert [s.path.name[:20] for s in log.segments] == [
        f"{s.base_offset:020d}" for s in log.segments
    ]
    records = log.read(0, 1000, 10**9)
    assert [r.offset for r in records] == list(range(400))
    assert [r.value for r in records] == [f"value-{i}".encode() for i in range(400)]
    middle = log.read(137, 50, 10**9)
    assert [r.offset for r in middle] == list(range(137, 187))


def test_segments_roll_by_age(tmp_path):
    log = PartitionLog(tmp_path, 0, LogConfig(segment_ms=1000))
    log.append([rec(0)], 10_000)
    log.append([rec(1)], 10_500)
    log.append([rec(2)], 11_000)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_read_limits_by_records_and_bytes_but_returns_at_least_one(log):
    fill(log, 5)
    assert len(log.read(0, 7, 10**9)) == 7
    assert len(log.read(0, 100, 3 * len(b"value-0"))) == 3
    assert [r.offset for r in log.read(4, 100, 1)] == [4]
    assert log.read(50, 10, 10**9) == []
    assert [r.offset for r in log.read(0, 100, 10**9, end_offset=12)] == list(range(12))


def test_offset_for_timestamp_finds_the_first_record_at_or_after(log):
    fill(log, 30, per_batch=5)  # batch b has timestamp 1000 + b
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(1000) == 0
    assert log.offset_for_timestamp(1017) == 85
    assert log.offset_for_timestamp(1029) == 145
    assert log.offset_for_timestamp(1030) == log.end_offset == 150


def test_time_retention_deletes_whole_old_segments_only(log):
    fill(log, 40)  # timestamps 1000..1039
    segments = log.segments
    first_kept = next(s for s in segments if s.last_timestamp >= 1020)
    deleted = log.apply_retention(now_ms=2020, retention_ms=1000, retention_bytes=None)
    assert deleted == segments.index(first_kept)
    assert log.start_offset == first_kept.base_offset
    assert log.read(0, 1, 10**9)[0].offset == first_kept.base_offset
    assert not segments[0].path.exists()
    assert log.end_offset == 400


def test_time_retention_rolls_an_expired_active_segment_keeping_the_end(log):
    fill(log, 40)
    log.apply_retention(now_ms=10**9, retention_ms=1000, retention_bytes=None)
    assert log.start_offset == log.end_offset == 400
    assert log.read(0, 10, 10**9) == []
    assert log.append([rec(400)], 5) == 400  # offsets are never reused
    log.close()
    reopened = PartitionLog(log.directory, 0, SMALL)
    assert (reopened.start_offset, reopened.end_offset) == (400, 401)
    reopened.close()


def test_size_retention_deletes_segments_wholly_past_the_newest_retention_bytes(log):
    fill(log, 40)
    limit = 5000
    log.apply_retention(now_ms=0, retention_ms=None, retention_bytes=limit)
    # As Kafka: the newest `limit` bytes are kept; an older segment goes only when all
    # of it lies beyond them.
    assert log.size_bytes >= limit
    assert log.size_bytes - log.segments[0].size < limit
    assert log.read(0, 1000, 10**9)[-1].offset == 399


def test_readers_survive_retention_deleting_segments_under_them(log):
    fill(log, 60)
    errors: list[BaseException] = []
    done = threading.Event()

    def read_in_a_loop() -> None:
        try:
            while not done.is_set():
                records = log.read(0, 1000, 10**9)
                assert records
                assert [r.offset for r in records] == list(range(records[0].offset, 600))
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read_in_a_loop)
    reader.start()
    try:
        for now in range(2000, 2060, 2):
            log.apply_retention(now_ms=now, retention_ms=1000, retention_bytes=None)
    finally:
        done.set()
        reader.join()
    assert not errors
    assert log.start_offset > 0


def test_truncate_to_cuts_inside_a_batch_and_appends_continue(log):
    fill(log, 20)
    log.truncate_to(137)
    assert log.end_offset == 137
    assert [r.offset for r in log.read(130, 100, 10**9)] == list(range(130, 137))
    assert log.append([rec(999)], 3000) == 137
    log.truncate_to(10)
    assert log.end_offset == 10
    assert len(log.segments) == 1
    assert log.append([rec(10)], 3001) == 10
    assert [r.value for r in log.read(9, 5, 10**9)] == [b"value-9", b"value-10"]
    log.truncate_to(10)
    log.truncate_to(0)
    assert (log.start_offset, log.end_offset, log.size_bytes) == (0, 0, 0)


def test_append_at_replicates_records_with_their_timestamps(log):
    log.append_at(0, [(rec(0), 7), (rec(1), 9)])
    assert [(r.offset, r.timestamp) for r in log.read(0, 10, 10**9)] == [(0, 7), (1, 9)]
    with pytest.raises(ValueError):
        log.append_at(5, [(rec(5), 10)])


def test_flush_counts_fsyncs(log):
    fill(log, 2)
    log.flush()
    log.flush()
    assert log.fsync_count == 2


class LogMachine(RuleBasedStateMachine):
    """Any sequence of appends, reads, reopens, truncates and retention returns exactly
    what was appended (from the start offset on)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="herald-log-"))
        self.config = LogConfig(segment_bytes=700, index_interval_bytes=150)
        self.log = PartitionLog(self.dir, 0, self.config)
        self.model: list[tuple[bytes, str | None, int]] = []
        self.clock = 0

    @rule(
        values=st.lists(st.binary(max_size=60), min_size=1, max_size=8),
        key=st.none() | st.text(max_size=5),
    )
    def append(self, values, key):
        self.clock += 1
        first = self.log.append([NewRecord(v, ValueKind.BYTES, key) for v in values], self.clock)
        assert first == len(self.model)
        self.model += [(v, key, self.clock) for v in values]

    @rule(data=st.data())
    def read(self, data):
        offset = data.draw(st.integers(0, len(self.model) + 2))
        max_records = data.draw(st.integers(1, 30))
        records = self.log.read(offset, max_records, 10**9)
        start = max(offset, self.log.start_offset)
        expected = self.model[start : start + max_records]
        assert [(r.value, r.key, r.timestamp) for r in records] == expected
        assert [r.offset for r in records] == list(range(start, start + len(expected)))

    @rule()
    def reopen(self):
        self.log.close()
        self.log = PartitionLog(self.dir, 0, self.config)
        assert self.log.recovered_bytes == 0

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(self.log.start_offset, len(self.model)))
        self.log.truncate_to(offset)
        del self.model[offset:]

    @rule(keep=st.integers(500, 3000))
    def retention(self, keep):
        self.log.apply_retention(now_ms=0, retention_ms=None, retention_bytes=keep)

    @invariant()
    def ends_match(self):
        assert self.log.end_offset == len(self.model)
        assert self.log.start_offset <= self.log.end_offset

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir)


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_after_a_failed_fsync_the_next_flush_rewrites_the_log_with_the_same_bytes(log):
    """fsyncgate (tests/storage/test_fsync_failure.py shows it on a failing disk): after a
    failed fsync the writer's flush copies the log to a new file before it may succeed.
    The failure here is a real one from the OS: the fdatasync of a pipe (EINVAL)."""
    fill(log, 3)
    log.flush()
    fill(log, 2, ts0=2000)
    path = log.segments[-1].path
    before, inode = path.read_bytes(), path.stat().st_ino
    pipe_out, pipe_in = os.pipe()
    try:
        detached = log.flush_descriptor()
        assert detached is not None
        os.close(detached.fd)
        failing = DetachedSync(detached.segment, pipe_out, detached.size)
        with pytest.raises(StorageUnavailable, match="cannot fsync"):
            log.flush_detached(failing)  # it closes the descriptor it is given
    finally:
        os.close(pipe_in)
    log.flush()
    assert path.stat().st_ino != inode
    assert path.read_bytes() == before
    assert [r.offset for r in log.read(0, 100, 1 << 20)] == list(range(50))
    fill(log, 1, ts0=3000)  # appends go on, to the new file
    log.flush()
    assert log.end_offset == 60
    assert len(log.read(0, 100, 1 << 20)) == 60


def test_a_copy_left_by_a_crash_during_a_rewrite_is_removed_on_opening(tmp_path):
    directory = tmp_path / "t" / "0"
    log = PartitionLog(directory, 0, SMALL)
    fill(log, 2)
    log.close()
    stray = log.segments[-1].path.with_name(log.segments[-1].path.name + ".rewrite")
    stray.write_bytes(b"half a copy")
    log = PartitionLog(directory, 0, SMALL)
    try:
        assert not stray.exists()
        assert log.end_offset == 20
    finally:
        log.close()


def test_only_an_unclean_stop_checks_and_copies_the_active_segment_whole(tmp_path):
    directory = tmp_path / "t" / "0"
    log = PartitionLog(directory, 0, SMALL)
    fill(log, 1)
    log.close()
    path = log.segments[-1].path
    inode = path.stat().st_ino
    log = PartitionLog(directory, 0, SMALL)  # after a clean close: as it was
    log.sync_recovered()
    assert path.stat().st_ino == inode
    fill(log, 1, ts0=2000)
    log.flush()
    for segment in log.segments:  # a crash: no close
        segment._close_files()
    log = PartitionLog(directory, 0, SMALL)
    try:
        log.sync_recovered()
        assert path.stat().st_ino != inode  # copied: its bytes are known to be on disk
        assert [r.offset for r in log.read(0, 100, 1 << 20)] == list(range(20))
    finally:
        log.close()
