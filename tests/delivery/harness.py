"""A pure, in-memory driver for SubscriptionCore: a list-backed log, a fake clock and a
record of what each consumer received. It plays the async engine's role without I/O."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from delivery.config import SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import DeadLetter, Delivery, ReadRequest, RefetchRequest
from storage.cursors import CursorSnapshot, PartitionCursor
from storage.record import Record


def fresh_cursor(partitions: int, floor: int = 0) -> CursorSnapshot:
    return CursorSnapshot({p: PartitionCursor(floor) for p in range(partitions)}, {})


@dataclass
class Harness:
    config: SubscriptionConfig = field(default_factory=lambda: SubscriptionConfig(topic="t"))
    partitions: int = 1
    cursor: CursorSnapshot | None = None
    jitter: float = 1.0  # rand() value: 1.0 gives the un-jittered delay d
    auto_dead_letter: bool = True
    delays: bool = False  # compare deliver_at with the fake clock (as the engine does)
    max_delayed: int = 10_000

    def __post_init__(self) -> None:
        self.now = 1000.0
        self.log: dict[int, list[Record]] = {p: [] for p in range(self.partitions)}
        self.log_start: dict[int, int] = dict.fromkeys(range(self.partitions), 0)
        self.core = SubscriptionCore(
            self.config,
            self.cursor or fresh_cursor(self.partitions),
            rand=lambda: self.jitter,
            wall_ms=(lambda: int(self.now * 1000)) if self.delays else None,
            max_delayed=self.max_delayed,
        )
        self.received: dict[str, list[Delivery]] = defaultdict(list)
        self.sends: list[tuple[str, list[Delivery]]] = []
        self.dead: list[DeadLetter] = []
        self.reads: list[ReadRequest | RefetchRequest] = []

    # -- the log --------------------------------------------------------------------

    def publish(
        self, partition: int = 0, n: int = 1, key: str | None = None, delay_ms: int = 0
    ) -> list[Record]:
        records = []
        for _ in range(n):
            offset = self.log_start[partition] + len(self.log[partition])
            timestamp = int(self.now * 1000)
            deliver_at = timestamp + delay_ms if delay_ms else None
            record = Record(partition, offset, timestamp, b"1", key=key, deliver_at=deliver_at)
            self.log[partition].append(record)
            records.append(record)
        self.core.set_end(partition, self.log_start[partition] + len(self.log[partition]))
        return records

    def truncate_head(self, partition: int, start: int) -> None:
        """Retention: drop records below ``start``."""
        drop = start - self.log_start[partition]
        self.log[partition] = self.log[partition][drop:]
        self.log_start[partition] = start

    def _read(self, partition: int, offset: int, n: int) -> list[Record]:
        base = self.log_start[partition]
        index = max(offset - base, 0)
        return self.log[partition][index : index + n]

    # -- driving --------------------------------------------------------------------

    def attach(self, consumer: str = "c1", credit: int = 0) -> str:
        self.core.attach(consumer, credit)
        self.step()
        return consumer

    def credit(self, consumer: str, n: int) -> None:
        self.core.grant_credit(consumer, n)
        self.step()

    def ack(self, *ids: str) -> tuple[list[str], list[str]]:
        result = self.core.ack(ids)
        self.step()
        return result

    def ack_all(self, consumer: str) -> None:
        self.ack(*[d.record.id for d in self.received[consumer]])

    def nack(self, *ids: str, delay_ms: int | None = None, reason: str | None = None) -> None:
        self.core.nack(ids, delay_ms, self.now, reason)
        self.step()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.core.tick(self.now)
        self.step()

    def step(self) -> None:
        core = self.core
        for _ in range(10_000):
            progressed = False
            for request in core.take_reads():
                self.reads.append(request)
                progressed = True
                if isinstance(request, ReadRequest):
                    core.feed(
                        request, self._read(request.partition, request.offset, request.max_records)
                    )
                else:
                    found = [
                        r
                        for o in request.offsets
                        for r in self._read(request.partition, o, 1)
                        if r.offset == o
                    ]
                    core.feed_refetch(request, found)
            for consumer, deliveries in core.pump(self.now):
                assert deliveries
                progressed = True
                self.sends.append((consumer, deliveries))
                self.received[consumer].extend(deliveries)
            for dead in core.take_dead_letters():
                progressed = True
                self.dead.append(dead)
                if self.auto_dead_letter:
                    core.dead_letter_done(dead)
            if not progressed:
                return
        raise AssertionError("the core never settles")

    def ids(self, consumer: str) -> list[str]:
        return [d.record.id for d in self.received[consumer]]

    def attempts(self, consumer: str) -> list[tuple[str, int]]:
        return [(d.record.id, d.attempt) for d in self.received[consumer]]
