"""Per-topic configuration (PROTOCOL §1 Retention, §2 PUT /v1/topics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

TWO_WEEKS_MS = 14 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicConfig:
    partitions: int = 1
    retention_ms: int | None = TWO_WEEKS_MS  # None: unlimited
    retention_bytes: int | None = None  # per partition; None: unlimited
    dedup_window_ms: int = 120_000
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
