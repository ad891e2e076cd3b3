"""The JSON form of a record on the wire (PROTOCOL §1, §3 `deliver`, §4 webhook body).

A JSON value is stored as its compact JSON text, so it is spliced into the output
as is: no record is parsed again on the way out.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec
import orjson
from msgspec import UNSET, Raw, UnsetType

from herald.protocol.frames import AckedFrame, ErrorCode, ErrorFrame, ReadyFrame
from storage.record import Record, ValueKind

if TYPE_CHECKING:
    from delivery.events import Delivery


def record_json(
    topic: str, record: Record, subscription: str | None = None, attempt: int | None = None
) -> bytes:
    """One record as a JSON object; with ``subscription``/``attempt`` for deliveries.

    A tail delivery passes ``attempt`` without ``subscription``: PROTOCOL §3 says its
    records carry no `subscription`, so the member is left out rather than null.

    The hot path of every delivery: the bytes orjson would make of the record's dict
    (compact, members in this order), by formatting instead of building a dict.
    """
    return _RECORD[record.kind] % (
        orjson.dumps(topic),
        record.partition,
        record.offset,
        record.partition,
        record.offset,
        record.timestamp,
        b"" if record.deliver_at is None else b',"deliver_at":%d' % record.deliver_at,
        b"null" if record.key is None else orjson.dumps(record.key),
        orjson.dumps(record.headers) if record.headers else b"{}",
        _delivery_members(subscription, attempt),
        _value(record),
    )


def deliveries_json(
    topic: str, deliveries: Sequence[Delivery], subscription: str | None
) -> list[bytes]:
    """``record_json(topic, d.record, subscription, d.attempt)`` of each delivery, with
    what the batch's records share (the topic, the subscription, an attempt's members)
    encoded once for the batch instead of once a record."""
    topic_json = orjson.dumps(topic).replace(b"%", b"%%")
    formats: dict[tuple[int, ValueKind], bytes] = {}
    out: list[bytes] = []
    append = out.append
    for delivery in deliveries:
        record = delivery.record
        attempt = delivery.attempt
        form = formats.get((attempt, record.kind))
        if form is None:
            members = _delivery_members(subscription, attempt).replace(b"%", b"%%")
            form = _DELIVERY[record.kind] % (topic_json, members)
            formats[attempt, record.kind] = form
        key = record.key
        deliver_at = record.deliver_at
        append(
            form
            % (
                record.partition,
                record.offset,
                record.partition,
                record.offset,
                record.timestamp,
                b"" if deliver_at is None else b',"deliver_at":%d' % deliver_at,
                b"null" if key is None else orjson.dumps(key),
                orjson.dumps(record.headers) if record.headers else b"{}",
                _value(record),
            )
        )
    return out


def _value(record: Record) -> bytes:
    """The value member's JSON: a JSON value is stored as its compact text; bytes go as
    canonical base64, whose alphabet needs no escaping inside a JSON string."""
    if record.kind is ValueKind.BYTES:
        return binascii.b2a_base64(record.value, newline=False)
    return record.value


# "id" is Record.id ("{partition}-{offset}", PROTOCOL §1), formatted in place; the
# value is `value` (a JSON value) or `value_b64` (bytes, PROTOCOL §1).
_RECORD_HEAD = (
    b'{"topic":%s,"id":"%d-%d","partition":%d,"offset":%d,"timestamp":%d%s,"key":%s,"headers":%s%s,'
)
_RECORD = {
    ValueKind.JSON: _RECORD_HEAD + b'"value":%s}',
    ValueKind.BYTES: _RECORD_HEAD + b'"value_b64":"%s"}',
}

# _RECORD with its topic and delivery members filled in (and "%" escaped in them).
_DELIVERY_HEAD = (
    b'{"topic":%s,"id":"%%d-%%d","partition":%%d,"offset":%%d,"timestamp":%%d%%s,'
    b'"key":%%s,"headers":%%s%s,'
)
_DELIVERY = {
    ValueKind.JSON: _DELIVERY_HEAD + b'"value":%%s}',
    ValueKind.BYTES: _DELIVERY_HEAD + b'"value_b64":"%%s"}',
}


def _delivery_members(subscription: str | None, attempt: int | None) -> bytes:
    if attempt is None:
        return b""
    if subscription is None:
        return b',"attempt":%d' % attempt
    return b',"subscription":%s,"attempt":%d' % (orjson.dumps(subscription), attempt)


def json_array(items: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def deliver_frame(items: Iterable[bytes]) -> bytes:
    """A `deliver` frame (herald/protocol/frames.py `DeliverFrame`) around already encoded
    records: spliced, not built, since each record is the JSON it is stored as."""
    return b'{"type":"deliver","messages":[' + b",".join(items) + b"]}"


def ready_frame(
    subscription: str | None,
    consumer: str,
    credit: int,
    positions: dict[int, int] | UnsetType = UNSET,
) -> bytes:
    """The first frame of every consumer connection (PROTOCOL §3); a tail's may say
    where it starts in each partition (docs/protocol.md §3, `?positions=true`)."""
    frame = ReadyFrame(
        subscription=subscription, consumer=consumer, credit=credit, positions=positions
    )
    return _encode(frame)


def error_frame(code: ErrorCode, message: str) -> bytes:
    """The answer to a bad client frame (PROTOCOL §3: `unknown_type` or `bad_frame`)."""
    return _encode(ErrorFrame(code=code, message=message))


def acked_frame(req: Raw, ok: list[str], unknown: list[str]) -> bytes:
    """The answer to an ack carrying `req`, which is echoed as sent (PROTOCOL §3)."""
    return _encode(AckedFrame(ok=ok, unknown=unknown, req=req))


_encode = msgspec.json.Encoder().encode
