"""The JSON form of a record on the wire (PROTOCOL §1, §3 `deliver`, §4 webhook body).

A JSON value is stored as its compact JSON text, so it is spliced into the output
as is: no record is parsed again on the way out.
"""

from __future__ import annotations

import base64
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
    """
    if record.kind is not ValueKind.BYTES:
        # The hot path of every delivery: the same bytes orjson makes of the dict below
        # (compact, members in this order), by formatting instead of building a dict.
        return _JSON_RECORD % (
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
            record.value,
        )
    head: dict[str, object] = {
        "topic": topic,
        "id": record.id,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    if record.deliver_at is not None:
        head["deliver_at"] = record.deliver_at  # PROTOCOL §8: only on a delayed record
    head["key"] = record.key
    head["headers"] = record.headers
    if attempt is not None:
        if subscription is not None:
            head["subscription"] = subscription
        head["attempt"] = attempt
    head["value_b64"] = base64.b64encode(record.value).decode("ascii")
    return orjson.dumps(head)


def deliveries_json(
    topic: str, deliveries: Sequence[Delivery], subscription: str | None
) -> list[bytes]:
    """``record_json(topic, d.record, subscription, d.attempt)`` of each delivery, with
    what the batch's records share (the topic, the subscription, an attempt's members)
    encoded once for the batch instead of once a record."""
    topic_json = orjson.dumps(topic).replace(b"%", b"%%")
    formats: dict[int, bytes] = {}
    out: list[bytes] = []
    append = out.append
    for delivery in deliveries:
        record = delivery.record
        if record.kind is ValueKind.BYTES:
            append(record_json(topic, record, subscription, delivery.attempt))
            continue
        attempt = delivery.attempt
        form = formats.get(attempt)
        if form is None:
            members = _delivery_members(subscription, attempt).replace(b"%", b"%%")
            form = formats[attempt] = _JSON_DELIVERY % (topic_json, members)
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
                record.value,
            )
        )
    return out


# "id" is Record.id ("{partition}-{offset}", PROTOCOL §1), formatted in place.
_JSON_RECORD = (
    b'{"topic":%s,"id":"%d-%d","partition":%d,"offset":%d,"timestamp":%d%s,'
    b'"key":%s,"headers":%s%s,"value":%s}'
)


# _JSON_RECORD with its topic and delivery members filled in (and "%" escaped in them).
_JSON_DELIVERY = (
    b'{"topic":%s,"id":"%%d-%%d","partition":%%d,"offset":%%d,"timestamp":%%d%%s,'
    b'"key":%%s,"headers":%%s%s,"value":%%s}'
)


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
