"""The `herald` source against a real Herald server and a real local Spark."""

from __future__ import annotations

import base64
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.spark.conftest import publish, wait_until


def _stats(url: str, sub: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/subscriptions/{sub}")
    r.raise_for_status()
    stats: dict[str, Any] = r.json()["stats"]
    return stats


def _reader(spark: Any, url: str, topic: str, sub: str, **options: Any) -> Any:
    reader = (
        spark.readStream.format("herald")
        .option("url", url)
        .option("topic", topic)
        .option("subscription", sub)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def test_records_arrive_in_order_with_columns_and_acks_follow_commits(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, topic, sub = shared_herald.url, unique("src"), unique("sub")
    httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
    messages: list[dict[str, Any]] = []
    for i in range(40):
        m: dict[str, Any] = {"partition": i % 2, "headers": {"n": str(i)}}
        if i % 5 == 0:
            m["value_b64"] = base64.b64encode(bytes([i, 0, 255])).decode()
        else:
            m["value"] = {"i": i, "s": "é"}
            m["key"] = f"k{i % 3}"
        messages.append(m)
    publish(url, topic, messages)

    seen: list[Any] = []
    floors_at_batch: list[tuple[dict[int, int], dict[int, int]]] = []
    lock = threading.Lock()

    def collect(df: Any, batch_id: int) -> None:
        rows = df.collect()
        stats = _stats(url, sub)
        floors = {p["partition"]: p["ack_floor"] for p in stats["partitions"]}
        first: dict[int, int] = {}
        for r in rows:
            first[r.partition] = min(first.get(r.partition, r.offset), r.offset)
        with lock:
            seen.extend(rows)
            floors_at_batch.append((first, floors))

    query = (
        _reader(spark, url, topic, sub)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(seen) >= 40, 60, "40 rows", query)
        # Nothing is acked before Spark commits it: the batch holding the last records
        # is committed only once a later batch is planned.
        assert _stats(url, sub)["acked_total"] < 40
        publish(url, topic, [{"value": "late", "partition": 0}])
        wait_until(lambda: len(seen) >= 41, 60, "the 41st row", query)
        wait_until(lambda: _stats(url, sub)["acked_total"] >= 40, 30, "acks of committed rows")
    finally:
        query.stop()

    # Every batch saw none of its own records acked while it ran.
    for first, floors in floors_at_batch:
        for p, offset in first.items():
            assert floors.get(p, 0) <= offset
    assert len(seen) == 41
    for p in (0, 1):
        offsets = [r.offset for r in seen if r.partition == p]
        assert offsets == list(range(len(offsets)))  # in order, no gaps, no duplicates
    by_n = {int(r.headers["n"]): r for r in seen if "n" in r.headers}
    for i, m in enumerate(messages):
        row = by_n[i]
        assert row.topic == topic and row.partition == i % 2
        assert row.id == f"{row.partition}-{row.offset}"
        assert isinstance(row.timestamp, datetime)
        assert abs(row.timestamp.replace(tzinfo=UTC).timestamp() - datetime.now(UTC).timestamp()) < 600
        if "value_b64" in m:
            assert row.value is None and bytes(row.value_bytes) == bytes([i, 0, 255])
            assert row.key is None
        else:
            assert orjson.loads(row.value) == {"i": i, "s": "é"}
            assert bytes(row.value_bytes) == row.value.encode()
            assert row.key == f"k{i % 3}"
