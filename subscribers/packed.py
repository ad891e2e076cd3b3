"""The msgpack form of a record and of the server's frames on a consumer socket
(docs/protocol.md "MessagePack"): what subscribers/wire.py is to JSON.

A record carries its value as msgpack holds it without a conversion: a bytes record's
bytes as `value` (bin), a JSON value's stored compact text as `value_json` (str). The
records are encoded once each and queued as bytes, so a `deliver` frame is spliced
around them as a JSON one is: a map header, its `type`, and an array of n records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import msgspec
from msgspec import UNSET, Raw, UnsetType

from herald.protocol.encodings import array_header
from herald.protocol.frames import AckedFrame, ErrorCode, ErrorFrame, ReadyFrame
from herald.protocol.records import PackedDeliveredRecord, PackedTailRecord
from storage.record import Record, ValueKind

if TYPE_CHECKING:
    from delivery.events import Delivery

_encode = msgspec.msgpack.Encoder().encode


def packed_deliveries(
    topic: str, deliveries: Sequence[Delivery], subscription: str | None
) -> list[bytes]:
    """Each delivery's record as a msgpack map: with `subscription` and `attempt` for a
    subscription's, `attempt` alone when ``subscription`` is None (a tail's)."""
    if subscription is None:
        return [packed_tail_record(topic, d.record, d.attempt) for d in deliveries]
    out: list[bytes] = []
    append = out.append
    for delivery in deliveries:
        record = delivery.record
        bytes_value = record.kind is ValueKind.BYTES
        deliver_at = record.deliver_at
        append(
            _encode(
                PackedDeliveredRecord(
                    topic=topic,
                    id=f"{record.partition}-{record.offset}",
                    partition=record.partition,
                    offset=record.offset,
                    timestamp=record.timestamp,
                    deliver_at=UNSET if deliver_at is None else deliver_at,
                    key=record.key,
                    # A dict at runtime, as orjson needs it in wire.py too.
                    headers=cast("dict[str, str]", record.headers),
                    value=record.value if bytes_value else UNSET,
                    value_json=UNSET if bytes_value else record.value.decode(),
                    subscription=subscription,
                    attempt=delivery.attempt,
                )
            )
        )
    return out


def packed_tail_record(topic: str, record: Record, attempt: int = 1) -> bytes:
    """A tail's record (PROTOCOL §3: `attempt` 1, no `subscription`) as a msgpack map."""
    bytes_value = record.kind is ValueKind.BYTES
    deliver_at = record.deliver_at
    return _encode(
        PackedTailRecord(
            topic=topic,
            id=f"{record.partition}-{record.offset}",
            partition=record.partition,
            offset=record.offset,
            timestamp=record.timestamp,
            deliver_at=UNSET if deliver_at is None else deliver_at,
            key=record.key,
            headers=cast("dict[str, str]", record.headers),
            value=record.value if bytes_value else UNSET,
            value_json=UNSET if bytes_value else record.value.decode(),
            attempt=attempt,
        )
    )


# {"type": "deliver", "messages": [...]}: a fixmap of 2, its first member and the key of
# the second, then the array (herald/protocol/frames.py PackedDeliverFrame).
_DELIVER_HEAD = b"\x82\xa4type\xa7deliver\xa8messages"


def packed_deliver_frame(items: Sequence[bytes]) -> bytes:
    """A `deliver` frame around already encoded records, spliced as in wire.py."""
    return _DELIVER_HEAD + array_header(len(items)) + b"".join(items)


def packed_ready_frame(
    subscription: str | None,
    consumer: str,
    credit: int,
    positions: dict[int, int] | UnsetType = UNSET,
) -> bytes:
    """`ready` (PROTOCOL §3) as a msgpack map; `positions` keyed by partition numbers."""
    frame = ReadyFrame(
        subscription=subscription, consumer=consumer, credit=credit, positions=positions
    )
    return _encode(frame)


def packed_error_frame(code: ErrorCode, message: str) -> bytes:
    return _encode(ErrorFrame(code=code, message=message))


def packed_acked_frame(req: Raw, ok: list[str], unknown: list[str]) -> bytes:
    """`acked` with ``req`` as sent: ``req`` holds msgpack (subscribers/frames.py makes a
    JSON text frame's `req` msgpack when it reads it on a msgpack connection)."""
    return _encode(AckedFrame(ok=ok, unknown=unknown, req=req))
