"""The replica checker of issue 14: reads every replica's log of one partition and proves
the invariants a cluster must keep, whatever faults it went through.

- each replica's offsets are contiguous from its start to its end (records and batches);
- each replica's batch epochs never go down, and its record timestamps never go down;
- no two replicas hold different records at one offset below the high watermark;
- every acknowledged record is at its offset, with its value, on every replica given as
  ``must_hold`` (by default: all) — and is below the high watermark;
- no producer id appears twice below the high watermark (dedup held across failovers).

``check_replicas`` takes open PartitionLogs or partition directories (opened, read and
closed here: only once the processes that wrote them are stopped) and raises
AssertionError listing every violation; it returns what it looked at otherwise.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from storage.partition_log import PartitionLog
from storage.record import Record

RecordKey = tuple[int, bytes, str | None, tuple[tuple[str, str], ...], str | None, str]


@dataclass(frozen=True, slots=True)
class ReplicaSummary:
    start: int
    end: int
    epochs: tuple[int, ...]  # the distinct batch epochs, in log order


@dataclass(frozen=True, slots=True)
class CheckReport:
    replicas: Mapping[str, ReplicaSummary]
    compared_offsets: int  # offsets below the high watermark compared across replicas
    acknowledged: int


def _key(record: Record) -> RecordKey:
    return (
        record.timestamp,
        record.value,
        record.key,
        tuple(sorted(record.headers.items())),
        record.producer_id,
        str(record.kind),
    )


def _records(log: PartitionLog) -> list[Record]:
    out: list[Record] = []
    offset = log.start_offset
    while offset < log.end_offset:
        got = log.read(offset, 10_000, 64 << 20)
        if not got:
            break
        out += got
        offset = got[-1].offset + 1
    return out


def _batch_headers(log: PartitionLog) -> Iterator[tuple[int, int, int]]:
    for segment in log.segments:
        for header in segment.batch_headers():
            yield header.base_offset, header.next_offset, header.leader_epoch


def _check_one(name: str, log: PartitionLog, problems: list[str]) -> list[Record]:
    records = _records(log)
    offsets = [r.offset for r in records]
    if offsets != list(range(log.start_offset, log.end_offset)):
        gaps = sorted(set(range(log.start_offset, log.end_offset)) - set(offsets))[:10]
        problems.append(
            f"{name}: offsets not contiguous in [{log.start_offset}, "
            f"{log.end_offset}): missing {gaps}, {len(offsets)} records"
        )
    expected, last_epoch = None, -1
    for base, next_offset, epoch in _batch_headers(log):
        if expected is not None and base != expected:
            problems.append(f"{name}: batch at {base} after a batch ending at {expected}")
        if epoch < last_epoch:
            problems.append(f"{name}: batch at {base} has epoch {epoch} after {last_epoch}")
        expected, last_epoch = next_offset, max(last_epoch, epoch)
    for a, b in itertools.pairwise(records):
        if b.timestamp < a.timestamp:
            problems.append(f"{name}: timestamp goes down at offset {b.offset}")
            break
    return records


def check_replicas(
    replicas: Mapping[str, PartitionLog | Path],
    *,
    high_watermark: int,
    acknowledged: Iterable[tuple[int, bytes]] = (),
    must_hold: Iterable[str] | None = None,
    partition: int = 0,
    unique_producer_ids: bool = True,
) -> CheckReport:
    problems: list[str] = []
    with ExitStack() as stack:
        logs: dict[str, PartitionLog] = {}
        for name, replica in replicas.items():
            if isinstance(replica, Path):
                try:
                    log = PartitionLog(replica, partition)
                except Exception as exc:
                    exc.add_note(f"opening {name}'s copy")
                    raise
                stack.callback(log.close)
            else:
                log = replica
            logs[name] = log
        records = {name: _check_one(name, log, problems) for name, log in logs.items()}
        summaries = {
            name: ReplicaSummary(
                log.start_offset,
                log.end_offset,
                tuple(e for e, _ in itertools.groupby(h[2] for h in _batch_headers(log))),
            )
            for name, log in logs.items()
        }
    by_offset: dict[str, dict[int, Record]] = {
        name: {r.offset: r for r in rs} for name, rs in records.items()
    }

    compared = 0
    low = min((s.start for s in summaries.values()), default=0)
    for offset in range(low, high_watermark):
        seen = {name: _key(held[offset]) for name, held in by_offset.items() if offset in held}
        if len(set(seen.values())) > 1:
            problems.append(f"offset {offset}: different records on {sorted(seen)}")
        compared += bool(seen)

    holders = list(replicas) if must_hold is None else list(must_hold)
    acked = list(acknowledged)
    for offset, value in acked:
        if offset >= high_watermark:
            problems.append(f"acknowledged offset {offset} is not below the HW {high_watermark}")
        for name in holders:
            record = by_offset[name].get(offset)
            if record is None or record.value != value:
                problems.append(f"{name}: acknowledged record at {offset} is missing or changed")

    if unique_producer_ids:
        for name, rs in records.items():
            ids = Counter(r.producer_id for r in rs if r.offset < high_watermark and r.producer_id)
            duplicates = sorted(i for i, seen in ids.items() if seen > 1)
            if duplicates:
                problems.append(f"{name}: producer ids twice below the HW: {duplicates[:10]}")

    if problems:
        raise AssertionError("replica check failed:\n  " + "\n  ".join(problems))
    return CheckReport(summaries, compared, len(acked))
