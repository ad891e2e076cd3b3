"""What each incarnation of a node found on its disk: the election of last resort.

PROTOCOL §7 (restarts are new incarnations): a node that registered anew leads nothing
until an election, and only a *current* ISR member — one that has not restarted since
it joined the ISR — is elected in the ordinary way (cluster/elections.py). When every ISR
member of a partition has restarted (a whole cluster's restart, a power cut), none is
current, yet at least one of them kept its disk (fewer than ``min_insync_replicas``
lose their data directories at a time) and holds every committed record. Which one?

Raft's answer: the most up-to-date log — the highest (last leader epoch, log end). A
replica whose last epoch is higher truncated to a later leader that had every committed
record before appending; one of the same last epoch and a longer log copied the same
leader further. An empty or rolled-back disk loses to an intact one. So each node, as it
registers, publishes ``/herald/<cluster>/logends/<node>`` = ``{"incarnation": N,
"ends": [[topic, partition, last_epoch, log_end], ...]}`` under its lease: what its disk
held when this incarnation began. A partition whose ISR members are all live and all
published is taken by the most up-to-date of them (ties: replica order); while any ISR
member is away, nobody takes it (Kafka's eligible leader replicas, KIP-966, wait the
same way rather than elect a replica that may lack committed records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

Ref = tuple[str, int]  # (topic, partition)
NOTHING = (-1, 0)  # no log of the partition at all: (last epoch, log end)


def log_ends_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/logends/"


@dataclass(frozen=True, slots=True)
class LogEnds:
    """One incarnation's partitions as its disk held them when it registered."""

    node: str
    incarnation: int
    ends: Mapping[Ref, tuple[int, int]]

    def of(self, ref: Ref) -> tuple[int, int]:
        return self.ends.get(ref, NOTHING)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "incarnation": self.incarnation,
                "ends": [[t, p, epoch, end] for (t, p), (epoch, end) in sorted(self.ends.items())],
            }
        )

    @classmethod
    def from_json(cls, node: str, data: bytes) -> LogEnds | None:
        try:
            raw: Any = orjson.loads(data)
            incarnation = raw["incarnation"]
            ends: dict[Ref, tuple[int, int]] = {}
            for topic, partition, epoch, end in raw["ends"]:
                if not (
                    isinstance(topic, str)
                    and all(isinstance(v, int) for v in (partition, epoch, end, incarnation))
                ):
                    return None
                ends[(topic, partition)] = (epoch, end)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        return cls(node, incarnation, ends)


def snapshot(node: str, incarnation: int, partitions: Iterable[tuple[Ref, int, int]]) -> LogEnds:
    """``partitions``: (ref, last epoch, log end) of every partition on this disk."""
    return LogEnds(node, incarnation, {ref: (epoch, end) for ref, epoch, end in partitions})


def most_up_to_date(ref: Ref, isr: Sequence[str], reported: Mapping[str, LogEnds]) -> str | None:
    """The ISR member to elect when none is current, or None while one has not reported
    (it is away, or registered and not yet published: wait for it)."""
    if not isr or any(member not in reported for member in isr):
        return None
    return max(isr, key=lambda m: (*reported[m].of(ref), -isr.index(m)))
