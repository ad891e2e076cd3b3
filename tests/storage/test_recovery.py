"""Opening a log recovers it: torn or corrupt tails are cut at the last whole batch,
damaged or missing indexes are rebuilt, and every whole batch survives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.partition_log import LogConfig, PartitionLog
from storage.record import NewRecord

CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=300)


def build(directory: Path, batches: int = 30) -> dict:
    """A log of `batches` batches of 5 records; returns what a healthy reopen shows."""
    log = PartitionLog(directory, 0, CONFIG)
    for b in range(batches):
        log.append([NewRecord(f"r{b}-{i}".encode(), key=str(b)) for i in range(5)], 1000 + b)
    state = snapshot(log)
    log.close()
    return state


def snapshot(log: PartitionLog) -> dict:
    return {
        "end": log.end_offset,
        "segments": [
            (s.base_offset, s.next_offset, s.size, s.last_timestamp) for s in log.segments
        ],
        "offset_index": [(s.offset_index.offsets, s.offset_index.positions) for s in log.segments],
        "time_index": [(s.time_index.timestamps, s.time_index.offsets) for s in log.segments],
        "records": [(r.offset, r.timestamp, r.value, r.key) for r in log.read(0, 10**6, 10**9)],
    }


def reopen(directory: Path) -> PartitionLog:
    return PartitionLog(directory, 0, CONFIG)


def files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


@pytest.fixture
def healthy(tmp_path: Path) -> dict:
    state = build(tmp_path)
    assert len(state["segments"]) >= 3
    return state


def test_a_clean_log_reopens_unchanged(tmp_path, healthy):
    log = reopen(tmp_path)
    assert snapshot(log) == healthy
    assert log.recovered_bytes == 0
    log.close()


def test_garbage_after_the_last_batch_is_cut(tmp_path, healthy):
    last = files(tmp_path, ".log")[-1]
    with last.open("ab") as f:
        f.write(b"\x00garbage" * 10)
    log = reopen(tmp_path)
    assert log.recovered_bytes == 80
    assert snapshot(log) == healthy
    assert log.append([NewRecord(b"next")], 5000) == healthy["end"]
    log.close()


@pytest.mark.parametrize("keep", [1, 20, 45])
def test_a_torn_last_batch_is_cut_at_the_last_whole_batch(tmp_path, healthy, keep):
    last = files(tmp_path, ".log")[-1]
    size = healthy["segments"][-1][2]
    os.truncate(last, size - keep)  # the last batch of 5 records lost `keep` bytes
    log = reopen(tmp_path)
    assert log.end_offset == healthy["end"] - 5
    assert snapshot(log)["records"] == healthy["records"][:-5]
    assert log.append([NewRecord(b"next")], 5000) == healthy["end"] - 5
    log.close()


@pytest.mark.parametrize("from_end", [1, 2])
def test_a_crc_mismatch_cuts_the_tail_from_the_bad_batch(tmp_path, from_end):
    # Recovery checks the batches from the last index entry on (where a crash can tear);
    # earlier ones were whole when their entry was written. 29 batches leave two there.
    healthy = build(tmp_path, batches=29)
    base = healthy["segments"][-1][0]
    last_entry = base + healthy["offset_index"][-1][0][-1]
    bad_batch = healthy["end"] - 5 * from_end
    assert bad_batch >= last_entry, "the layout moved: pick batches after the last entry"
    last = files(tmp_path, ".log")[-1]
    value = next(r[2] for r in healthy["records"] if r[0] == bad_batch + 2)
    with last.open("r+b") as f:
        data = f.read()
        f.seek(data.index(value))
        f.write(b"X")
    log = reopen(tmp_path)
    assert log.end_offset == bad_batch
    assert log.recovered_bytes > 0
    assert snapshot(log)["records"] == healthy["records"][:bad_batch]
    log.close()


def test_a_truncated_index_is_rebuilt(tmp_path, healthy):
    for index in files(tmp_path, ".index"):
        os.truncate(index, index.stat().st_size - 3)
    log = reopen(tmp_path)
    assert snapshot(log) == healthy
    log.close()


def test_a_missing_index_and_time_index_are_rebuilt(tmp_path, healthy):
    for index in files(tmp_path, ".index") + files(tmp_path, ".timeindex"):
        index.unlink()
    log = reopen(tmp_path)
    assert snapshot(log) == healthy
    assert log.offset_for_timestamp(1017) == 85
    log.close()


def test_a_corrupted_time_index_is_rebuilt(tmp_path, healthy):
    for index in files(tmp_path, ".timeindex"):
        data = bytearray(index.read_bytes())
        data[0:8] = (2**62).to_bytes(8, "little")  # a first timestamp after all others
        index.write_bytes(bytes(data))
    log = reopen(tmp_path)
    assert snapshot(log) == healthy
    assert log.offset_for_timestamp(1017) == 85
    log.close()


def test_an_index_pointing_into_the_middle_of_a_batch_is_rebuilt(tmp_path, healthy):
    for index in files(tmp_path, ".index"):
        data = bytearray(index.read_bytes())
        last_position = int.from_bytes(data[-4:], "little")
        data[-4:] = (last_position + 7).to_bytes(4, "little")
        index.write_bytes(bytes(data))
    log = reopen(tmp_path)
    assert snapshot(log) == healthy
    log.close()


def test_an_index_entry_for_a_torn_batch_is_dropped(tmp_path):
    # After a power loss the index can keep an entry whose batch did not reach the disk.
    log = PartitionLog(tmp_path, 0, LogConfig(index_interval_bytes=1))  # an entry per batch
    for b in range(6):
        log.append([NewRecord(b"x" * 50)], 1000 + b)
    last_position = log.segments[-1].offset_index.positions[-1]
    log.close()
    os.truncate(files(tmp_path, ".log")[-1], last_position + 30)
    log = PartitionLog(tmp_path, 0, LogConfig(index_interval_bytes=1))
    assert log.end_offset == 5
    assert log.segments[-1].offset_index.offsets == [1, 2, 3, 4]
    assert log.segments[-1].last_timestamp == 1004
    log.close()


def test_an_index_without_its_log_is_removed(tmp_path, healthy):
    orphan = tmp_path / f"{10**6:020d}.index"
    orphan.write_bytes(b"\x01" * 16)
    log = reopen(tmp_path)
    assert not orphan.exists()
    assert snapshot(log) == healthy
    log.close()
