"""Child process for the kill test: publish with producer ids, report, then wait to be killed.

Usage: python publish_child.py <data_dir> <count>
Prints one JSON line ``[[partition, offset], ...]`` once every record is written
(Acks.LEADER: in the log file, so it survives the death of this process), then blocks
on stdin until the parent SIGKILLs it. It never closes the storage: that is the point.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import PublishItem


async def main(data_dir: Path, count: int) -> None:
    storage = await Storage.open(data_dir)
    topic, _ = await storage.ensure_topic("t", TopicConfig(partitions=2))
    items = [
        PublishItem(NewRecord(b"%d" % i, key=f"k{i}", producer_id=f"id-{i}")) for i in range(count)
    ]
    results = await topic.publish(items, Acks.LEADER)
    sys.stdout.write(orjson.dumps([[r.partition, r.offset] for r in results]).decode() + "\n")
    sys.stdout.flush()
    await asyncio.to_thread(sys.stdin.read)  # until killed


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
