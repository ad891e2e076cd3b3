"""The OpenAPI 3.1 description of the HTTP API (PROTOCOL §2, §5), served at /openapi.json.

Built from what the server itself uses, so it cannot drift from it: the schemas of
the subscription config (as sent and as shown) and of its stats are generated from the
protocol's models the server validates with and answers from (server/schemas.py);
every other range, pattern and enum comes from herald.protocol (``IntRange``
constants, the name, base64 and push URL patterns), every default from the config
dataclasses. Requests and responses have separate schemas (a push secret is
required in a request and never shown in a response). PROTOCOL §2's "an optional
field given as null is the same as the field left out" is written out: each
optional request field also takes ``null``.

What JSON Schema cannot say, the descriptions say, and tests/security/test_fuzz_api.py
allows explicitly: ``offset`` together with ``timestamp`` (bad_request), min <= max
between two fields (validation_error), reads past a partition's end
(offset_out_of_range) and partitions a topic does not have (state, not shape).
A test checks that the document's paths and methods are exactly the app's routes.
"""

from __future__ import annotations

from typing import Any

import orjson

from herald.protocol import limits, names
from herald.protocol.patterns import base64_pattern
from server import validation as v
from server.auth import MAX_TTL_MS, MIN_TTL_MS
from server.schemas import with_models
from storage.config import TopicConfig
from storage.record import Acks

_REF = "#/components/schemas/"

_TOPIC_DEFAULTS = TopicConfig().to_dict()


# docs/security.md (a cluster): a node's credentials file as loaded, so a mismatch shows.
_CREDENTIALS_DIGEST = {
    "type": ["string", "null"],
    "pattern": "^[0-9a-f]{16}$",
    "description": "the first 16 hex digits of the SHA-256 of the node's credentials file "
    "(parsed, canonical form); null without one, or when the node did not answer",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


def _int(allowed: limits.IntRange | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", **extra}
    if allowed is not None:
        schema["minimum"] = allowed.low
        schema["maximum"] = allowed.high
    return schema


_COUNT = _int(limits.IntRange(0))


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


_NAME = {"type": "string", "pattern": _pattern(names.NAME_PATTERN)}
_BASE64 = {"type": "string", "pattern": _pattern(base64_pattern()), "contentEncoding": "base64"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_BAD = _problem("bad_request, validation_error or invalid_name")
_TOO_LARGE = _problem("payload_too_large: the body is over the server's cap")
_TOPIC_404 = _problem("topic_not_found")
_SUB_404 = _problem("subscription_not_found")


def _param(name: str, where: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


_TOPIC = _param("topic", "path", _NAME, "topic name (else 400 invalid_name)")
_SUBSCRIPTION = _param("name", "path", _NAME, "subscription name (else 400 invalid_name)")


# ------------------------------------------------------------------ requests


def _topic_config(cluster: bool) -> dict[str, Any]:
    d = _TOPIC_DEFAULTS
    replication = limits.REPLICATION_FACTOR if cluster else limits.IntRange(1, 1)
    return _object(
        {
            "partitions": _nullable(_int(limits.PARTITIONS, default=d["partitions"])),
            # PROTOCOL §2: for these two, null means unlimited rather than "absent".
            "retention_ms": _nullable(
                _int(limits.RETENTION_MS, default=d["retention_ms"], description="null: unlimited")
            ),
            "retention_bytes": _nullable(
                _int(
                    limits.RETENTION_BYTES,
                    default=d["retention_bytes"],
                    description="null: unlimited",
                )
            ),
            "dedup_window_ms": _nullable(
                _int(limits.DEDUP_WINDOW_MS, default=d["dedup_window_ms"])
            ),
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
    f"{limits.MIN_VALUE_INT}..{limits.MAX_VALUE_INT}, arrays and objects nested at most "
    f"{limits.MAX_VALUE_DEPTH} levels (else 400 validation_error)",
    "if": {"type": "integer"},
    "then": {"minimum": limits.MIN_VALUE_INT, "maximum": limits.MAX_VALUE_INT},
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
                    limits.PARTITION,
                    description="a partition the topic has (else 400 validation_error)",
                )
            ),
            "id": _nullable({"type": "string", "minLength": 1, "maxLength": limits.MAX_ID_CHARS}),
            "delay_ms": _nullable(
                _int(
                    limits.DELAY_MS,
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
                {"subscription": _NAME, "attempt": _int(limits.IntRange(1))},
                ("subscription", "attempt"),
                closed=False,
            ),
        ]
    }
    return {
        "PullResponse": _object(
            {"messages": {"type": "array", "items": delivered}}, ("messages",), closed=False
        ),
        "AckResponse": _object({"ok": ids, "unknown": ids}, ("ok", "unknown"), closed=False),
    }


def _seek() -> dict[str, Any]:
    """Exactly one form; the other two may be given as null (absent)."""
    forms = {
        "to": {"enum": list(names.POSITIONS)},
        "timestamp": _int(limits.TIMESTAMP),
        "offsets": {
            "type": "object",
            "description": "partition number -> offset; a partition the topic does not "
            "have -> 404 partition_not_found; past the end means the end",
            "propertyNames": {"pattern": _pattern(v.INT_TEXT_RE.pattern)},
            "additionalProperties": _int(limits.OFFSET),
        },
    }
    branches = []
    for form, schema in forms.items():
        others = {name: {"type": "null"} for name in forms if name != form}
        branches.append(_object({form: schema, **others}, (form,)))
    return {"description": "exactly one form", "oneOf": branches}


# ------------------------------------------------------------------ responses


def _topic_view() -> dict[str, Any]:
    config = _object(
        {
            "partitions": _int(limits.PARTITIONS),
            "retention_ms": {"type": ["integer", "null"]},
            "retention_bytes": {"type": ["integer", "null"]},
            "dedup_window_ms": _int(limits.DEDUP_WINDOW_MS),
            "replication_factor": _int(limits.REPLICATION_FACTOR),
            "min_insync_replicas": _int(limits.MIN_INSYNC_REPLICAS),
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
            "timestamp": _int(
                limits.TIMESTAMP, description="broker append time, ms since the epoch"
            ),
            "deliver_at": _int(
                limits.TIMESTAMP,
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
    return {
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
    return with_models(
        {
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
                        "maxItems": limits.MAX_BATCH,
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
            **_subscription_view(),
            "Seek": _seek(),
            **_pull_schemas(),
            "TokenRequest": _token_request(),
        }
    )


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


# ------------------------------------------------------------------ paths


def _body(schema: str, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": _ref(schema)}}}


def _attempts() -> dict[str, Any]:
    attempt = _object(
        {
            "time": _int(limits.TIMESTAMP),
            "id": {"type": "string", "description": "the (first) record's id"},
            "count": _int(
                limits.BATCH_MAX_RECORDS,
                description="records in the request (a batch: PROTOCOL §8)",
            ),
            "attempt": _int(limits.IntRange(1), description="the highest attempt of its records"),
            "status": {"type": ["integer", "null"]},
            "latency_ms": {"type": "number"},
            "error": {"type": ["string", "null"]},
        },
        ("time", "id", "count", "attempt", "status", "latency_ms", "error"),
        closed=False,
    )
    return _object(
        {"subscription": _NAME, "attempts": {"type": "array", "items": attempt}},
        ("subscription", "attempts"),
        closed=False,
    )


def _redrive_response() -> dict[str, Any]:
    counts = ("scanned", "republished", "duplicates", "skipped", "other_reasons")
    return _object(
        {"subscription": _NAME, "dead_letter_topic": _NAME, **{k: _COUNT for k in counts}},
        ("subscription", "dead_letter_topic", *counts),
        closed=False,
    )


def _paths() -> dict[str, Any]:
    read_params = [
        _param("offset", "query", _int(limits.OFFSET), "first offset; not with timestamp"),
        _param(
            "timestamp",
            "query",
            _int(limits.TIMESTAMP),
            "from the first record with timestamp >= T",
        ),
        _param("limit", "query", _int(limits.READ_LIMIT, default=limits.DEFAULT_READ_LIMIT)),
        _param(
            "wait_ms",
            "query",
            _int(limits.WAIT_MS, default=0),
            "long-poll when nothing is there yet",
        ),
    ]
    return {
        "/healthz": {
            "get": {
                "summary": "Readiness: 200 once recovery is complete",
                "responses": {
                    "200": _json(
                        _object({"status": {"const": "ok"}}, ("status",), closed=False), "ready"
                    ),
                    "503": _problem("shutting down"),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text exposition 0.0.4",
                "responses": {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1 document")},
            }
        },
        "/v1/topics": {
            "get": {
                "summary": "List topics",
                "responses": {"200": _json(_ref("TopicList"), "topics")},
            }
        },
        "/v1/topics/{topic}": {
            "parameters": [_TOPIC],
            "put": {
                "summary": "Create a topic",
                "requestBody": _body("TopicConfig", required=False),
                "responses": {
                    "200": _json(_ref("Topic"), "exists; every field given equals its config"),
                    "201": _json(_ref("Topic"), "created"),
                    "400": _BAD,
                    "409": _problem("topic_conflict"),
                    "413": _TOO_LARGE,
                },
            },
            "get": {
                "summary": "Describe a topic",
                "responses": {
                    "200": _json(_ref("Topic"), "the topic"),
                    "400": _BAD,
                    "404": _TOPIC_404,
                },
            },
            "delete": {
                "summary": "Delete a topic and its subscriptions",
                "responses": {"204": {"description": "deleted"}, "400": _BAD, "404": _TOPIC_404},
            },
        },
        "/v1/topics/{topic}/messages": {
            "parameters": [_TOPIC],
            "post": {
                "summary": "Publish a batch (all-or-nothing)",
                "parameters": [
                    _param(
                        "acks",
                        "query",
                        {"enum": [a.value for a in Acks], "default": Acks.ALL.value},
                    )
                ],
                "requestBody": _body("PublishRequest"),
                "responses": {
                    "200": _json(_ref("PublishResponse"), "results in request order"),
                    "202": {"description": "acks=0: validated, appended in the background"},
                    "400": _problem(
                        "bad_request, validation_error (with index: the first bad message) "
                        "or invalid_name"
                    ),
                    "404": _problem("topic_not_found (auto-create off)"),
                    "413": _problem("message_too_large or payload_too_large"),
                    "503": _problem("storage_unavailable"),
                },
            },
        },
        "/v1/topics/{topic}/partitions/{partition}/messages": {
            "parameters": [
                _TOPIC,
                _param("partition", "path", {"type": "integer"}, "else 404 partition_not_found"),
            ],
            "get": {
                "summary": "Read records from a partition",
                "parameters": read_params,
                "responses": {
                    "200": _json(_ref("ReadResponse"), "records and the next offset"),
                    "400": _problem(
                        "bad_request (offset with timestamp), validation_error, invalid_name "
                        "or offset_out_of_range (past the end)"
                    ),
                    "404": _problem("topic_not_found or partition_not_found"),
                },
            },
        },
        "/v1/subscriptions": {
            "get": {
                "summary": "List subscriptions",
                "responses": {"200": _json(_ref("SubscriptionList"), "subscriptions")},
            }
        },
        "/v1/subscriptions/{name}": {
            "parameters": [_SUBSCRIPTION],
            "put": {
                "summary": "Create a subscription",
                "requestBody": _body("SubscriptionConfig"),
                "responses": {
                    "200": _json(
                        _ref("Subscription"),
                        "exists; every field given (but start) equals its config",
                    ),
                    "201": _json(_ref("Subscription"), "created"),
                    "400": _BAD,
                    "404": _TOPIC_404,
                    "409": _problem("subscription_conflict"),
                    "413": _TOO_LARGE,
                },
            },
            "get": {
                "summary": "Describe a subscription with its stats",
                "responses": {
                    "200": _json(_ref("Subscription"), "the subscription"),
                    "400": _BAD,
                    "404": _SUB_404,
                },
            },
            "patch": {
                "summary": "Change a subscription in place (admin): applied at once, the "
                "cursor and in-flight records kept",
                "requestBody": _body("SubscriptionPatch"),
                "responses": {
                    "200": _json(_ref("Subscription"), "the subscription after the change"),
                    "400": _BAD,
                    "404": _SUB_404,
                    "409": _problem(
                        "subscription_conflict: topic, start, delivery or "
                        "ordered_by_key with another value"
                    ),
                    "413": _TOO_LARGE,
                },
            },
            "delete": {
                "summary": "Delete a subscription; its consumers are closed with 4410",
                "responses": {"204": {"description": "deleted"}, "400": _BAD, "404": _SUB_404},
            },
        },
        "/v1/subscriptions/{name}/seek": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Move the subscription's cursor",
                "requestBody": _body("Seek"),
                "responses": {
                    "200": _json(_ref("Subscription"), "the subscription after the seek"),
                    "400": _BAD,
                    "404": _problem("subscription_not_found or partition_not_found"),
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/subscriptions/{name}/pull": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Take records from the subscription's cursor (same deadlines, "
                "attempts and dead-lettering as its other consumers)",
                "requestBody": _body("PullRequest", required=False),
                "responses": {
                    "200": _json(_ref("PullResponse"), "the records, maybe none"),
                    "400": _BAD,
                    "404": _SUB_404,
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/subscriptions/{name}/ack": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Ack in-flight records of the subscription",
                "requestBody": _body("AckRequest"),
                "responses": {
                    "200": _json(_ref("AckResponse"), "which ids were acked, which unknown"),
                    "400": _BAD,
                    "404": _SUB_404,
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/subscriptions/{name}/nack": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Give in-flight records back for redelivery; unknown ids are ignored",
                "requestBody": _body("NackRequest"),
                "responses": {
                    "204": {"description": "done"},
                    "400": _BAD,
                    "404": _SUB_404,
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/subscriptions/{name}/attempts": {
            "parameters": [_SUBSCRIPTION],
            "get": {
                "summary": "The last webhook POSTs of a push subscription, newest first",
                "responses": {
                    "200": _json(_attempts(), "the attempt log"),
                    "400": _problem("invalid_name"),
                    "404": _SUB_404,
                },
            },
        },
        "/v1/subscriptions/{name}/push/rotate-secret": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Rotate a push subscription's secret (admin): the new secret signs "
                "from the next request on; the replaced one is still signed with for "
                f"previous_ttl_ms; expired previous secrets are dropped and at most "
                f"{limits.MAX_PREVIOUS_SECRETS} kept. The cursor, in-flight records, attempts and "
                "stats are untouched",
                "requestBody": _body("SecretRotation"),
                "responses": {
                    "200": _json(_ref("Subscription"), "the subscription after the rotation"),
                    "400": _problem(
                        "bad_request (also: not a push subscription), validation_error or "
                        "invalid_name"
                    ),
                    "404": _SUB_404,
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/subscriptions/{name}/redrive": {
            "parameters": [_SUBSCRIPTION],
            "post": {
                "summary": "Republish the dead-letter topic's records to the source topic "
                "(rate-limited; ids derived from dead-letter offsets, so a retry is "
                "deduplicated)",
                "requestBody": _body("RedriveRequest", required=False),
                "responses": {
                    "200": _json(
                        _redrive_response(),
                        "counts of the records scanned, republished, deduplicated, skipped",
                    ),
                    "400": _BAD,
                    "404": _problem("subscription_not_found or topic_not_found"),
                    "409": _problem("redrive_conflict: no dead_letter_topic, or one is running"),
                    "413": _TOO_LARGE,
                },
            },
        },
        "/v1/tokens": {
            "post": {
                "summary": "Mint a short-lived browser token (PROTOCOL §8) with rights within "
                "the caller's; use it as Bearer (on WebSockets also as the herald.token.<token> "
                "subprotocol, see x-websockets)",
                "requestBody": _body("TokenRequest"),
                "responses": {
                    "201": _json(
                        _object(
                            {"token": {"type": "string"}, "expires_at": _COUNT},
                            ("token", "expires_at"),
                            closed=False,
                        ),
                        "the token and its expiry (ms since the epoch)",
                    ),
                    "400": _BAD,
                    "403": _problem("forbidden: wider than the caller's rights"),
                    "404": _problem("not_found: no credentials file or no signing key"),
                    "413": _TOO_LARGE,
                },
            }
        },
        "/v1/stats": {
            "get": {
                "summary": "One snapshot for the console: server, totals, topics, "
                "subscriptions (with pause_reason and oldest_unacked_age_ms). "
                "GET /v1/stats/ws pushes it every second as {type: stats, ...}",
                "responses": {"200": _json({"type": "object"}, "the snapshot")},
            }
        },
        "/v1/stats/history": {
            "get": {
                "summary": "One topic's (?topic=) or subscription's (?subscription=) samples "
                "of the last 15 minutes, one a second, oldest first: a topic's "
                "published_records_total, a subscription's delivered_total, acked_total "
                "and backlog (an extension; this node's samples)",
                "parameters": [
                    {"name": "topic", "in": "query", "schema": _NAME},
                    {"name": "subscription", "in": "query", "schema": _NAME},
                ],
                "responses": {
                    "200": _json({"type": "object"}, "the samples"),
                    "400": _problem("validation_error: neither or both of topic and subscription"),
                },
            }
        },
        "/v1/cluster": {
            "get": {
                "summary": "The nodes of the cluster and what each leads (PROTOCOL §7); a "
                "single node is a nameless cluster of one",
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "name": {"type": ["string", "null"]},
                                "node": {"type": "string"},
                                "nodes": {
                                    "type": "array",
                                    "items": _object(
                                        {
                                            "id": {"type": "string"},
                                            "url": {"type": "string"},
                                            "live": {"type": "boolean"},
                                            "leads": {"type": "integer", "minimum": 0},
                                            "credentials": _CREDENTIALS_DIGEST,
                                        },
                                        ("id", "url", "live", "leads"),
                                        closed=False,
                                    ),
                                },
                                "partitions": {
                                    "type": "array",
                                    "description": "every partition as its leader reports "
                                    "it (docs/protocol.md, Cluster)",
                                    "items": {"type": "object"},
                                },
                                "subscriptions": {
                                    "type": "array",
                                    "description": "each subscription and the node that "
                                    "coordinates it",
                                    "items": {"type": "object"},
                                },
                            },
                            ("name", "node", "nodes"),
                            closed=False,
                        ),
                        "the cluster",
                    )
                },
            }
        },
        "/v1/cluster/replication": {
            "get": {
                "summary": "Node to node (PROTOCOL §7): the partitions this node leads, with "
                "each follower's lag; 404 on a single node",
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "node": {"type": "string"},
                                "partitions": {"type": "array", "items": {"type": "object"}},
                                "credentials": _CREDENTIALS_DIGEST,
                            },
                            ("node", "partitions"),
                            closed=False,
                        ),
                        "this node's led partitions",
                    ),
                    "404": _problem("not a cluster"),
                },
            }
        },
        "/v1/cluster/lease": {
            "get": {
                "summary": "Node to node (PROTOCOL §7, stale reads): how long ago this node "
                "sent the last renewal of its etcd lease that etcd answered (null: none)",
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "node": {"type": "string"},
                                "renewed_ms_ago": {"type": ["number", "null"]},
                            },
                            ("node", "renewed_ms_ago"),
                        ),
                        "this node's last renewal",
                    ),
                    "404": _problem("not a cluster"),
                },
            }
        },
    }


def document(version: str = "0.1.0", *, cluster: bool = False) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Herald",
            "version": version,
            "description": "Push-delivery pub/sub. WebSocket consumers (PROTOCOL §3) are "
            "GET /v1/subscriptions/{name}/ws and GET /v1/topics/{topic}/ws; "
            "the stats WebSocket is GET /v1/stats/ws; the browser console is /console/.",
        },
        "paths": _paths(),
        "components": {"schemas": _schemas(cluster)},
        "x-websockets": _websockets(),
    }


def _websockets() -> dict[str, Any]:
    """The WebSocket routes (OpenAPI has no way to describe a WebSocket: a vendor
    extension, so that tools reading this document still learn them)."""
    auth = (
        "With a credentials file: `Authorization: Bearer <token>`; browsers offer the "
        "subprotocols `herald.v1` and `herald.token.<token>` (the server selects "
        "`herald.v1`), or pass `?token=` (kept for compatibility; URLs end up in logs)."
    )
    closes = {
        "1001": "server shutting down",
        "1008": "too many bad frames",
        "1013": "too many connections from this client address, or the server is out of "
        "descriptors or disk (try again)",
        "4400": "bad query parameters",
        "4401": "no or bad credentials (or the browser token expired)",
        "4403": "not allowed",
        "4404": "no such subscription or topic",
        "4409": "the subscription is a push subscription",
        "4410": "subscription or topic deleted",
    }
    credit = {"name": "credit", "in": "query", "schema": _int(default=0)}
    return {
        "/v1/subscriptions/{name}/ws": {
            "summary": "A durable consumer (PROTOCOL §3): ready, deliver, acked and error "
            "frames out; credit, ack, nack and extend frames in",
            "needs": "subscribe on the subscription's topic",
            "parameters": [credit],
            "authentication": auth,
            "close_codes": closes,
        },
        "/v1/topics/{topic}/ws": {
            "summary": "An ephemeral tail (PROTOCOL §3), at-most-once",
            "needs": "subscribe on the topic",
            "parameters": [
                credit,
                {
                    "name": "from",
                    "in": "query",
                    "schema": {"type": "string", "default": "latest"},
                    "description": "latest, earliest, an offset or ts:<ms>",
                },
            ],
            "authentication": auth,
            "close_codes": closes,
        },
        "/v1/cluster/fetch": {
            "summary": "Node to node (PROTOCOL §7): a follower's replication stream",
            "needs": "admin (the cluster token)",
            "parameters": [],
            "authentication": auth,
            "close_codes": closes,
        },
        "/v1/stats/ws": {
            "summary": "The GET /v1/stats snapshot, pushed every second as {type: stats, …}",
            "needs": "metrics or admin",
            "parameters": [],
            "authentication": auth,
            "close_codes": closes,
        },
    }


def document_bytes(*, cluster: bool = False) -> bytes:
    return orjson.dumps(document(cluster=cluster))
