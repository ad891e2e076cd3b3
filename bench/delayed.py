"""Delayed delivery benchmark: the delivery core's memory with many delayed records.

    python -m bench.delayed [--records 200000]

Drives one subscription's sans-I/O core (delivery/core.py) over an in-memory log of
``--records`` records, each delayed by an hour and followed by a record without a delay,
with a consumer that acks every record it gets. Prints what the core holds once it has
read the whole log: delayed refs kept (the bounded look-ahead, MAX_DELAYED), how far the
plain records got, the ack floor's done-offset runs, the cursor snapshot's size, and the
Python heap the core grew by (tracemalloc), then the same after an hour of fake time.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from delivery.config import SubscriptionConfig
from delivery.core import SubscriptionCore
from delivery.events import ReadRequest, RefetchRequest
from delivery.subscription_state import MAX_DELAYED
from storage.cursors import CursorSnapshot, PartitionCursor
from storage.record import Record

HOUR_MS = 3_600_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="delayed records")
    args = parser.parse_args()
    clock = {"now": 1000.0}
    t0 = 1_795_000_000_000
    log = []
    for i in range(args.records):
        log.append(Record(0, 2 * i, t0, b"1", key=f"k{i}", deliver_at=t0 + HOUR_MS))
        log.append(Record(0, 2 * i + 1, t0, b"2", key=f"k{i}"))

    def wall_ms() -> int:
        return t0 + int((clock["now"] - 1000.0) * 1000)

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    config = SubscriptionConfig(topic="t", max_in_flight=1000)
    core = SubscriptionCore(config, CursorSnapshot({0: PartitionCursor(0)}, {}), wall_ms=wall_ms)
    core.set_end(0, len(log))
    core.attach("c", 1_000_000)
    started = time.perf_counter()
    delivered = drive(core, log, clock["now"])
    elapsed = time.perf_counter() - started
    report("after reading the log", core, before, delivered, elapsed)
    clock["now"] += HOUR_MS / 1000
    core.tick(clock["now"])
    started = time.perf_counter()
    delivered = drive(core, log, clock["now"])
    report("an hour later", core, before, delivered, time.perf_counter() - started)


def drive(core: SubscriptionCore, log: list[Record], now: float) -> int:
    """Read, send and ack until the core settles; returns the records delivered."""
    delivered = 0
    while True:
        progressed = False
        for request in core.take_reads():
            progressed = True
            if isinstance(request, ReadRequest):
                core.feed(request, log[request.offset : request.offset + request.max_records])
            elif isinstance(request, RefetchRequest):
                core.feed_refetch(request, [log[o] for o in request.offsets])
        for consumer, deliveries in core.pump(now):
            progressed = True
            delivered += len(deliveries)
            core.ack([d.record.id for d in deliveries])
            core.grant_credit(consumer, len(deliveries))
        core.tick(now)
        if not progressed:
            return delivered


def report(
    when: str, core: SubscriptionCore, before: tracemalloc.Snapshot, delivered: int, s: float
) -> None:
    grown = sum(
        stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename")
    )
    snapshot = core.snapshot()
    stats = core.stats()
    print(
        f"{when}: delivered {delivered:,} in {s:.1f} s; delayed refs {stats.delayed:,} "
        f"(MAX_DELAYED {MAX_DELAYED:,}); ack floor {stats.partitions[0].ack_floor:,}; "
        f"backlog {stats.backlog:,}; done runs {len(snapshot.partitions[0].acked):,}; "
        f"core heap +{grown / 2**20:.1f} MiB (the log itself excluded)"
    )


if __name__ == "__main__":
    main()
