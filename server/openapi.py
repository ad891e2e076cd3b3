"""The OpenAPI 3.1 description of the HTTP API (PROTOCOL §2, §5), served at /openapi.json.

Written by hand next to the routes rather than generated, so it says what the
protocol promises (codes, ranges, forms) and not just what the handlers accept.
A test checks that its paths and methods are exactly the app's routes.
"""

from __future__ import annotations

from typing import Any

import orjson

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


def _int(minimum: int | None = None, maximum: int | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,248}$"}
_BAD = _problem("bad_request, validation_error or invalid_name")
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


_TOPIC = _param("topic", "path", _NAME, "topic name")
_SUBSCRIPTION = _param("name", "path", _NAME, "subscription name")

SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details",
        "required": ["status", "title", "detail", "code"],
        "properties": {
            "status": {"type": "integer"},
            "title": {"type": "string"},
            "detail": {"type": "string"},
            "code": {"type": "string"},
            "index": {
                "type": "integer",
                "description": "position of the first bad message of a batch",
            },
        },
    },
    "TopicConfig": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "partitions": _int(1, 1024, default=1),
            "retention_ms": {"type": ["integer", "null"], "minimum": 1000, "default": 1209600000},
            "retention_bytes": {"type": ["integer", "null"], "minimum": 1048576, "default": None},
            "dedup_window_ms": _int(1000, 604800000, default=120000),
        },
    },
    "Topic": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "config": _ref("TopicConfig"),
            "partitions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "partition": _int(0),
                        "start_offset": _int(0),
                        "end_offset": _int(0),
                        "bytes": _int(0),
                    },
                },
            },
            "messages_total": _int(0),
            "bytes_total": _int(0),
        },
    },
    "TopicList": {
        "type": "object",
        "properties": {
            "topics": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": _NAME, "config": _ref("TopicConfig")},
                },
            }
        },
    },
    "Message": {
        "type": "object",
        "additionalProperties": False,
        "description": "exactly one of value and value_b64",
        "properties": {
            "value": {"description": "any JSON value, null included"},
            "value_b64": {"type": "string", "contentEncoding": "base64"},
            "key": {"type": ["string", "null"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "partition": _int(0),
            "id": {"type": "string", "minLength": 1, "maxLength": 128},
        },
    },
    "PublishRequest": {
        "type": "object",
        "required": ["messages"],
        "additionalProperties": False,
        "properties": {
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": 10000,
                "items": _ref("Message"),
            }
        },
    },
    "PublishResponse": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "partition": _int(0),
                        "offset": _int(0),
                        "duplicate": {"type": "boolean"},
                    },
                },
            }
        },
    },
    "Record": {
        "type": "object",
        "required": ["topic", "id", "partition", "offset", "timestamp", "key", "headers"],
        "properties": {
            "topic": _NAME,
            "id": {"type": "string", "description": "{partition}-{offset}"},
            "partition": _int(0),
            "offset": _int(0),
            "timestamp": _int(0, description="broker append time, ms since the epoch"),
            "key": {"type": ["string", "null"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "value": {},
            "value_b64": {"type": "string", "contentEncoding": "base64"},
        },
    },
    "ReadResponse": {
        "type": "object",
        "properties": {
            "messages": {"type": "array", "items": _ref("Record")},
            "next_offset": _int(0),
        },
    },
    "SubscriptionConfig": {
        "type": "object",
        "required": ["topic"],
        "additionalProperties": False,
        "properties": {
            "topic": _NAME,
            "start": {
                "oneOf": [
                    {"enum": ["earliest", "latest"]},
                    {
                        "type": "object",
                        "required": ["timestamp"],
                        "additionalProperties": False,
                        "properties": {"timestamp": _int(0)},
                    },
                ],
                "default": "latest",
            },
            "delivery": {"enum": ["at_least_once", "at_most_once"], "default": "at_least_once"},
            "ack_deadline_ms": _int(100, 600000, default=30000),
            "max_in_flight": _int(1, 100000, default=1000),
            "max_deliveries": _int(0, 1000, default=5),
            "retry_backoff": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "min_ms": _int(1, 3600000, default=100),
                    "max_ms": _int(1, 3600000, default=60000),
                },
            },
            "dead_letter_topic": {"anyOf": [_NAME, {"type": "null"}], "default": None},
            "ordered_by_key": {"type": "boolean", "default": False},
            "push": {"anyOf": [_ref("PushConfig"), {"type": "null"}], "default": None},
        },
    },
    "PushConfig": {
        "type": "object",
        "required": ["url", "secret"],
        "additionalProperties": False,
        "properties": {
            "url": {"type": "string", "format": "uri"},
            "secret": {"type": "string", "pattern": "^whsec_", "writeOnly": True},
            "max_in_flight": _int(1, 1000, default=16),
            "timeout_ms": _int(100, 60000, default=10000),
            "breaker": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "failures": _int(1, 1000, default=5),
                    "open_ms": _int(100, 3600000, default=1000),
                    "max_open_ms": _int(100, 3600000, default=60000),
                },
            },
            "previous_secrets": {
                "type": "array",
                "maxItems": 5,
                "description": "docs/protocol.md: secrets still signed with until expires_at "
                "(rotation); GET shows only expires_at",
                "items": {
                    "type": "object",
                    "required": ["secret", "expires_at"],
                    "additionalProperties": False,
                    "properties": {
                        "secret": {"type": "string", "pattern": "^whsec_", "writeOnly": True},
                        "expires_at": _int(0, description="ms since the epoch"),
                    },
                },
            },
        },
    },
    "SubscriptionStats": {
        "type": "object",
        "properties": {
            "backlog": _int(0),
            "in_flight": _int(0),
            "consumers": _int(0),
            "delivered_total": _int(0),
            "redelivered_total": _int(0),
            "acked_total": _int(0),
            "dead_lettered_total": _int(0),
            "expired_total": _int(0),
            "partitions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"partition": _int(0), "ack_floor": _int(0)},
                },
            },
        },
    },
    "Subscription": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "config": _ref("SubscriptionConfig"),
            "stats": _ref("SubscriptionStats"),
        },
    },
    "SubscriptionList": {
        "type": "object",
        "properties": {
            "subscriptions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": _NAME, "config": _ref("SubscriptionConfig")},
                },
            }
        },
    },
    "Seek": {
        "description": "exactly one form",
        "oneOf": [
            {
                "type": "object",
                "required": ["to"],
                "properties": {"to": {"enum": ["earliest", "latest"]}},
            },
            {"type": "object", "required": ["timestamp"], "properties": {"timestamp": _int(0)}},
            {
                "type": "object",
                "required": ["offsets"],
                "properties": {
                    "offsets": {
                        "type": "object",
                        "propertyNames": {"pattern": "^[0-9]+$"},
                        "additionalProperties": _int(0),
                    }
                },
            },
        ],
    },
}

PATHS: dict[str, Any] = {
    "/healthz": {
        "get": {
            "summary": "Readiness: 200 once recovery is complete",
            "responses": {
                "200": _json(
                    {"type": "object", "properties": {"status": {"const": "ok"}}}, "ready"
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
        "get": {"summary": "List topics", "responses": {"200": _json(_ref("TopicList"), "topics")}}
    },
    "/v1/topics/{topic}": {
        "parameters": [_TOPIC],
        "put": {
            "summary": "Create a topic",
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": _ref("TopicConfig")}},
            },
            "responses": {
                "200": _json(_ref("Topic"), "exists; every field given equals its config"),
                "201": _json(_ref("Topic"), "created"),
                "400": _BAD,
                "409": _problem("topic_conflict"),
            },
        },
        "get": {
            "summary": "Describe a topic",
            "responses": {"200": _json(_ref("Topic"), "the topic"), "400": _BAD, "404": _TOPIC_404},
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
            "parameters": [_param("acks", "query", {"enum": ["0", "1", "all"], "default": "all"})],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("PublishRequest")}},
            },
            "responses": {
                "200": _json(_ref("PublishResponse"), "results in request order"),
                "202": {"description": "acks=0: validated, appended in the background"},
                "400": _BAD,
                "404": _problem("topic_not_found (auto-create off) or partition_not_found"),
                "413": _problem("message_too_large or payload_too_large"),
                "503": _problem("storage_unavailable"),
            },
        },
    },
    "/v1/topics/{topic}/partitions/{partition}/messages": {
        "parameters": [_TOPIC, _param("partition", "path", _int(0))],
        "get": {
            "summary": "Read records from a partition",
            "parameters": [
                _param("offset", "query", _int(0), "first offset; not with timestamp"),
                _param("timestamp", "query", _int(0), "from the first record with timestamp >= T"),
                _param("limit", "query", _int(1, 10000, default=100)),
                _param(
                    "wait_ms",
                    "query",
                    _int(0, 30000, default=0),
                    "long-poll when nothing is there yet",
                ),
            ],
            "responses": {
                "200": _json(_ref("ReadResponse"), "records and the next offset"),
                "400": _problem("bad_request, validation_error or offset_out_of_range"),
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
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("SubscriptionConfig")}},
            },
            "responses": {
                "200": _json(
                    _ref("Subscription"), "exists; every field given (but start) equals its config"
                ),
                "201": _json(_ref("Subscription"), "created"),
                "400": _BAD,
                "404": _TOPIC_404,
                "409": _problem("subscription_conflict"),
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
        "delete": {
            "summary": "Delete a subscription; its consumers are closed with 4410",
            "responses": {"204": {"description": "deleted"}, "400": _BAD, "404": _SUB_404},
        },
    },
    "/v1/subscriptions/{name}/seek": {
        "parameters": [_SUBSCRIPTION],
        "post": {
            "summary": "Move the subscription's cursor",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("Seek")}},
            },
            "responses": {
                "200": _json(_ref("Subscription"), "the subscription after the seek"),
                "400": _BAD,
                "404": _problem("subscription_not_found or partition_not_found"),
            },
        },
    },
    "/v1/subscriptions/{name}/attempts": {
        "parameters": [_SUBSCRIPTION],
        "get": {
            "summary": "The last 100 webhook POSTs of a push subscription, oldest first",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "subscription": {"type": "string"},
                            "attempts": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "time": _int(0),
                                        "id": {"type": "string"},
                                        "attempt": _int(1),
                                        "status": {"type": ["integer", "null"]},
                                        "latency_ms": {"type": "number"},
                                        "error": {"type": ["string", "null"]},
                                    },
                                },
                            },
                        },
                    },
                    "the attempt log",
                ),
                "404": _problem("subscription_not_found"),
            },
        },
    },
    "/v1/subscriptions/{name}/push/rotate-secret": {
        "parameters": [_SUBSCRIPTION],
        "post": {
            "summary": "Rotate a push subscription's secret (admin): the new secret signs from "
            "the next request on; the replaced one is still signed with for previous_ttl_ms; "
            "expired previous secrets are dropped and at most 5 kept. The cursor, in-flight "
            "records, attempts and stats are untouched",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["secret"],
                            "additionalProperties": False,
                            "properties": {
                                "secret": {
                                    "type": "string",
                                    "pattern": "^whsec_",
                                    "writeOnly": True,
                                    "description": "whsec_ + base64 of 16..64 bytes",
                                },
                                "previous_ttl_ms": _int(
                                    0,
                                    2_592_000_000,
                                    default=86_400_000,
                                    description="how long the replaced secret is still signed "
                                    "with; 0 drops it at once",
                                ),
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(_ref("Subscription"), "the subscription after the rotation"),
                "400": _problem(
                    "bad_request (also: not a push subscription), validation_error or invalid_name"
                ),
                "404": _SUB_404,
            },
        },
    },
    "/v1/subscriptions/{name}/redrive": {
        "parameters": [_SUBSCRIPTION],
        "post": {
            "summary": "Republish the dead-letter topic's records to the source topic "
            "(rate-limited; ids derived from dead-letter offsets, so a retry is deduplicated)",
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "rate": _int(1, 10_000, description="records/s, default 500"),
                                "max_records": _int(1, 1_000_000, description="default 10000"),
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            k: {"type": "integer"}
                            for k in ("scanned", "republished", "duplicates", "skipped")
                        },
                    },
                    "counts of the records scanned, republished, deduplicated, skipped",
                ),
                "400": _BAD,
                "404": _problem("subscription_not_found or topic_not_found"),
                "409": _problem("redrive_conflict: no dead_letter_topic, or one is running"),
            },
        },
    },
    "/v1/stats": {
        "get": {
            "summary": "One snapshot for the console: server, totals, topics, subscriptions "
            "(with pause_reason and oldest_unacked_age_ms). GET /v1/stats/ws pushes it "
            "every second as {type: stats, ...}",
            "responses": {"200": _json({"type": "object"}, "the snapshot")},
        }
    },
}


def document(version: str = "0.1.0") -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Herald",
            "version": version,
            "description": "Push-delivery pub/sub. WebSocket consumers (PROTOCOL §3) are "
            "GET /v1/subscriptions/{name}/ws and GET /v1/topics/{topic}/ws; "
            "the stats WebSocket is GET /v1/stats/ws; the browser console is /console/.",
        },
        "paths": PATHS,
        "components": {"schemas": SCHEMAS},
    }


def document_bytes() -> bytes:
    return orjson.dumps(document())
