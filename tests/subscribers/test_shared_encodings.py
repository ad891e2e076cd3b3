"""The tail JSON shared by every tail of a topic: the bytes each tail would have made,
encoded once per record, and bounded."""

from __future__ import annotations

from storage.record import Record, ValueKind
from subscribers.codec import JSON, MSGPACK
from subscribers.packed import packed_tail_record
from subscribers.tail import SharedEncodings, TailRegistry
from subscribers.wire import record_json


def record(offset: int, value: bytes = b'"v"', kind: ValueKind = ValueKind.JSON) -> Record:
    return Record(0, offset, 1_700_000_000_000 + offset, value, kind, "k", {"h": "1"})


def test_a_record_is_encoded_once_as_every_tail_would_encode_it() -> None:
    encodings = SharedEncodings()
    first, raw = record(0), record(1, b"\x00\xff", ValueKind.BYTES)
    for one in (first, raw):
        made = encodings.encode("orders", one)
        assert made == record_json("orders", one, None, 1)
        assert encodings.encode("orders", one) is made  # the second tail's: the same bytes
    # An equal record that is another object (read again from disk) is encoded again.
    again = record(0)
    assert encodings.encode("orders", again) == encodings.encode("orders", first)
    assert encodings.encode("orders", again) is not encodings.encode("orders", first)
    # The topic is part of the bytes: another topic's name is never served.
    assert b'"topic":"other"' in encodings.encode("other", first)


def test_the_encodings_kept_are_bounded_by_their_bytes() -> None:
    encodings = SharedEncodings(max_bytes=4096)
    records = [record(i, b'"' + b"x" * 200 + b'"') for i in range(100)]
    for one in records:
        encodings.encode("t", one)
    size = len(encodings.encode("t", records[-1]))
    assert len(encodings) == 4096 // size  # the newest that fit
    big = record(1000, b'"' + b"y" * 2000 + b'"')  # over a quarter of the bound: not kept
    assert encodings.encode("t", big) == record_json("t", big, None, 1)
    assert len(encodings) == 4096 // size


def test_each_encoding_has_its_own_shared_bytes() -> None:
    """A msgpack tail and a JSON tail of the same record never get each other's bytes."""
    registry = TailRegistry()
    as_json, as_msgpack = registry.encodings_for(JSON), registry.encodings_for(MSGPACK)
    assert registry.encodings_for(JSON) is as_json
    assert registry.encodings_for(MSGPACK) is as_msgpack
    one = record(0)
    assert as_msgpack.encode("t", one) == packed_tail_record("t", one)
    assert as_json.encode("t", one) == record_json("t", one, None, 1)
    assert as_msgpack.encode("t", one) == packed_tail_record("t", one)  # kept, not replaced
