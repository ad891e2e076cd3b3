"""The ``x-websockets`` entries of /openapi.json: each WebSocket endpoint's summary, query
parameters, authentication and close codes (PROTOCOL §3), attached to its row in
server/route_table.py as server/openapi_paths.py's operations are to theirs; the frames
each one carries are generated from the protocol's models (server/schemas.py
``socket_frames``). OpenAPI has no way to describe a WebSocket: a vendor extension, so
that tools reading the document still learn them.
"""

from __future__ import annotations

from typing import Any

from herald.protocol.close_codes import MEANINGS
from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from server.openapi import _int, _ref

_AUTH = (
    "With a credentials file: `Authorization: Bearer <token>`; browsers offer the "
    "subprotocols `herald.v1` and `herald.token.<token>` (the server selects "
    "`herald.v1`), or pass `?token=` (kept for compatibility; URLs end up in logs)."
)
_CLOSES = {str(int(code)): meaning for code, meaning in MEANINGS.items()}
# docs/protocol.md "MessagePack": what the consumer sockets select when offered.
_SUBPROTOCOLS = {
    MSGPACK_SUBPROTOCOL: "every frame one msgpack map in a binary frame, with the JSON "
    "frames' members; a record carries `value` (bin: a bytes record) or `value_json` (the "
    "JSON text of a JSON value) (frames: PackedDeliverFrame, PackedTailDeliverFrame)",
    "herald.v1": "JSON (PROTOCOL §3): what a browser offers beside its token",
}
_CREDIT = {"name": "credit", "in": "query", "schema": _int(default=0)}

# /v1/subscriptions/{name}/ws
SUBSCRIPTION_SOCKET: dict[str, Any] = {
    "summary": "A durable consumer (PROTOCOL §3): ready, deliver, acked and error "
    "frames out; credit, ack, nack and extend frames in",
    "needs": "subscribe on the subscription's topic",
    "parameters": [_CREDIT],
    "authentication": _AUTH,
    "close_codes": _CLOSES,
    "subprotocols": _SUBPROTOCOLS,
}


# /v1/topics/{topic}/ws
TOPIC_TAIL_SOCKET: dict[str, Any] = {
    "summary": "An ephemeral tail (PROTOCOL §3), at-most-once",
    "needs": "subscribe on the topic",
    "parameters": [
        _CREDIT,
        {
            "name": "from",
            "in": "query",
            "schema": {"type": "string", "default": "latest"},
            "description": "latest, earliest, an offset or ts:<ms>",
        },
        {
            "name": "positions",
            "in": "query",
            "schema": {"type": "string", "enum": ["true", "false"], "default": "false"},
            "description": "true: the ready frame says where the tail starts in each "
            "partition (`positions`, docs/protocol.md §3)",
        },
    ],
    "authentication": _AUTH,
    "close_codes": _CLOSES,
    "subprotocols": _SUBPROTOCOLS,
}


# /v1/cluster/fetch
CLUSTER_FETCH_SOCKET: dict[str, Any] = {
    "summary": "Node to node (PROTOCOL §7): a follower's replication stream",
    "needs": "admin (the cluster token)",
    "parameters": [],
    "authentication": _AUTH,
    "close_codes": _CLOSES,
}


# /v1/stats/ws
STATS_SOCKET: dict[str, Any] = {
    "summary": "The GET /v1/stats snapshot, pushed every second as {type: stats, …}",
    "needs": "metrics or admin",
    "parameters": [],
    "authentication": _AUTH,
    "close_codes": _CLOSES,
    "frames": {"server": _ref("StatsFrame")},  # client frames are ignored
}
