"""A topic on the wire, declared once: its config as a client sends it to create a topic
(`TopicConfig`, `PUT /v1/topics/{topic}`), which the server validates with, and as a
server shows it (`TopicConfigView`, every field filled); a topic and the list of topics
as a server shows them (`Topic`, `TopicList`). /openapi.json publishes their
schemas (server/schemas.py); on a single node the replication ranges are narrowed to 1
there (PROTOCOL §7), the model keeps a cluster's."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.names import Name
from herald.protocol.records import Count

# The defaults the server fills in (storage/config.py TopicConfig).
DEFAULT_PARTITIONS = 1
DEFAULT_RETENTION_MS = 14 * 24 * 3600 * 1000  # two weeks
DEFAULT_DEDUP_WINDOW_MS = 120_000


def _within(allowed: limits.IntRange, description: str | None = None) -> Meta:
    return Meta(ge=allowed.low, le=allowed.high, description=description)


Partitions = Annotated[int, _within(limits.PARTITIONS)]
DedupWindowMs = Annotated[int, _within(limits.DEDUP_WINDOW_MS)]
ReplicationFactor = Annotated[int, _within(limits.REPLICATION_FACTOR)]
MinInsyncReplicas = Annotated[int, _within(limits.MIN_INSYNC_REPLICAS)]
_UNLIMITED = "null: unlimited"


# omit_defaults: as the SDK encodes it, a field not given is left out (not null).
class TopicConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """No body (or an empty one) is all defaults; JSON null is not an object. PROTOCOL §2:
    a field given as null takes its default, except retention_ms and retention_bytes,
    where null means unlimited."""

    partitions: (
        Annotated[int, _within(limits.PARTITIONS, description=f"default {DEFAULT_PARTITIONS}")]
        | None
    ) = None
    retention_ms: (
        Annotated[
            int,
            _within(
                limits.RETENTION_MS, description=f"default {DEFAULT_RETENTION_MS}; {_UNLIMITED}"
            ),
        ]
        | UnsetType
        | None
    ) = UNSET
    retention_bytes: (
        Annotated[int, _within(limits.RETENTION_BYTES, description=f"default {_UNLIMITED}")]
        | UnsetType
        | None
    ) = UNSET
    dedup_window_ms: (
        Annotated[
            int,
            _within(limits.DEDUP_WINDOW_MS, description=f"default {DEFAULT_DEDUP_WINDOW_MS}"),
        ]
        | None
    ) = None
    replication_factor: (
        Annotated[
            int,
            _within(
                limits.REPLICATION_FACTOR,
                description="default min(3, live nodes) in a cluster; 1 on a single node",
            ),
        ]
        | None
    ) = None
    min_insync_replicas: (
        Annotated[
            int,
            _within(
                limits.MIN_INSYNC_REPLICAS,
                description="default min(2, replication_factor); at most replication_factor",
            ),
        ]
        | None
    ) = None


class TopicConfigView(msgspec.Struct, frozen=True, kw_only=True):
    """Every field of a topic's config, defaults filled (retention: null is unlimited)."""

    partitions: Partitions
    retention_ms: int | None
    retention_bytes: int | None
    dedup_window_ms: DedupWindowMs
    replication_factor: ReplicationFactor
    min_insync_replicas: MinInsyncReplicas


# ---------------------------------------------------------------- responses


class PartitionView(msgspec.Struct, frozen=True, kw_only=True):
    """One partition of a topic; PROTOCOL §7 adds its leader, epoch, replicas and ISR
    (`GET /v1/topics/{topic}`; a single node names itself), and in a cluster the leader's
    URL (an extension: docs/protocol.md, "Publishing to the leader")."""

    partition: Count
    start_offset: Count
    end_offset: Count
    bytes: Count
    leader: str | UnsetType | None = UNSET
    epoch: Count | UnsetType = UNSET
    replicas: list[str] | UnsetType = UNSET
    isr: list[str] | UnsetType = UNSET
    leader_url: (
        Annotated[
            str | None,
            Meta(
                description="In a cluster: the URL the live leader advertises (null while "
                "the partition has none); a client may publish the partition's records "
                "there and save the hop (an extension)."
            ),
        ]
        | UnsetType
    ) = UNSET


class Topic(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/topics/{topic}` and a PUT's answer."""

    name: Name
    config: TopicConfigView
    partitions: list[PartitionView]
    messages_total: Count
    bytes_total: Count
    auto_created: (
        Annotated[
            bool,
            Meta(description="Created by a publish or a subscription, not a PUT (an extension)."),
        ]
        | UnsetType
    ) = UNSET


class TopicSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: Name
    config: TopicConfigView
    auto_created: bool | UnsetType = UNSET


class TopicList(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/topics`."""

    topics: list[TopicSummary]
