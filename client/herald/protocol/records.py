"""Records on the wire as a server shows them, declared once: a record
(PROTOCOL §1, §2), a read's answer, a publish's answer, and a record delivered to a
subscription, and what a nack says of records delivered. /openapi.json publishes their schemas (server/schemas.py); the server
writes them with hand-tuned encoders (subscribers/wire.py record_json: the hot path of
every delivery), which its tests check against these schemas."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.names import Name
from herald.protocol.patterns import base64_pattern

# The annotated types every model of the package shares, declared here once.
Count = Annotated[int, Meta(ge=0)]
Base64 = Annotated[
    str, Meta(extra_json_schema={"pattern": f"^{base64_pattern()}$", "contentEncoding": "base64"})
]
Timestamp = Annotated[int, Meta(ge=limits.TIMESTAMP.low, le=limits.TIMESTAMP.high)]

# What a type cannot say: a record holds its value in the form it was published in.
ONE_VALUE: dict[str, Any] = {"oneOf": [{"required": ["value"]}, {"required": ["value_b64"]}]}
ONE_PACKED_VALUE: dict[str, Any] = {
    "oneOf": [{"required": ["value"]}, {"required": ["value_json"]}]
}


class RecordFields(msgspec.Struct, frozen=True, kw_only=True):
    """What a record is besides its value, in either encoding (PROTOCOL §1)."""

    topic: Name
    id: Annotated[str, Meta(pattern="^[0-9]+-[0-9]+$")]
    partition: Count
    offset: Count
    timestamp: Annotated[Timestamp, Meta(description="broker append time, ms since the epoch")]
    deliver_at: (
        Annotated[
            Timestamp,
            Meta(
                description="PROTOCOL §8: timestamp + delay_ms of a record published with a "
                "delay_ms > 0 (absent otherwise); not sent to subscriptions before it"
            ),
        ]
        | UnsetType
    ) = UNSET
    key: str | None
    headers: dict[str, str]


class Record(RecordFields, frozen=True, kw_only=True):
    """Exactly one of value and value_b64, in the form it was published in."""

    value: Annotated[Any, Meta(description="any JSON value")] = UNSET
    value_b64: Base64 | UnsetType = UNSET


class ReadResponse(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/topics/{topic}/partitions/{partition}/messages`."""

    messages: list[Record]
    next_offset: Count


class PublishResult(msgspec.Struct, frozen=True, kw_only=True):
    partition: Count
    offset: Count
    duplicate: bool


class PublishResponse(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/topics/{topic}/messages`: one result a message, in the batch's order."""

    results: list[PublishResult]


Attempt = Annotated[int, Meta(ge=1, description="1 on first delivery; every send counts")]

# What a nack says of the delivered records it hands back, over a socket (PROTOCOL §3
# `nack` frame) or over HTTP (PROTOCOL §8 pull): frames.py and pull.py share them.
NackDelayMs = Annotated[
    int,
    Meta(
        ge=limits.NACK_DELAY_MS.low,
        le=limits.NACK_DELAY_MS.high,
        description="redeliver after this many ms; else after the subscription's backoff",
    ),
]
NackReason = Annotated[
    str,
    Meta(
        max_length=limits.MAX_NACK_REASON,
        description="PROTOCOL §8: the herald-source-last-error of a dead letter of them",
    ),
]


class DeliveredRecord(Record, frozen=True, kw_only=True):
    """A record delivered to a subscription (PROTOCOL §3 `deliver`, §8 pull)."""

    subscription: Name
    attempt: Attempt


class TailRecord(Record, frozen=True, kw_only=True):
    """A record delivered to a tail (PROTOCOL §3): `attempt` 1, no `subscription`."""

    attempt: Attempt


# -- the msgpack encoding (docs/protocol.md "MessagePack") ------------------------------
# A record carries its value as what msgpack holds without a conversion: a bytes record's
# bytes as `value` (bin), a JSON value's compact JSON text as `value_json` (str), the
# text it is stored as. Exactly one of the two.


class PackedRecord(RecordFields, frozen=True, kw_only=True):
    """A record in msgpack: exactly one of value (bin) and value_json (str)."""

    value: Annotated[bytes, Meta(description="a bytes record's bytes")] | UnsetType = UNSET
    value_json: (
        Annotated[str, Meta(description="a JSON value record's compact JSON text")] | UnsetType
    ) = UNSET


class PackedDeliveredRecord(PackedRecord, frozen=True, kw_only=True):
    """`DeliveredRecord` in msgpack."""

    subscription: Name
    attempt: Attempt


class PackedTailRecord(PackedRecord, frozen=True, kw_only=True):
    """`TailRecord` in msgpack."""

    attempt: Attempt
