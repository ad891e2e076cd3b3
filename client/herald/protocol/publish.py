"""PROTOCOL §2 `POST /v1/topics/{topic}/messages`: what a client publishes, declared once.
/openapi.json publishes its schema (server/schemas.py), and the server decodes a body
straight into it from bytes (server/validation.py decode_publish), then checks what a
type cannot say (parse_publish). It replaced a hand-written parser that did not win:
decoding into the model takes 10-20% less CPU (bench/publish_parse.py, README.md)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.records import Base64

REF_JSON_VALUE = "#/components/schemas/JsonValue"

# The answer's header, in a cluster, when the node forwarded records of the publish to
# their partitions' leaders: how many (docs/protocol.md "Publishing to the leader").
FORWARDED_RECORDS = "herald-forwarded-records"

# Any JSON value, with integers within what the server stores exactly. Nesting is at
# most MAX_VALUE_DEPTH levels deep, which JSON Schema cannot say short of unrolling it.
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "any JSON value; integers within "
    f"{limits.MIN_VALUE_INT}..{limits.MAX_VALUE_INT}, arrays and objects nested at most "
    f"{limits.MAX_VALUE_DEPTH} levels (else 400 validation_error)",
    "if": {"type": "integer"},
    "then": {"minimum": limits.MIN_VALUE_INT, "maximum": limits.MAX_VALUE_INT},
    "items": {"$ref": REF_JSON_VALUE},
    "additionalProperties": {"$ref": REF_JSON_VALUE},
}

# `"value": null` is a value; `"value_b64": null` is absent (PROTOCOL §1, §2).
ONE_VALUE: dict[str, Any] = {
    "oneOf": [
        {"required": ["value"]},
        {"required": ["value_b64"], "properties": {"value_b64": {"type": "string"}}},
    ]
}


JsonValue = Annotated[Any, Meta(extra_json_schema={"$ref": REF_JSON_VALUE})]


PartitionIndex = Annotated[
    int,
    Meta(
        ge=limits.PARTITION.low,
        le=limits.PARTITION.high,
        description="a partition the topic has (else 400 validation_error)",
    ),
]
MessageId = Annotated[str, Meta(min_length=1, max_length=limits.MAX_ID_CHARS)]
DelayMs = Annotated[
    int,
    Meta(
        ge=limits.DELAY_MS.low,
        le=limits.DELAY_MS.high,
        description="PROTOCOL §8 delayed delivery: appended at once, first sent to "
        "subscriptions no earlier than the record's timestamp + delay_ms "
        "(its deliver_at); 0 or absent: no delay",
    ),
]


# omit_defaults: as the SDK's producer encodes it, a field not given is left out.
class Message(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Exactly one of value (null included) and value_b64."""

    value: JsonValue = UNSET
    value_b64: Base64 | None = None
    key: str | None = None
    headers: dict[str, str] | None = None
    partition: PartitionIndex | None = None
    id: MessageId | None = None
    delay_ms: DelayMs | None = None


class PublishRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    messages: Annotated[list[Message], Meta(min_length=1, max_length=limits.MAX_BATCH)]


# -- the msgpack encoding (docs/protocol.md "MessagePack") ------------------------------


class PackedMessage(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """A message in a msgpack body: exactly one of value (bin: the bytes of a bytes
    record) and value_json (str: a JSON value as JSON text); the rest as in JSON."""

    value: Annotated[bytes, Meta(description="a bin: the bytes themselves")] | UnsetType = UNSET
    value_json: (
        Annotated[str, Meta(description="JSON text, parsed and stored compact")] | UnsetType
    ) = UNSET
    key: str | None = None
    headers: dict[str, str] | None = None
    partition: PartitionIndex | None = None
    id: MessageId | None = None
    delay_ms: DelayMs | None = None


class PackedPublishRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    messages: Annotated[list[PackedMessage], Meta(min_length=1, max_length=limits.MAX_BATCH)]
