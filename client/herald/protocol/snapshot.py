"""The console's view of a whole server (docs/protocol.md "Stats"), declared once: the
`GET /v1/stats` snapshot, the `{"type":"stats", …}` frame `/v1/stats/ws` pushes every
second, and the samples of `GET /v1/stats?history=1` and `GET /v1/stats/history`.
The server builds its answers as these models and encodes them (server/routes_stats.py,
server/stats_history.py), /openapi.json publishes their schemas (server/schemas.py),
and a client can decode them with ``msgspec``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol.names import Name
from herald.protocol.records import Count, Timestamp
from herald.protocol.stats import PushStats, SubscriptionStats
from herald.protocol.subscriptions import SubscriptionConfigView
from herald.protocol.topics import Topic

# delivery/events.py PauseReason, and circuit_open while a push endpoint's breaker is open
PauseReason = Literal["none", "no_credit", "max_in_flight", "backoff", "delayed", "circuit_open"]


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    now_ms: Timestamp
    started_ms: Timestamp
    uptime_ms: Count


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """Sums over the topics and subscriptions listed (counters since the server started);
    the members from `delivered_total` on are sums of the subscriptions' stats."""

    topics: Count
    subscriptions: Count
    published_records_total: Count
    published_bytes_total: Count
    storage_bytes: Count
    delivered_total: Count
    acked_total: Count
    redelivered_total: Count
    dead_lettered_total: Count
    backlog: Count
    in_flight: Count
    consumers: Count


class ConsumerView(msgspec.Struct, frozen=True, kw_only=True):
    """A consumer attached right now; a pull consumer or a webhook's sender holds no
    connection: its address and connected_ms are null."""

    id: Annotated[str, Meta(description="the id its ready frame named")]
    address: str | None
    credit: Count
    in_flight: Count
    connected_ms: Timestamp | None


class SubscriptionSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    name: Name
    topic: Name
    config: SubscriptionConfigView
    stats: SubscriptionStats
    push: PushStats | None
    pause_reason: PauseReason
    oldest_unacked_age_ms: Annotated[
        Count | None, Meta(description="now minus the oldest unacked timestamp; null: no backlog")
    ]
    consumers: list[ConsumerView]


class StatsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One snapshot of the whole server, what the console reads."""

    server: ServerInfo
    totals: Totals
    topics: list[Topic]
    subscriptions: list[SubscriptionSnapshot]


class ServerSample(msgspec.Struct, frozen=True):
    now_ms: Timestamp
    published_records_total: Count
    delivered_total: Count


class ServerHistory(msgspec.Struct, frozen=True):
    """This node's samples, one a second, oldest first."""

    interval_ms: Count
    samples: list[ServerSample]


class StatsResponse(StatsSnapshot, frozen=True, kw_only=True):
    """`GET /v1/stats`; with `?history=1`, the server's recent past too."""

    history: ServerHistory | UnsetType = UNSET


class StatsFrame(StatsSnapshot, frozen=True, kw_only=True, tag_field="type", tag="stats"):
    """What `/v1/stats/ws` pushes at once and then every second."""


class TopicSample(msgspec.Struct, frozen=True):
    now_ms: Timestamp
    published_records_total: Count


class SubscriptionSample(msgspec.Struct, frozen=True):
    now_ms: Timestamp
    delivered_total: Count
    acked_total: Count
    backlog: Count


class TopicHistory(msgspec.Struct, frozen=True):
    """`GET /v1/stats/history?topic=`: empty samples for a topic with none kept."""

    interval_ms: Count
    topic: Name
    samples: list[TopicSample]


class SubscriptionHistory(msgspec.Struct, frozen=True):
    """`GET /v1/stats/history?subscription=`: empty samples for one with none kept here."""

    interval_ms: Count
    subscription: Name
    samples: list[SubscriptionSample]
