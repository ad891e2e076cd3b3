"""The hand-tuned record encoder (subscribers/wire.py record_json, the hot path of every
delivery and read) writes what the declared models say (herald/protocol/records.py):
each form of a record decodes into the model it is published as, field for field."""

from __future__ import annotations

import msgspec
import pytest

from herald.protocol.records import DeliveredRecord, Record
from storage.record import Record as StoredRecord
from storage.record import ValueKind
from subscribers.wire import record_json

RECORDS = [
    StoredRecord(0, 7, 1_700_000_000_000, b'{"a":[1,2.5,null]}'),
    StoredRecord(3, 0, 5, b'"text"', key="k", headers={"h": "v", "é": "ü"}),
    StoredRecord(1, 2, 9, b"\x00\xffbytes", kind=ValueKind.BYTES, key=None),
    StoredRecord(0, 1, 10, b"null", deliver_at=70),
]


@pytest.mark.parametrize("stored", RECORDS)
def test_a_record_is_a_record_model(stored: StoredRecord) -> None:
    decoded = msgspec.json.decode(record_json("orders", stored), type=Record, strict=True)
    assert (decoded.topic, decoded.partition, decoded.offset) == (
        "orders",
        stored.partition,
        stored.offset,
    )
    assert decoded.id == f"{stored.partition}-{stored.offset}"
    assert (decoded.key, decoded.headers) == (stored.key, dict(stored.headers))
    assert decoded.deliver_at == (msgspec.UNSET if stored.deliver_at is None else stored.deliver_at)
    if stored.kind is ValueKind.BYTES:
        assert decoded.value is msgspec.UNSET and decoded.value_b64 is not msgspec.UNSET
    else:
        assert decoded.value_b64 is msgspec.UNSET
        assert msgspec.json.encode(decoded.value) == stored.value


@pytest.mark.parametrize("stored", RECORDS)
def test_a_delivered_record_is_a_delivered_record_model(stored: StoredRecord) -> None:
    encoded = record_json("orders", stored, subscription="billing", attempt=2)
    decoded = msgspec.json.decode(encoded, type=DeliveredRecord, strict=True)
    assert (decoded.subscription, decoded.attempt) == ("billing", 2)
