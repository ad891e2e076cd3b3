"""Where reading starts: one frozen type for every place that names a position in a topic.

- PROTOCOL §2 subscription `start`: "earliest" | "latest" | {"timestamp": T};
- PROTOCOL §2 seek: {"to": "earliest"|"latest"} | {"timestamp": T} | {"offsets": {p: o}};
- PROTOCOL §3 tail `?from=`: latest | earliest | <offset> (every partition) | ts:<ms>.

The server's validation builds a StartAt from the wire form; the engine and the tail
resolve it per partition with ``offset_in``. Partition numbers are checked here, once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from herald.protocol.errors import PartitionNotFound


class Position(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"  # the first record with timestamp >= T, per partition
    OFFSET = "offset"  # one offset for every partition (tail `?from=N`)
    OFFSETS = "offsets"  # an offset per named partition (seek); others are untouched


class PartitionBounds(Protocol):
    """What resolving a start needs of a partition (storage.partition.Partition)."""

    @property
    def partition(self) -> int: ...

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    async def offset_for_timestamp(self, timestamp_ms: int) -> int: ...


@dataclass(frozen=True, slots=True)
class StartAt:
    position: Position = Position.LATEST
    value: int = 0  # TIMESTAMP: ms since the epoch; OFFSET: the offset
    offsets: tuple[tuple[int, int], ...] = ()  # OFFSETS: (partition, offset), ascending

    @classmethod
    def earliest(cls) -> StartAt:
        return cls(Position.EARLIEST)

    @classmethod
    def latest(cls) -> StartAt:
        return cls(Position.LATEST)

    @classmethod
    def at_timestamp(cls, timestamp_ms: int) -> StartAt:
        return cls(Position.TIMESTAMP, timestamp_ms)

    @classmethod
    def at_offset(cls, offset: int) -> StartAt:
        return cls(Position.OFFSET, offset)

    @classmethod
    def at_offsets(cls, offsets: Mapping[int, int]) -> StartAt:
        return cls(Position.OFFSETS, offsets=tuple(sorted(offsets.items())))

    @property
    def timestamp(self) -> int | None:
        return self.value if self.position is Position.TIMESTAMP else None

    def check_partitions(self, topic: str, partitions: int) -> None:
        """PROTOCOL §2 seek: a partition the topic does not have is 404
        `partition_not_found`, and nothing changes."""
        for partition, _ in self.offsets:
            if not 0 <= partition < partitions:
                raise PartitionNotFound(f"topic {topic!r} has no partition {partition}")

    async def offset_in(self, partition: PartitionBounds) -> int | None:
        """Where reading ``partition`` starts; None for a partition an OFFSETS start does
        not name. An offset past the end means the end, below the log start the start."""
        match self.position:
            case Position.EARLIEST:
                return partition.start_offset
            case Position.LATEST:
                return partition.end_offset
            case Position.TIMESTAMP:
                return await partition.offset_for_timestamp(self.value)
            case Position.OFFSET:
                return _clamp(self.value, partition)
            case Position.OFFSETS:
                for number, offset in self.offsets:
                    if number == partition.partition:
                        return _clamp(offset, partition)
                return None

    async def offsets_in(self, partitions: Sequence[PartitionBounds]) -> dict[int, int]:
        """``offset_in`` of every partition it names."""
        resolved: dict[int, int] = {}
        for partition in partitions:
            offset = await self.offset_in(partition)
            if offset is not None:
                resolved[partition.partition] = offset
        return resolved

    def to_json(self) -> Any:
        """The subscription `start` as GET shows it and meta.db keeps it (PROTOCOL §2)."""
        if self.position is Position.TIMESTAMP:
            return {"timestamp": self.value}
        if self.position in (Position.EARLIEST, Position.LATEST):
            return self.position.value
        raise ValueError(f"a subscription cannot start at {self.position.value}")

    @classmethod
    def from_json(cls, value: Any) -> StartAt:
        """The inverse of ``to_json`` (for meta.db; the server validates what clients send)."""
        if isinstance(value, dict):
            return cls.at_timestamp(int(value["timestamp"]))
        return cls(Position(value))


def _clamp(offset: int, partition: PartitionBounds) -> int:
    return min(max(offset, partition.start_offset), partition.end_offset)
