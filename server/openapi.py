"""The OpenAPI 3.1 description of the HTTP API (PROTOCOL §2, §5), served at /openapi.json.

Built from what the server itself uses, so it cannot drift from it: every range,
pattern and enum comes from server/validation.py (``IntRange`` constants, the name
and base64 patterns, the push URL pattern), every default from the config
dataclasses. Requests and responses have separate schemas (a push secret is
required in a request and never shown in a response). PROTOCOL §2's "an optional
field given as null is the same as the field left out" is written out: each
optional request field also takes ``null``.

What JSON Schema cannot say, the descriptions say, and tests/security/test_fuzz_api.py
allows explicitly: ``offset`` together with ``timestamp`` (bad_request), min <= max
between two fields (validation_error), reads past a partition's end
(offset_out_of_range) and partitions a topic does not have (state, not shape).
The ``paths`` and ``x-websockets`` are made from the endpoint table
(server/route_table.py, server/openapi_paths.py); a test checks that the document's
paths and methods are exactly the app's routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from delivery import redrive
from delivery.config import (
    MAX_PREVIOUS_SECRETS,
    DeliveryMode,
    PushConfig,
    PushPayload,
    SubscriptionConfig,
)
from delivery.dead_letter import MAX_NACK_REASON
from delivery.filter import MAX_FILTER_CHARS
from server import validation as v
from server.auth import MAX_TTL_MS, MIN_TTL_MS
from storage.config import TopicConfig

_REF = "#/components/schemas/"

_TOPIC_DEFAULTS = TopicConfig().to_dict()
_SUB_DEFAULTS = SubscriptionConfig(topic="t").public_dict()
_PUSH_DEFAULTS = PushConfig(url="", secret="").public_dict()


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _int(allowed: v.IntRange | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", **extra}
    if allowed is not None:
        schema["minimum"] = allowed.low
        schema["maximum"] = allowed.high
    return schema


_COUNT = _int(v.IntRange(0))


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """PROTOCOL §2: an optional field given as null is the same as the field left out."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    annotations: dict[str, Any] = {k: schema[k] for k in ("default", "description") if k in schema}
    core = {k: x for k, x in schema.items() if k not in annotations}
    return {"anyOf": [core, {"type": "null"}], **annotations}


def _object(
    properties: dict[str, Any], required: tuple[str, ...] = (), *, closed: bool = True, **extra: Any
) -> dict[str, Any]:
    """An object; request objects are ``closed`` (PROTOCOL §2: unknown fields -> 400)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _pattern(regex: str) -> str:
    return regex if regex.startswith("^") else f"^{regex}$"


_NAME = {"type": "string", "pattern": _pattern(v.NAME_RE.pattern)}
_SECRET = {
    "type": "string",
    "pattern": v.SECRET_PATTERN,
    "description": f"{v.SECRET_PREFIX} + strict base64 of "
    f"{v.SECRET_BYTES[0]}..{v.SECRET_BYTES[1]} bytes",
}
_FILTER = _nullable(
    {
        "type": "string",
        "maxLength": MAX_FILTER_CHARS,
        "default": None,
        "description": 'PROTOCOL §8: key = "v", key != "v", hasPrefix(key, "p"), '
        'headers.NAME = / != "v", hasPrefix(headers.NAME, "p"), headers:NAME, joined '
        "with AND, OR, NOT and parentheses (malformed -> bad_request with the position)",
    }
)
_BASE64 = {"type": "string", "pattern": _pattern(v.base64_pattern()), "contentEncoding": "base64"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}


# ------------------------------------------------------------------ requests


def _topic_config(cluster: bool) -> dict[str, Any]:
    d = _TOPIC_DEFAULTS
    replication = v.REPLICATION_FACTOR if cluster else v.IntRange(1, 1)
    return _object(
        {
            "partitions": _nullable(_int(v.PARTITIONS, default=d["partitions"])),
            # PROTOCOL §2: for these two, null means unlimited rather than "absent".
            "retention_ms": _nullable(
                _int(v.RETENTION_MS, default=d["retention_ms"], description="null: unlimited")
            ),
            "retention_bytes": _nullable(
                _int(v.RETENTION_BYTES, default=d["retention_bytes"], description="null: unlimited")
            ),
            "dedup_window_ms": _nullable(_int(v.DEDUP_WINDOW_MS, default=d["dedup_window_ms"])),
            # PROTOCOL §7: a single node accepts only 1; a cluster up to its live nodes.
            "replication_factor": _nullable(
                _int(
                    replication,
                    description="default min(3, live nodes) in a cluster; 1 on a single node",
                )
            ),
            "min_insync_replicas": _nullable(
                _int(
                    replication,
                    description="default min(2, replication_factor); at most replication_factor",
                )
            ),
        },
        description="no body (or an empty one) is all defaults; JSON null is not an object",
    )


# Any JSON value, with integers within what the server stores exactly. Nesting is at
# most MAX_VALUE_DEPTH levels deep, which JSON Schema cannot say short of unrolling it.
_JSON_VALUE = {
    "description": "any JSON value; integers within "
    f"{v.MIN_VALUE_INT}..{v.MAX_VALUE_INT}, arrays and objects nested at most "
    f"{v.MAX_VALUE_DEPTH} levels (else 400 validation_error)",
    "if": {"type": "integer"},
    "then": {"minimum": v.MIN_VALUE_INT, "maximum": v.MAX_VALUE_INT},
    "items": {"$ref": _REF + "JsonValue"},
    "additionalProperties": {"$ref": _REF + "JsonValue"},
}


def _message() -> dict[str, Any]:
    return _object(
        {
            "value": _ref("JsonValue"),
            "value_b64": _nullable(_BASE64),
            "key": {"type": ["string", "null"]},
            "headers": _nullable(_STRINGS),
            "partition": _nullable(
                _int(
                    v.PARTITION, description="a partition the topic has (else 400 validation_error)"
                )
            ),
            "id": _nullable({"type": "string", "minLength": 1, "maxLength": v.MAX_ID_CHARS}),
            "delay_ms": _nullable(
                _int(
                    v.DELAY_MS,
                    description="PROTOCOL §8 delayed delivery: appended at once, first sent to "
                    "subscriptions no earlier than the record's timestamp + delay_ms "
                    "(its deliver_at); 0 or absent: no delay",
                )
            ),
        },
        description="exactly one of value (null included) and value_b64",
        # `"value": null` is a value; `"value_b64": null` is absent (PROTOCOL §1, §2).
        oneOf=[
            {"required": ["value"]},
            {"required": ["value_b64"], "properties": {"value_b64": {"type": "string"}}},
        ],
    )


def _start() -> dict[str, Any]:
    return _nullable(
        {
            "oneOf": [
                {"enum": list(v.POSITIONS)},
                _object({"timestamp": _int(v.TIMESTAMP)}, ("timestamp",)),
            ],
            "default": _SUB_DEFAULTS["start"],
        }
    )


def _retry_backoff() -> dict[str, Any]:
    d = _SUB_DEFAULTS["retry_backoff"]
    return _nullable(
        _object(
            {
                "min_ms": _nullable(_int(v.BACKOFF_MS, default=d["min_ms"])),
                "max_ms": _nullable(_int(v.BACKOFF_MS, default=d["max_ms"])),
            },
            description="min_ms <= max_ms (else 400 validation_error)",
        )
    )


def _breaker() -> dict[str, Any]:
    d = _PUSH_DEFAULTS["breaker"]
    return _nullable(
        _object(
            {
                "failures": _nullable(_int(v.BREAKER_FAILURES, default=d["failures"])),
                "open_ms": _nullable(_int(v.BREAKER_OPEN_MS, default=d["open_ms"])),
                "max_open_ms": _nullable(_int(v.BREAKER_OPEN_MS, default=d["max_open_ms"])),
            },
            description="open_ms <= max_open_ms (else 400 validation_error)",
        )
    )


def _batch() -> dict[str, Any]:
    d = _PUSH_DEFAULTS["batch"]
    return _nullable(
        _object(
            {
                "max_records": _nullable(_int(v.BATCH_MAX_RECORDS, default=d["max_records"])),
                "max_wait_ms": _nullable(_int(v.BATCH_MAX_WAIT_MS, default=d["max_wait_ms"])),
            },
            description="PROTOCOL §8: with max_records > 1 a request carries up to that many "
            'records as {"messages":[M, …]}, sent once max_records are ready or max_wait_ms '
            "after the first of them was",
        )
    )


_PAYLOAD_DESCRIPTION = (
    'PROTOCOL §8: "envelope" (the JSON of M) or "raw" (the record\'s value as the body, '
    "the rest of M in herald-* headers); raw needs batch.max_records 1 (else 400 "
    "validation_error)"
)


def _push_config() -> dict[str, Any]:
    d = _PUSH_DEFAULTS
    return _object(
        {
            "url": {"type": "string", "pattern": v.PUSH_URL_PATTERN, "maxLength": v.MAX_URL_CHARS},
            "secret": _SECRET,
            "max_in_flight": _nullable(_int(v.PUSH_MAX_IN_FLIGHT, default=d["max_in_flight"])),
            "timeout_ms": _nullable(_int(v.PUSH_TIMEOUT_MS, default=d["timeout_ms"])),
            "breaker": _breaker(),
            "batch": _batch(),
            "payload": _nullable(
                {
                    "enum": [p.value for p in PushPayload],
                    "default": d["payload"],
                    "description": _PAYLOAD_DESCRIPTION,
                }
            ),
            "previous_secrets": _nullable(
                {
                    "type": "array",
                    "maxItems": MAX_PREVIOUS_SECRETS,
                    "description": "docs/protocol.md: secrets still signed with until "
                    "expires_at (rotation); GET shows only expires_at",
                    "items": _object(
                        {"secret": _SECRET, "expires_at": _int(v.TIMESTAMP)},
                        ("secret", "expires_at"),
                    ),
                }
            ),
        },
        ("url", "secret"),
    )


def _subscription_config() -> dict[str, Any]:
    d = _SUB_DEFAULTS
    return _object(
        {
            "topic": _NAME,
            "start": _start(),
            "delivery": _nullable(
                {"enum": [m.value for m in DeliveryMode], "default": d["delivery"]}
            ),
            "ack_deadline_ms": _nullable(_int(v.ACK_DEADLINE_MS, default=d["ack_deadline_ms"])),
            "max_in_flight": _nullable(_int(v.MAX_IN_FLIGHT, default=d["max_in_flight"])),
            "max_deliveries": _nullable(_int(v.MAX_DELIVERIES, default=d["max_deliveries"])),
            "retry_backoff": _retry_backoff(),
            "dead_letter_topic": _nullable({**_NAME, "default": None}),
            "ordered_by_key": _nullable({"type": "boolean", "default": d["ordered_by_key"]}),
            "push": _nullable({**_ref("PushConfig"), "default": None}),
            "filter": _FILTER,
        },
        ("topic",),
    )


def _subscription_patch() -> dict[str, Any]:
    """PROTOCOL §8 change in place: JSON Merge Patch; null -> back to the default."""
    d = _SUB_DEFAULTS
    fixed = "only with its current value (else 409 subscription_conflict)"
    push = _push_config()
    push = {
        **push,
        # Optional here: left out (or null, PROTOCOL §2) it keeps the current secret.
        "properties": {**push["properties"], "secret": _nullable(_SECRET)},
        "required": ["url"],
        "description": "replaces the push config whole; without secret the old one is kept",
    }
    return _object(
        {
            "topic": _nullable({**_NAME, "description": fixed}),
            "start": {**_start(), "description": fixed},
            "delivery": _nullable({"enum": [m.value for m in DeliveryMode], "description": fixed}),
            "ordered_by_key": _nullable({"type": "boolean", "description": fixed}),
            "ack_deadline_ms": _nullable(_int(v.ACK_DEADLINE_MS, default=d["ack_deadline_ms"])),
            "max_in_flight": _nullable(_int(v.MAX_IN_FLIGHT, default=d["max_in_flight"])),
            "max_deliveries": _nullable(_int(v.MAX_DELIVERIES, default=d["max_deliveries"])),
            "retry_backoff": {
                **_retry_backoff(),
                "description": "merged into the current one (a null member: its default)",
            },
            "dead_letter_topic": _nullable({**_NAME, "default": None}),
            "push": _nullable({**push, "default": None}),
            "filter": _FILTER,
        },
        description="a field left out is unchanged; null sets it back to its default "
        "(push: null stops pushing); records in flight keep their deadline",
    )


def _pull_schemas() -> dict[str, Any]:
    """PROTOCOL §8 pull, ack and nack."""
    ids = {
        "type": "array",
        "items": {"type": "string"},
        "description": "message ids; strings that are not in flight are unknown",
    }
    delivered = {
        "allOf": [
            _ref("Record"),
            _object(
                {"subscription": _NAME, "attempt": _int(v.IntRange(1))},
                ("subscription", "attempt"),
                closed=False,
            ),
        ]
    }
    return {
        "PullRequest": _object(
            {
                "max_messages": _nullable(
                    _int(v.PULL_MAX_MESSAGES, default=v.DEFAULT_PULL_MAX_MESSAGES)
                ),
                "wait_ms": _nullable(
                    _int(v.WAIT_MS, default=0, description="long-poll while nothing is there")
                ),
            },
            description="optional: no body is all defaults",
        ),
        "PullResponse": _object(
            {"messages": {"type": "array", "items": delivered}}, ("messages",), closed=False
        ),
        "AckRequest": _object({"ids": ids}, ("ids",)),
        "AckResponse": _object({"ok": ids, "unknown": ids}, ("ok", "unknown"), closed=False),
        "NackRequest": _object(
            {
                "ids": ids,
                "delay_ms": _nullable(
                    _int(v.NACK_DELAY_MS, description="else the subscription's backoff")
                ),
                "reason": _nullable(
                    {
                        "type": "string",
                        "maxLength": MAX_NACK_REASON,
                        "description": "the dead letter's herald-source-last-error",
                    }
                ),
            },
            ("ids",),
        ),
    }


def _seek() -> dict[str, Any]:
    """Exactly one form; the other two may be given as null (absent)."""
    forms = {
        "to": {"enum": list(v.POSITIONS)},
        "timestamp": _int(v.TIMESTAMP),
        "offsets": {
            "type": "object",
            "description": "partition number -> offset; a partition the topic does not "
            "have -> 404 partition_not_found; past the end means the end",
            "propertyNames": {"pattern": _pattern(v.INT_TEXT_RE.pattern)},
            "additionalProperties": _int(v.OFFSET),
        },
    }
    branches = []
    for form, schema in forms.items():
        others = {name: {"type": "null"} for name in forms if name != form}
        branches.append(_object({form: schema, **others}, (form,)))
    return {"description": "exactly one form", "oneOf": branches}


def _redrive_request() -> dict[str, Any]:
    return _object(
        {
            "rate": _nullable(
                _int(v.REDRIVE_RATE, default=redrive.DEFAULT_RATE, description="records/s")
            ),
            "max_records": _nullable(
                _int(v.REDRIVE_MAX_RECORDS, default=redrive.DEFAULT_MAX_RECORDS)
            ),
            "reason": _nullable(
                {
                    "type": "string",
                    "maxLength": redrive.MAX_REASON,
                    "description": "only the dead letters whose herald-source-last-error "
                    'is exactly this ("" also matches records without it)',
                }
            ),
        },
        description="optional: no body is all defaults",
    )


def _rotation_request() -> dict[str, Any]:
    return _object(
        {
            "secret": _SECRET,
            "previous_ttl_ms": _nullable(
                _int(
                    v.PREVIOUS_TTL_MS,
                    default=v.DEFAULT_PREVIOUS_TTL_MS,
                    description="how long the replaced secret is still signed with; "
                    "0 drops it at once",
                )
            ),
        },
        ("secret",),
    )


# ------------------------------------------------------------------ responses


def _topic_view() -> dict[str, Any]:
    config = _object(
        {
            "partitions": _int(v.PARTITIONS),
            "retention_ms": {"type": ["integer", "null"]},
            "retention_bytes": {"type": ["integer", "null"]},
            "dedup_window_ms": _int(v.DEDUP_WINDOW_MS),
            "replication_factor": _int(v.REPLICATION_FACTOR),
            "min_insync_replicas": _int(v.MIN_INSYNC_REPLICAS),
        },
        tuple(_TOPIC_DEFAULTS),
        closed=False,
    )
    partition = _object(
        {"partition": _COUNT, "start_offset": _COUNT, "end_offset": _COUNT, "bytes": _COUNT},
        ("partition", "start_offset", "end_offset", "bytes"),
        closed=False,
    )
    return {
        "TopicConfigView": config,
        "Topic": _object(
            {
                "name": _NAME,
                "config": _ref("TopicConfigView"),
                "partitions": {"type": "array", "items": partition},
                "messages_total": _COUNT,
                "bytes_total": _COUNT,
                "auto_created": {
                    "type": "boolean",
                    "description": "Created by a publish or a subscription, not a PUT (an extension).",
                },
            },
            ("name", "config", "partitions", "messages_total", "bytes_total"),
            closed=False,
        ),
        "TopicList": _object(
            {
                "topics": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": _NAME,
                            "config": _ref("TopicConfigView"),
                            "auto_created": {"type": "boolean"},
                        },
                        ("name", "config"),
                        closed=False,
                    ),
                }
            },
            ("topics",),
            closed=False,
        ),
    }


def _record() -> dict[str, Any]:
    return _object(
        {
            "topic": _NAME,
            "id": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
            "partition": _COUNT,
            "offset": _COUNT,
            "timestamp": _int(v.TIMESTAMP, description="broker append time, ms since the epoch"),
            "deliver_at": _int(
                v.TIMESTAMP,
                description="PROTOCOL §8: timestamp + delay_ms of a record published with a "
                "delay_ms > 0 (absent otherwise); not sent to subscriptions before it",
            ),
            "key": {"type": ["string", "null"]},
            "headers": _STRINGS,
            "value": {"description": "any JSON value"},
            "value_b64": _BASE64,
        },
        ("topic", "id", "partition", "offset", "timestamp", "key", "headers"),
        closed=False,
        description="exactly one of value and value_b64, in the form it was published in",
        oneOf=[{"required": ["value"]}, {"required": ["value_b64"]}],
    )


def _subscription_view() -> dict[str, Any]:
    push = _object(
        {
            "url": {"type": "string"},
            "max_in_flight": _int(v.PUSH_MAX_IN_FLIGHT),
            "timeout_ms": _int(v.PUSH_TIMEOUT_MS),
            "breaker": _object(
                {
                    "failures": _int(v.BREAKER_FAILURES),
                    "open_ms": _int(v.BREAKER_OPEN_MS),
                    "max_open_ms": _int(v.BREAKER_OPEN_MS),
                },
                ("failures", "open_ms", "max_open_ms"),
                closed=False,
            ),
            "previous_secrets": {
                "type": "array",
                "items": _object({"expires_at": _int(v.TIMESTAMP)}, ("expires_at",)),
            },
            "batch": _object(
                {
                    "max_records": _int(v.BATCH_MAX_RECORDS),
                    "max_wait_ms": _int(v.BATCH_MAX_WAIT_MS),
                },
                ("max_records", "max_wait_ms"),
                closed=False,
            ),
            "payload": {"enum": [p.value for p in PushPayload]},
        },
        ("url", "max_in_flight", "timeout_ms", "breaker", "batch", "payload"),
        closed=False,
        description="the push config without its secrets",
    )
    config = _object(
        {
            "topic": _NAME,
            "start": {
                "oneOf": [
                    {"enum": list(v.POSITIONS)},
                    _object({"timestamp": _int(v.TIMESTAMP)}, ("timestamp",)),
                ]
            },
            "delivery": {"enum": [m.value for m in DeliveryMode]},
            "ack_deadline_ms": _int(v.ACK_DEADLINE_MS),
            "max_in_flight": _int(v.MAX_IN_FLIGHT),
            "max_deliveries": _int(v.MAX_DELIVERIES),
            "retry_backoff": _object(
                {"min_ms": _int(v.BACKOFF_MS), "max_ms": _int(v.BACKOFF_MS)},
                ("min_ms", "max_ms"),
                closed=False,
            ),
            "dead_letter_topic": {"anyOf": [_NAME, {"type": "null"}]},
            "ordered_by_key": {"type": "boolean"},
            "push": {"anyOf": [push, {"type": "null"}]},
        },
        tuple(_SUB_DEFAULTS),
        closed=False,
        description="every field, defaults filled (PROTOCOL §2)",
    )
    counters = (
        "backlog",
        "in_flight",
        "consumers",
        "delivered_total",
        "redelivered_total",
        "acked_total",
        "dead_lettered_total",
        "expired_total",
        "filtered_total",
    )
    stats = _object(
        {
            **{name: _COUNT for name in counters},
            "partitions": {
                "type": "array",
                "items": _object(
                    {"partition": _COUNT, "ack_floor": _COUNT},
                    ("partition", "ack_floor"),
                    closed=False,
                ),
            },
        },
        (*counters, "partitions"),
        closed=False,
        description="PROTOCOL §5; a push subscription adds the endpoint_* members of "
        "docs/protocol.md",
    )
    return {
        "SubscriptionConfigView": config,
        "SubscriptionStats": stats,
        "Subscription": _object(
            {
                "name": _NAME,
                "config": _ref("SubscriptionConfigView"),
                "stats": _ref("SubscriptionStats"),
            },
            ("name", "config", "stats"),
            closed=False,
        ),
        "SubscriptionList": _object(
            {
                "subscriptions": {
                    "type": "array",
                    "items": _object(
                        {"name": _NAME, "config": _ref("SubscriptionConfigView")},
                        ("name", "config"),
                        closed=False,
                    ),
                }
            },
            ("subscriptions",),
            closed=False,
        ),
    }


def _schemas(cluster: bool) -> dict[str, Any]:
    return {
        "Problem": _object(
            {
                "status": {"type": "integer"},
                "title": {"type": "string"},
                "detail": {"type": "string"},
                "code": {"type": "string"},
                "index": {
                    "type": "integer",
                    "description": "position of the first bad message of a batch",
                },
            },
            ("status", "title", "detail", "code"),
            closed=False,
            description="RFC 9457 problem details",
        ),
        "JsonValue": _JSON_VALUE,
        "TopicConfig": _topic_config(cluster),
        **_topic_view(),
        "Message": _message(),
        "PublishRequest": _object(
            {
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": v.MAX_BATCH,
                    "items": _ref("Message"),
                }
            },
            ("messages",),
        ),
        "PublishResponse": _object(
            {
                "results": {
                    "type": "array",
                    "items": _object(
                        {
                            "partition": _COUNT,
                            "offset": _COUNT,
                            "duplicate": {"type": "boolean"},
                        },
                        ("partition", "offset", "duplicate"),
                        closed=False,
                    ),
                }
            },
            ("results",),
            closed=False,
        ),
        "Record": _record(),
        "ReadResponse": _object(
            {"messages": {"type": "array", "items": _ref("Record")}, "next_offset": _COUNT},
            ("messages", "next_offset"),
            closed=False,
        ),
        "SubscriptionConfig": _subscription_config(),
        "SubscriptionPatch": _subscription_patch(),
        "PushConfig": _push_config(),
        **_subscription_view(),
        "Seek": _seek(),
        **_pull_schemas(),
        "RedriveRequest": _redrive_request(),
        "SecretRotation": _rotation_request(),
        "TokenRequest": _token_request(),
    }


def _token_request() -> dict[str, Any]:
    patterns = {
        "type": "array",
        "maxItems": 64,
        "items": {"type": "string", "minLength": 1, "maxLength": 255},
        "description": "fnmatch topic patterns, each provably within one of the caller's",
    }
    return _object(
        {
            "ttl_ms": {"type": "integer", "minimum": MIN_TTL_MS, "maximum": MAX_TTL_MS},
            "publish": patterns,
            "subscribe": patterns,
        },
        ("ttl_ms",),
        description="a browser token's rights (at least one pattern) and lifetime",
    )


def document(
    version: str = "0.1.0",
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document: ``paths`` and ``websockets`` (``x-websockets``) come from the
    endpoint table (server/route_table.py), the schemas from here."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Herald",
            "version": version,
            "description": "Push-delivery pub/sub. WebSocket consumers (PROTOCOL §3) are "
            "GET /v1/subscriptions/{name}/ws and GET /v1/topics/{topic}/ws; "
            "the stats WebSocket is GET /v1/stats/ws; the browser console is /console/.",
        },
        "paths": dict(paths or {}),
        "components": {"schemas": _schemas(cluster)},
        "x-websockets": dict(websockets or {}),
    }


def document_bytes(
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> bytes:
    return orjson.dumps(document(cluster=cluster, paths=paths, websockets=websockets))
