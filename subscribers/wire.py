"""The JSON form of a record on the wire (PROTOCOL §1, §3 `deliver`, §4 webhook body).

A JSON value is stored as its compact JSON text, so it is spliced into the output
as is: no record is parsed again on the way out.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

import orjson

from storage.record import Record, ValueKind


def record_json(
    topic: str, record: Record, subscription: str | None = None, attempt: int | None = None
) -> bytes:
    """One record as a JSON object; with ``subscription``/``attempt`` for deliveries."""
    head: dict[str, object] = {
        "topic": topic,
        "id": f"{record.partition}-{record.offset}",
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": record.key,
        "headers": record.headers,
    }
    if attempt is not None:
        head["subscription"] = subscription
        head["attempt"] = attempt
    if record.kind is ValueKind.BYTES:
        head["value_b64"] = base64.b64encode(record.value).decode("ascii")
        return orjson.dumps(head)
    return b"".join((orjson.dumps(head)[:-1], b',"value":', record.value, b"}"))


def json_array(items: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def deliver_frame(items: Iterable[bytes]) -> bytes:
    """A `deliver` frame around already encoded records."""
    return b'{"type":"deliver","messages":[' + b",".join(items) + b"]}"
