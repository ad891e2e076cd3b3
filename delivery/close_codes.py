"""The WebSocket close codes of PROTOCOL §3, in one place for every layer that closes a
consumer: the engine (4410 on delete, 1001 on shutdown), the WebSocket adapters in
subscribers/, and the server's access control (4401/4403) and stats stream (1001)."""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001  # the server is shutting down
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
