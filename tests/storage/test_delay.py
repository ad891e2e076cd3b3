"""PROTOCOL §8 delayed delivery in the log: a record's delay is stored with it (a record
flag and a u32), survives a reopen, and leaves records without a delay as they were."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from herald.protocol.limits import MAX_DELAY_MS
from storage import encryption
from storage.batch import (
    HEADER_SIZE,
    REC_DELAYED,
    check_batch,
    decode_batch,
    encode_batch,
    make_records,
    read_header,
)
from storage.errors import CorruptLog
from storage.partition import Partition
from storage.partition_log import LogConfig, PartitionLog
from storage.record import Acks, NewRecord, ValueKind
from storage.writer import WriterPool

_FLAGS_AT = HEADER_SIZE + 4 + 8 + 1  # offset_delta, timestamp, kind, then the flags byte

text = st.text(max_size=10)
delayed_records = st.builds(
    NewRecord,
    value=st.binary(max_size=50),
    kind=st.sampled_from(ValueKind),
    key=st.none() | text,
    headers=st.dictionaries(text, text, max_size=2),
    producer_id=st.none() | text,
    delay_ms=st.sampled_from([0, 1, 5000, MAX_DELAY_MS]),
)


def decode(data: bytes) -> list:
    header = read_header(data)
    check_batch(data, 0, header)
    return decode_batch(data, 0, header, partition=0)


@given(st.lists(delayed_records, min_size=1, max_size=10), st.integers(0, 2**41))
def test_delays_round_trip_as_deliver_at(records, timestamp):
    decoded = decode(encode_batch(7, records, timestamp).data)
    expected = [timestamp + r.delay_ms if r.delay_ms else None for r in decoded]
    assert [r.deliver_at for r in decoded] == expected
    assert [r.delay_ms for r in decoded] == [r.delay_ms for r in records]
    # The records an append returns (the tail cache) agree with the decoded ones.
    assert make_records(0, 7, timestamp, records) == decoded


def test_a_record_without_a_delay_is_laid_out_as_before():
    plain = encode_batch(0, [NewRecord(b"x")], 1).data
    delayed = encode_batch(0, [NewRecord(b"x", delay_ms=10)], 1).data
    assert plain[_FLAGS_AT] == 0  # the byte every earlier version wrote as 0
    assert delayed[_FLAGS_AT] == REC_DELAYED
    assert len(delayed) == len(plain) + 4
    assert decode(plain)[0].deliver_at is None
    assert decode(delayed)[0].deliver_at == 11


def test_unknown_record_flags_are_corruption():
    data = bytearray(encode_batch(0, [NewRecord(b"x")], 1).data)
    data[_FLAGS_AT] = 0x80
    struct.pack_into("<I", data, 4, crc32c.crc32c(bytes(data[8:])))
    with pytest.raises(CorruptLog):
        decode(bytes(data))


def test_an_encrypted_batch_keeps_the_delay():
    encryption.configure(encryption.Keyring.parse(encryption.new_key_line(1)))
    try:
        sealed = encode_batch(0, [NewRecord(b"x", delay_ms=10), NewRecord(b"y")], 1).data
        assert [r.deliver_at for r in decode(sealed)] == [11, None]
    finally:
        encryption.configure(None)


def test_a_delay_beyond_the_maximum_is_refused():
    with pytest.raises(ValueError):
        encode_batch(0, [NewRecord(b"x", delay_ms=MAX_DELAY_MS + 1)], 1)


@pytest.fixture
def pool() -> Iterator[WriterPool]:
    writers = WriterPool(max_writers=1)
    yield writers
    writers.close()


async def test_deliver_at_survives_a_reopen(tmp_path, pool):
    partition = await Partition.open(tmp_path, "orders", 0, writers=pool)
    batch = [NewRecord(b"a"), NewRecord(b"b", delay_ms=60_000), NewRecord(b"c")]
    first, timestamp = await partition.append(batch, Acks.ALL)
    cached = await partition.read(first, 10, 10**6)
    assert [r.deliver_at for r in cached] == [None, timestamp + 60_000, None]
    await partition.close()
    partition = await Partition.open(tmp_path, "orders", 0, writers=pool)
    assert partition.read_cached(0, 10, 10**6) is None
    assert await partition.read(0, 10, 10**6) == cached
    await partition.close()


def test_a_truncation_inside_a_batch_keeps_the_delays_it_rewrites(tmp_path):
    log = PartitionLog(tmp_path / "t" / "0", 0, LogConfig())
    batch = [NewRecord(b"a", delay_ms=100), NewRecord(b"b"), NewRecord(b"c", delay_ms=5)]
    log.append(batch, 1000)
    log.truncate_to(2)  # rewrites the first two records of the batch
    assert [(r.value, r.deliver_at) for r in log.read(0, 10, 10**6)] == [
        (b"a", 1100),
        (b"b", None),
    ]
    log.close()
