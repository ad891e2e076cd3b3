"""The Arrow forms of a batch (spark_bridge/arrow.py), without Spark: what `read`
yields from a shipped batch is the source schema with the same records."""

from __future__ import annotations

import base64
import pickle
from datetime import UTC, datetime
from typing import Any

import orjson

from herald.consumer import Message
from herald.spark.arrow import ARROW_SCHEMA, SHIPPED_SCHEMA, encode, schema_batch, shipped_batch


def _record(offset: int, **fields: Any) -> Message:
    data = {
        "topic": "t",
        "id": f"1-{offset}",
        "partition": 1,
        "offset": offset,
        "timestamp": 1_700_000_000_123 + offset,
    }
    return Message.from_json(data | fields)


def _read(records: list[Message]) -> list[dict[str, Any]]:
    shipped = pickle.loads(pickle.dumps(shipped_batch([encode(r) for r in records])))
    batch = schema_batch(shipped)
    batch.validate(full=True)
    assert batch.schema.equals(ARROW_SCHEMA)
    rows: list[dict[str, Any]] = batch.to_pylist()
    return rows


def test_json_and_bytes_records_keep_every_column() -> None:
    records = [
        _record(0, value={"i": 0, "s": "é"}, key="k", headers={"a": "1", "b": "2"}),
        _record(1, value_b64=base64.b64encode(b"\xff\x00raw").decode()),
        _record(2, value=None),
        _record(3, value="text", headers={"c": "3"}),
    ]
    rows = _read(records)
    assert [r["offset"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["topic"] == "t" and rows[0]["partition"] == 1 and rows[0]["id"] == "1-0"
    assert rows[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert rows[0]["key"] == "k" and rows[1]["key"] is None
    assert [dict(r["headers"]) for r in rows] == [{"a": "1", "b": "2"}, {}, {}, {"c": "3"}]
    assert orjson.loads(rows[0]["value"]) == {"i": 0, "s": "é"}
    assert rows[0]["value_bytes"] == rows[0]["value"].encode()
    assert rows[1]["value"] is None and rows[1]["value_bytes"] == b"\xff\x00raw"
    assert rows[2]["value"] == "null" and rows[3]["value"] == '"text"'


def test_the_shipped_form_carries_each_value_once() -> None:
    assert "value" not in SHIPPED_SCHEMA.names
    assert "value_bytes" in SHIPPED_SCHEMA.names


def test_a_sliced_shipped_batch_reads_the_same_records() -> None:
    records = [
        _record(i, value={"i": i}) if i % 3 else _record(i, value_b64="AAE=") for i in range(10)
    ]
    shipped = shipped_batch([encode(r) for r in records])
    rows = schema_batch(shipped.slice(4, 4)).to_pylist()
    assert [r["offset"] for r in rows] == [4, 5, 6, 7]
    assert [r["value"] for r in rows] == ['{"i":4}', '{"i":5}', None, '{"i":7}']
    assert rows[2]["value_bytes"] == b"\x00\x01"


def test_an_empty_batch_has_the_schema() -> None:
    assert schema_batch(shipped_batch([])).schema.equals(ARROW_SCHEMA)
