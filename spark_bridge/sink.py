"""The `herald` streaming sink: `df.writeStream.format("herald").option("topic", …)`.

Each task publishes its rows with producer ids `{queryId}:{batchId}:{partition}:{row}`;
a batch Spark replays after a failure produces the same ids, which Herald's dedup
window (PROTOCOL §2, `dedup_window_ms`) answers as duplicates: exactly-once into Herald
as long as the replay happens within the topic's dedup window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from herald.producer import Producer, SendResult

from .nodes import node_urls

BATCH_ID_KEY = "streaming.sql.batchId"
QUERY_ID_KEY = "sql.streaming.queryId"
SEND_CHUNK = 20_000


@dataclass
class HeraldCommitMessage(WriterCommitMessage):
    published: int
    duplicates: int


def _value(row: dict[str, Any]) -> Any:
    """`value` (JSON text) if set, else `value_bytes`; non-JSON text goes as a string."""
    text = row.get("value")
    if text is not None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    raw = row.get("value_bytes")
    if raw is None:
        raise ValueError("the herald sink needs a non-null 'value' or 'value_bytes' column")
    return bytes(raw)


class HeraldStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict[str, str]) -> None:
        topic = options.get("topic")
        if not topic:
            raise ValueError("the herald sink needs option 'topic'")
        self.topic = topic
        # One URL or a cluster's nodes; the producer goes on at the next when one dies.
        self.urls = node_urls(options)
        self.token = options.get("token") or None

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the herald sink runs inside Spark tasks only")
        batch_id = context.getLocalProperty(BATCH_ID_KEY)
        query_id = context.getLocalProperty(QUERY_ID_KEY)
        if batch_id is None or query_id is None:
            raise RuntimeError("the herald sink needs a streaming query (no batch id)")
        prefix = f"{query_id}:{batch_id}:{context.partitionId()}"
        rows = [row.asDict() for row in iterator]
        published, duplicates = asyncio.run(self._publish(prefix, rows))
        return HeraldCommitMessage(published, duplicates)

    async def _publish(self, prefix: str, rows: list[dict[str, Any]]) -> tuple[int, int]:
        if not rows:
            return 0, 0
        results: list[SendResult | None] = []
        async with Producer(self.urls, self.token, max_batch=5000, linger_ms=2) as producer:
            # send() queues without waiting and refuses past max_pending: a chunk at a
            # time keeps a big partition's records within it.
            for start in range(0, len(rows), SEND_CHUNK):
                sends = [
                    producer.send(
                        self.topic,
                        _value(row),
                        key=row.get("key"),
                        headers={str(k): str(v) for k, v in (row.get("headers") or {}).items()},
                        partition=row.get("partition"),
                        id=f"{prefix}:{index}",
                    )
                    for index, row in enumerate(rows[start : start + SEND_CHUNK], start)
                ]
                results.extend(await asyncio.gather(*sends))
        duplicates = sum(1 for r in results if r is not None and r.duplicate)
        return len(results) - duplicates, duplicates

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task's records are stored (acks=all) before it reports; nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already published stay; the replayed batch is deduplicated."""
