"""The statistics a server reports of a subscription (PROTOCOL §5 `stats`), and the push
members a push subscription's add (docs/protocol.md): declared once, the delivery core
and the webhook dispatcher fill them in, the server's OpenAPI document publishes their
schemas (server/schemas.py), and a client can decode them with ``msgspec.convert``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

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


EndpointState = Literal["closed", "open", "half_open"]  # delivery/breaker.py
LastError = Annotated[
    str | None, Meta(description="its category: timeout, connection refused, http 500…")
]
RequestsOut = Annotated[int, Meta(ge=0, description="requests (a batch is one)")]
RecordsHeld = Annotated[int, Meta(ge=0, description="received, held (breaker, Retry-After)")]


class PushStats(msgspec.Struct, frozen=True, kw_only=True):
    """The push members of a push subscription's stats (docs/protocol.md)."""

    endpoint_state: EndpointState
    last_status: int | None
    last_error: LastError
    endpoint_concurrency: Count
    endpoint_in_flight: RequestsOut
    endpoint_in_flight_records: Count
    endpoint_waiting: RecordsHeld
    endpoint_credit: Count
    endpoint_requests_total: Count
    endpoint_failures_total: Count
    breaker_opened_total: Count


class SubscriptionStatsView(SubscriptionStats, frozen=True, kw_only=True):
    """A subscription's stats as `GET /v1/subscriptions/{name}` shows them: §5's, and
    for a push subscription every push member too (PushStats; other subscriptions have
    none of them)."""

    # The members of PushStats, each optional (tests/server/test_openapi.py holds the
    # two lists alike; server/schemas.py publishes "all of them or none").

    endpoint_state: EndpointState | UnsetType = UNSET
    last_status: int | UnsetType | None = UNSET
    last_error: LastError | UnsetType = UNSET
    endpoint_concurrency: Count | UnsetType = UNSET
    endpoint_in_flight: RequestsOut | UnsetType = UNSET
    endpoint_in_flight_records: Count | UnsetType = UNSET
    endpoint_waiting: RecordsHeld | UnsetType = UNSET
    endpoint_credit: Count | UnsetType = UNSET
    endpoint_requests_total: Count | UnsetType = UNSET
    endpoint_failures_total: Count | UnsetType = UNSET
    breaker_opened_total: Count | UnsetType = UNSET
