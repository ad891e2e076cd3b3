"""The WebSocket close codes of PROTOCOL §3, in one place for whoever closes a consumer
(the engine, the WebSocket adapters, access control, the stats stream, the cluster's
peer socket) and whoever reads a close (the SDK's consumer and tail)."""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001  # the server is shutting down
    ABNORMAL = 1006  # never sent: the connection dropped without a close frame
    INVALID_DATA = 1007  # a node's frame is not a message of cluster/wire.py
    POLICY = 1008  # too many bad frames
    INTERNAL = 1011  # an unexpected server error
    SERVICE_RESTART = 1012  # PROTOCOL §7: the subscription moved to another node
    TRY_AGAIN_LATER = 1013  # out of resources (PROTOCOL §6: descriptors, disk)
    BAD_QUERY = 4400  # a bad `credit` or `from` query parameter
    UNAUTHORIZED = 4401  # no or bad token (PROTOCOL §6)
    FORBIDDEN = 4403  # the token may not do this (PROTOCOL §6)
    NOT_FOUND = 4404  # no such subscription or topic
    PUSH_SUBSCRIPTION = 4409  # a push subscription has no WebSocket consumers
    DELETED = 4410  # the subscription or topic was deleted


# What each code means when a Herald server sends it: the OpenAPI document's
# `x-websockets` close codes are this table (1000 and 1006 are not the server's to say).
MEANINGS: dict[CloseCode, str] = {
    CloseCode.GOING_AWAY: "server shutting down",
    CloseCode.INVALID_DATA: "a node's frame that is not a message of the cluster's wire "
    "(the replication socket only)",
    CloseCode.POLICY: "too many bad frames",
    CloseCode.INTERNAL: "an unexpected server error",
    CloseCode.SERVICE_RESTART: "the subscription moved to another node, or this node "
    "stopped serving it (PROTOCOL §7): reconnect",
    CloseCode.TRY_AGAIN_LATER: "too many connections from this client address, or the "
    "server is out of descriptors or disk (try again)",
    CloseCode.BAD_QUERY: "bad query parameters",
    CloseCode.UNAUTHORIZED: "no or bad credentials (or the browser token expired)",
    CloseCode.FORBIDDEN: "not allowed",
    CloseCode.NOT_FOUND: "no such subscription or topic",
    CloseCode.PUSH_SUBSCRIPTION: "the subscription is a push subscription",
    CloseCode.DELETED: "subscription or topic deleted",
}

# The closes after which reconnecting cannot help, and the code a client reports for each.
TERMINAL: dict[int, str] = {
    CloseCode.BAD_QUERY: "bad_request",
    CloseCode.UNAUTHORIZED: "unauthorized",
    CloseCode.FORBIDDEN: "forbidden",
    CloseCode.NOT_FOUND: "not_found",
    CloseCode.PUSH_SUBSCRIPTION: "push_subscription",
    CloseCode.DELETED: "subscription_deleted",
    CloseCode.POLICY: "too_many_bad_frames",
}

# RFC 6455 codes that say "come back shortly": 1012 service restart (PROTOCOL §7: a
# subscription's coordinator died or is moving), 1013 try again later.
COME_BACK = frozenset({CloseCode.SERVICE_RESTART, CloseCode.TRY_AGAIN_LATER})
