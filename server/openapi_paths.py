"""The OpenAPI ``paths``: each endpoint's operation (summary, parameters, request body,
responses), attached to its row in server/route_table.py, and the document made
from that table.

Only what an operation says lives here; its method, path and who may call it are the
table's. The schemas it names (``#/components/schemas/...``) are server/openapi.py's.
The WebSocket endpoints (``x-websockets``) are described the same way in
server/openapi_sockets.py.
"""

from __future__ import annotations

from typing import Any

from herald.protocol import limits
from herald.protocol.encodings import MSGPACK_MEDIA_TYPE
from herald.protocol.publish import FORWARDED_RECORDS
from server.openapi import _COUNT, _NAME, _int, _object, _ref
from storage.record import Acks

# docs/security.md (a cluster): a node's credentials file as loaded, so a mismatch shows.
_CREDENTIALS_DIGEST = {
    "type": ["string", "null"],
    "pattern": "^[0-9a-f]{16}$",
    "description": "the first 16 hex digits of the SHA-256 of the node's credentials file "
    "(parsed, canonical form); null without one, or when the node did not answer",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


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


# Each path parameter, by name: server/endpoint.py lists them on every path that has them.
PATH_PARAMETERS = {
    "topic": _param("topic", "path", _NAME, "topic name (else 400 invalid_name)"),
    "name": _param("name", "path", _NAME, "subscription name (else 400 invalid_name)"),
    "partition": _param("partition", "path", {"type": "integer"}, "else 404 partition_not_found"),
}


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


# ------------------------------------------------------------------ operations

_READ_PARAMS = [
    _param("offset", "query", _int(limits.OFFSET), "first offset; not with timestamp"),
    _param(
        "timestamp", "query", _int(limits.TIMESTAMP), "from the first record with timestamp >= T"
    ),
    _param("limit", "query", _int(limits.READ_LIMIT, default=limits.DEFAULT_READ_LIMIT)),
    _param(
        "wait_ms", "query", _int(limits.WAIT_MS, default=0), "long-poll when nothing is there yet"
    ),
]

# GET /healthz
HEALTHZ: dict[str, Any] = {
    "summary": "Readiness: 200 once recovery is complete",
    "responses": {
        "200": _json(_object({"status": {"const": "ok"}}, ("status",), closed=False), "ready"),
        "503": _problem("shutting down"),
    },
}


# GET /metrics
METRICS: dict[str, Any] = {
    "summary": "Prometheus text exposition 0.0.4",
    "responses": {
        "200": {
            "description": "metrics",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
}


# GET /openapi.json
OPENAPI: dict[str, Any] = {
    "summary": "This document",
    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1 document")},
}


# GET /v1/topics
LIST_TOPICS: dict[str, Any] = {
    "summary": "List topics",
    "responses": {"200": _json(_ref("TopicList"), "topics")},
}


# PUT /v1/topics/{topic}
PUT_TOPIC: dict[str, Any] = {
    "summary": "Create a topic",
    "requestBody": _body("TopicConfig", required=False),
    "responses": {
        "200": _json(_ref("Topic"), "exists; every field given equals its config"),
        "201": _json(_ref("Topic"), "created"),
        "400": _BAD,
        "409": _problem("topic_conflict"),
        "413": _TOO_LARGE,
    },
}


# GET /v1/topics/{topic}
GET_TOPIC: dict[str, Any] = {
    "summary": "Describe a topic",
    "responses": {
        "200": _json(_ref("Topic"), "the topic"),
        "400": _BAD,
        "404": _TOPIC_404,
    },
}


# DELETE /v1/topics/{topic}
DELETE_TOPIC: dict[str, Any] = {
    "summary": "Delete a topic and its subscriptions",
    "responses": {"204": {"description": "deleted"}, "400": _BAD, "404": _TOPIC_404},
}


# POST /v1/topics/{topic}/messages
# docs/protocol.md "Publishing to the leader"
_FORWARDED_RECORDS_HEADER: dict[str, Any] = {
    FORWARDED_RECORDS: {
        "description": "In a cluster: how many of the records this node forwarded to "
        "their partitions' leaders (absent: none). A client that publishes to the "
        "leaders itself (GET /v1/topics/{topic}: leader_url) saves the hop.",
        "schema": {"type": "integer", "minimum": 1},
    }
}

PUBLISH: dict[str, Any] = {
    "summary": "Publish a batch (all-or-nothing)",
    "parameters": [
        _param(
            "acks",
            "query",
            {"enum": [a.value for a in Acks], "default": Acks.ALL.value},
        )
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _ref("PublishRequest")},
            # docs/protocol.md "MessagePack": the same map in msgpack, `value` a bin
            MSGPACK_MEDIA_TYPE: {"schema": _ref("PackedPublishRequest")},
        },
    },
    "responses": {
        "200": _json(_ref("PublishResponse"), "results in request order")
        | {"headers": _FORWARDED_RECORDS_HEADER},
        "202": {
            "description": "acks=0: validated, appended in the background",
            "headers": _FORWARDED_RECORDS_HEADER,
        },
        "400": _problem(
            "bad_request, validation_error (with index: the first bad message) or invalid_name"
        ),
        "404": _problem("topic_not_found (auto-create off)"),
        "413": _problem("message_too_large or payload_too_large"),
        "503": _problem("storage_unavailable"),
    },
}


# GET /v1/topics/{topic}/partitions/{partition}/messages
READ: dict[str, Any] = {
    "summary": "Read records from a partition",
    "parameters": _READ_PARAMS,
    "responses": {
        "200": _json(_ref("ReadResponse"), "records and the next offset"),
        "400": _problem(
            "bad_request (offset with timestamp), validation_error, invalid_name "
            "or offset_out_of_range (past the end)"
        ),
        "404": _problem("topic_not_found or partition_not_found"),
    },
}


# GET /v1/subscriptions
LIST_SUBSCRIPTIONS: dict[str, Any] = {
    "summary": "List subscriptions",
    "responses": {"200": _json(_ref("SubscriptionList"), "subscriptions")},
}


# PUT /v1/subscriptions/{name}
PUT_SUBSCRIPTION: dict[str, Any] = {
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
}


# GET /v1/subscriptions/{name}
GET_SUBSCRIPTION: dict[str, Any] = {
    "summary": "Describe a subscription with its stats",
    "responses": {
        "200": _json(_ref("Subscription"), "the subscription"),
        "400": _BAD,
        "404": _SUB_404,
    },
}


# PATCH /v1/subscriptions/{name}
PATCH_SUBSCRIPTION: dict[str, Any] = {
    "summary": "Change a subscription in place (admin): applied at once, the "
    "cursor and in-flight records kept",
    "requestBody": _body("SubscriptionPatch"),
    "responses": {
        "200": _json(_ref("Subscription"), "the subscription after the change"),
        "400": _BAD,
        "404": _SUB_404,
        "409": _problem(
            "subscription_conflict: topic, start, delivery or ordered_by_key with another value"
        ),
        "413": _TOO_LARGE,
    },
}


# DELETE /v1/subscriptions/{name}
DELETE_SUBSCRIPTION: dict[str, Any] = {
    "summary": "Delete a subscription; its consumers are closed with 4410",
    "responses": {"204": {"description": "deleted"}, "400": _BAD, "404": _SUB_404},
}


# POST /v1/subscriptions/{name}/seek
SEEK: dict[str, Any] = {
    "summary": "Move the subscription's cursor",
    "requestBody": _body("Seek"),
    "responses": {
        "200": _json(_ref("Subscription"), "the subscription after the seek"),
        "400": _BAD,
        "404": _problem("subscription_not_found or partition_not_found"),
        "413": _TOO_LARGE,
    },
}


# POST /v1/subscriptions/{name}/pull
PULL: dict[str, Any] = {
    "summary": "Take records from the subscription's cursor (same deadlines, "
    "attempts and dead-lettering as its other consumers)",
    "requestBody": _body("PullRequest", required=False),
    "responses": {
        "200": _json(_ref("PullResponse"), "the records, maybe none"),
        "400": _BAD,
        "404": _SUB_404,
        "413": _TOO_LARGE,
    },
}


# POST /v1/subscriptions/{name}/ack
ACK: dict[str, Any] = {
    "summary": "Ack in-flight records of the subscription",
    "requestBody": _body("AckRequest"),
    "responses": {
        "200": _json(_ref("AckResponse"), "which ids were acked, which unknown"),
        "400": _BAD,
        "404": _SUB_404,
        "413": _TOO_LARGE,
    },
}


# POST /v1/subscriptions/{name}/nack
NACK: dict[str, Any] = {
    "summary": "Give in-flight records back for redelivery; unknown ids are ignored",
    "requestBody": _body("NackRequest"),
    "responses": {
        "204": {"description": "done"},
        "400": _BAD,
        "404": _SUB_404,
        "413": _TOO_LARGE,
    },
}


# GET /v1/subscriptions/{name}/attempts
ATTEMPTS: dict[str, Any] = {
    "summary": "The last webhook POSTs of a push subscription, newest first",
    "responses": {
        "200": _json(_attempts(), "the attempt log"),
        "400": _problem("invalid_name"),
        "404": _SUB_404,
    },
}


# POST /v1/subscriptions/{name}/push/rotate-secret
ROTATE_SECRET: dict[str, Any] = {
    "summary": "Rotate a push subscription's secret (admin): the new secret signs "
    "from the next request on; the replaced one is still signed with for "
    f"previous_ttl_ms; expired previous secrets are dropped and at most "
    f"{limits.MAX_PREVIOUS_SECRETS} kept. The cursor, in-flight records, attempts and "
    "stats are untouched",
    "requestBody": _body("SecretRotation"),
    "responses": {
        "200": _json(_ref("Subscription"), "the subscription after the rotation"),
        "400": _problem(
            "bad_request (also: not a push subscription), validation_error or invalid_name"
        ),
        "404": _SUB_404,
        "413": _TOO_LARGE,
    },
}


# POST /v1/subscriptions/{name}/redrive
REDRIVE: dict[str, Any] = {
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
}


# POST /v1/tokens
MINT_TOKEN: dict[str, Any] = {
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


# GET /v1/stats
STATS: dict[str, Any] = {
    "summary": "One snapshot for the console: server, totals, topics, "
    "subscriptions (with pause_reason and oldest_unacked_age_ms). "
    "GET /v1/stats/ws pushes it every second as {type: stats, ...}",
    "responses": {"200": _json(_ref("StatsResponse"), "the snapshot")},
}


# GET /v1/stats/history
STATS_HISTORY: dict[str, Any] = {
    "summary": "One topic's (?topic=) or subscription's (?subscription=) samples "
    "of the last 15 minutes, one a second, oldest first: a topic's "
    "published_records_total, a subscription's delivered_total, acked_total "
    "and backlog (an extension; this node's samples)",
    "parameters": [
        {"name": "topic", "in": "query", "schema": _NAME},
        {"name": "subscription", "in": "query", "schema": _NAME},
    ],
    "responses": {
        "200": _json({"oneOf": [_ref("TopicHistory"), _ref("SubscriptionHistory")]}, "samples"),
        "400": _problem("validation_error: neither or both of topic and subscription"),
    },
}


# GET /v1/cluster
CLUSTER: dict[str, Any] = {
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
                        "description": "each subscription and the node that coordinates it",
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


# GET /v1/cluster/replication
REPLICATION: dict[str, Any] = {
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


# GET /v1/cluster/lease
LEASE: dict[str, Any] = {
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


# POST /v1/cluster/proof (cluster/trust.py), open: asked before any credential is sent
_NONCE = {"type": "string", "minLength": 16, "maxLength": 128}
PEER_PROOF: dict[str, Any] = {
    "summary": "Node to node (PROTOCOL §7): an HMAC per cluster key of the nonce and this "
    "node's URL; 404 on a node without cluster keys",
    "requestBody": {"required": True, "content": {"application/json": {"schema": _object(
        {"nonce": _NONCE}, ("nonce",), closed=False)}}},
    "responses": {
        "200": _json(_object({"url": {"type": "string"}, "proofs": {"type": "object"}},
                             ("url", "proofs")), "the proofs, by key id"),
        "400": _problem("bad_request: no nonce of 16 to 128 characters"),
        "404": _problem("not a cluster"),
        "413": _TOO_LARGE,
    },
}  # fmt: skip
