"""Batch framing: what is encoded comes back, and damage is detected."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.batch import (
    ATTR_ENCRYPTED,
    HEADER_SIZE,
    check_batch,
    decode_batch,
    encode_batch,
    read_header,
)
from storage.errors import CorruptLog
from storage.record import NewRecord, ValueKind

text = st.text(max_size=20)
new_records = st.builds(
    NewRecord,
    value=st.binary(max_size=200),
    kind=st.sampled_from(ValueKind),
    key=st.none() | text,
    headers=st.dictionaries(text, text, max_size=3),
    producer_id=st.none() | text,
)


def decode(data: bytes, from_offset: int = 0) -> list:
    header = read_header(data)
    check_batch(data, 0, header)
    return decode_batch(data, 0, header, partition=3, from_offset=from_offset)


@given(st.lists(new_records, min_size=1, max_size=20), st.integers(0, 2**40), st.integers(0, 2**41))
def test_records_round_trip_through_a_batch(records, base, timestamp):
    batch = encode_batch(base, records, timestamp)
    decoded = decode(batch.data)
    assert [(r.offset, r.timestamp, r.partition) for r in decoded] == [
        (base + i, timestamp, 3) for i in range(len(records))
    ]
    assert [NewRecord(r.value, r.kind, r.key, r.headers, r.producer_id) for r in decoded] == records


def test_header_keeps_offsets_and_timestamps_readable():
    batch = encode_batch(100, [NewRecord(b"a"), NewRecord(b"b"), NewRecord(b"c")], [5, 6, 9])
    header = read_header(batch.data)
    assert (header.base_offset, header.record_count, header.next_offset) == (100, 3, 103)
    assert (header.first_timestamp, header.last_timestamp) == (5, 9)
    assert header.length == len(batch.data)
    assert header.attributes & ATTR_ENCRYPTED == 0
    assert [r.timestamp for r in decode(batch.data)] == [5, 6, 9]


def test_decode_can_skip_records_before_an_offset():
    batch = encode_batch(10, [NewRecord(str(i).encode()) for i in range(5)], 1)
    assert [r.value for r in decode(batch.data, from_offset=13)] == [b"3", b"4"]


@pytest.mark.parametrize("position", [8, 12, HEADER_SIZE + 3, -1])
def test_a_flipped_byte_fails_the_crc(position):
    data = bytearray(encode_batch(0, [NewRecord(b"hello", key="k")], 1).data)
    data[position] ^= 0x40
    with pytest.raises(CorruptLog):
        decode(bytes(data))


def test_a_torn_batch_is_detected():
    data = encode_batch(0, [NewRecord(b"x" * 100)], 1).data
    with pytest.raises(CorruptLog):
        decode(data[:-1])
    with pytest.raises(CorruptLog):
        read_header(data[: HEADER_SIZE - 1])


def test_zeros_are_not_a_batch():
    with pytest.raises(CorruptLog):
        read_header(bytes(HEADER_SIZE))


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError):
        encode_batch(0, [], 1)
