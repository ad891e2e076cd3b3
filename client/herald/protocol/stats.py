"""The statistics a server reports of a subscription (PROTOCOL §5 `stats`): declared once,
the delivery core fills them in, the server's OpenAPI document publishes their schema
(server/schemas.py), and a client can decode them with ``msgspec.convert``."""

from __future__ import annotations

from typing import Any

import msgspec

from herald.protocol.records import Count


class PartitionStats(msgspec.Struct, frozen=True):
    """Where one partition's subscription cursor stands: every offset below ``ack_floor``
    is acked (or dead-lettered, or filtered out)."""

    partition: Count
    ack_floor: Count


class SubscriptionStats(msgspec.Struct, frozen=True, kw_only=True):
    """PROTOCOL §5; a push subscription adds the endpoint_* members of docs/protocol.md."""

    backlog: Count
    in_flight: Count
    consumers: Count
    delivered_total: Count
    redelivered_total: Count
    acked_total: Count
    dead_lettered_total: Count
    expired_total: Count
    filtered_total: Count  # PROTOCOL §8: acked unsent, not matching the filter
    delayed: Count  # PROTOCOL §8: read, waiting for their deliver_at
    partitions: tuple[PartitionStats, ...]

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of the stats (arrays as lists, as a decoded body has them)."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["partitions"] = list(data["partitions"])
        return data
