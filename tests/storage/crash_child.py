"""Child process of test_crash: appends to a partition forever, printing every
acknowledged record as ``<offset> <digest>`` on stdout, until the parent kills it.

    python crash_child.py <partition dir> <acks: 1|all> <round id>

Values are self-describing (``round:appender:seq:index:`` + a body derived from that
prefix) so the parent can check that every record in the log is a whole record the
child wrote, acknowledged or not.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
from pathlib import Path

from storage.partition import Partition
from storage.partition_log import LogConfig
from storage.record import Acks, NewRecord, ValueKind
from storage.writer import WriterPool

APPENDERS = 4
CONFIG = LogConfig(segment_bytes=32 * 1024, index_interval_bytes=1024)


def make_value(prefix: bytes, size: int) -> bytes:
    body = hashlib.sha256(prefix).digest()
    return prefix + (body * (size // len(body) + 1))[:size]


def is_whole_value(value: bytes) -> bool:
    """True when ``value`` is exactly what make_value produced for its prefix."""
    parts = value.split(b":", 4)
    if len(parts) != 5:
        return False
    prefix = b":".join(parts[:4]) + b":"
    return value == make_value(prefix, len(value) - len(prefix))


def digest(record_value: bytes, key: str | None) -> str:
    return hashlib.blake2b(record_value + b"|" + (key or "").encode(), digest_size=16).hexdigest()


async def appender(partition: Partition, acks: Acks, round_id: str, index: int) -> None:
    rng = random.Random(f"{round_id}-{index}")
    seq = 0
    while True:
        batch = [
            NewRecord(
                make_value(f"{round_id}:{index}:{seq}:{i}:".encode(), rng.randint(0, 1500)),
                ValueKind.BYTES,
                key=f"k{index}",
            )
            for i in range(rng.randint(1, 20))
        ]
        first, _ = await partition.append(batch, acks)
        lines = "".join(f"{first + i} {digest(r.value, r.key)}\n" for i, r in enumerate(batch))
        os.write(1, lines.encode())  # one write: the parent reads only whole lines
        seq += 1


async def main(directory: Path, acks: Acks, round_id: str) -> None:
    pool = WriterPool(1)
    partition = await Partition.open(directory, "crash", 0, writers=pool, config=CONFIG)
    await asyncio.gather(*(appender(partition, acks, round_id, i) for i in range(APPENDERS)))


if __name__ == "__main__":
    acks = Acks.ALL if sys.argv[2] == "all" else Acks.LEADER
    asyncio.run(main(Path(sys.argv[1]), acks, sys.argv[3]))
