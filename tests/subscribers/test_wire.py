"""A batch of deliveries encoded at once is, record for record, what record_json makes."""

from __future__ import annotations

import orjson

from delivery.events import Delivery
from storage.record import Record, ValueKind
from subscribers.wire import deliveries_json, record_json


def test_a_batch_is_encoded_as_each_record_alone() -> None:
    records = [
        Record(0, 7, 1_700_000_000_000, b'{"a":[1,2]}'),
        Record(1, 8, 1_700_000_000_001, b'"caf\\u00e9 100%"', ValueKind.JSON, "k%s", {"h": "%d"}),
        Record(2, 9, 1_700_000_000_002, b"\x00\x01", ValueKind.BYTES, None, {}),
        Record(0, 10, 1_700_000_000_003, b"null", deliver_at=1_700_000_060_003),
    ]
    deliveries = [Delivery(r, attempt) for r, attempt in zip(records, (1, 3, 1, 3), strict=True)]
    for topic, subscription in (("orders", "billing"), ("t%d", "s%s"), ("t", None)):
        batch = deliveries_json(topic, deliveries, subscription)
        expected = [record_json(topic, d.record, subscription, d.attempt) for d in deliveries]
        assert batch == expected
        parsed = [orjson.loads(item) for item in batch]
        assert [m["topic"] for m in parsed] == [topic] * 4
        assert [m.get("attempt") for m in parsed] == [1, 3, 1, 3]
        assert parsed[3]["deliver_at"] == 1_700_000_060_003
    assert deliveries_json("t", [], "s") == []
