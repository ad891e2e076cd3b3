"""Per-topic configuration (PROTOCOL §1 Retention, §2 PUT /v1/topics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from herald.protocol.topics import (
    DEFAULT_DEDUP_WINDOW_MS,
    DEFAULT_PARTITIONS,
    DEFAULT_RETENTION_MS,
)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    partitions: int = DEFAULT_PARTITIONS
    retention_ms: int | None = DEFAULT_RETENTION_MS  # None: unlimited
    retention_bytes: int | None = None  # per partition; None: unlimited
    dedup_window_ms: int = DEFAULT_DEDUP_WINDOW_MS
    # PROTOCOL §7: copies of each partition and how many must hold a record before an
    # acks=all answer. A single node keeps one; a cluster sets them at creation.
    replication_factor: int = 1
    min_insync_replicas: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopicConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
