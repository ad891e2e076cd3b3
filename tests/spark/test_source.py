"""The `herald` source against a real Herald server and a real local Spark."""

from __future__ import annotations

import base64
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.conftest import free_port
from tests.spark.conftest import publish, subscription_of, wait_until
from tests.spark.streams import (
    assert_each_record_once,
    herald_source,
    into_parquet,
    wait_for_rows,
)


def _stats(url: str, sub: str) -> dict[str, Any]:
    stats: dict[str, Any] = subscription_of(url, sub)["stats"]
    return stats


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
        herald_source(spark, url, topic, sub)
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
        assert (
            abs(row.timestamp.replace(tzinfo=UTC).timestamp() - datetime.now(UTC).timestamp()) < 600
        )
        if "value_b64" in m:
            assert row.value is None and bytes(row.value_bytes) == bytes([i, 0, 255])
            assert row.key is None
        else:
            assert orjson.loads(row.value) == {"i": i, "s": "é"}
            assert bytes(row.value_bytes) == row.value.encode()
            assert row.key == f"k{i % 3}"


def _offsets(rows: list[Any]) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in rows)


def test_restart_from_checkpoint_into_parquet_is_exactly_once(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, topic, sub = shared_herald.url, unique("pq"), unique("sub")
    httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
    publish(url, topic, [{"value": {"n": i}, "key": f"k{i}"} for i in range(300)])
    out, cp = tmp_path / "out", tmp_path / "cp"

    def start() -> Any:
        rows = herald_source(spark, url, topic, sub, maxRecordsPerTrigger=70)
        return into_parquet(rows.select("partition", "offset", "value"), out, cp)

    query = start()
    try:
        wait_for_rows(spark, out, 70, 90, query)
    finally:
        query.stop()
    # Stopped mid-stream: more records arrive while the query is down.
    publish(url, topic, [{"value": {"n": i}, "key": f"k{i}"} for i in range(300, 400)])
    query = start()
    try:
        wait_for_rows(spark, out, 400, 120, query)
    finally:
        query.stop()
    assert_each_record_once(spark, out, 400)


def test_crash_in_foreach_batch_replays_the_same_batch(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, topic, sub = shared_herald.url, unique("crash"), unique("sub")
    publish(url, topic, [{"value": i} for i in range(120)])
    batches: dict[int, list[list[tuple[int, int]]]] = {}
    crashed: list[int] = []

    def handle(df: Any, batch_id: int) -> None:
        rows = _offsets(df.collect())
        batches.setdefault(batch_id, []).append(rows)
        if batch_id == 1 and not crashed:
            crashed.append(batch_id)
            raise RuntimeError("boom in foreachBatch")

    def run() -> Any:
        return (
            herald_source(spark, url, topic, sub, maxRecordsPerTrigger=40)
            .writeStream.foreachBatch(handle)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = run()
    wait_until(lambda: query.exception() is not None or not query.isActive, 90, "the crash")
    query.stop()
    assert crashed == [1]
    query = run()
    try:
        wait_until(lambda: sum(len(b[-1]) for b in batches.values()) >= 120, 90, "all rows", query)
    finally:
        query.stop()
    assert len(batches[1]) == 2
    assert batches[1][0] == batches[1][1] and batches[1][0]  # identical rows on replay
    final = sorted(o for b in batches.values() for o in b[-1])
    assert final == [(0, i) for i in range(120)]


def test_available_now_respects_max_records_per_trigger(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, topic, sub = shared_herald.url, unique("now"), unique("sub")
    httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 3}).raise_for_status()
    publish(url, topic, [{"value": i, "partition": i % 3} for i in range(250)])
    sizes: list[int] = []
    rows: list[tuple[int, int]] = []

    def handle(df: Any, batch_id: int) -> None:
        got = _offsets(df.collect())
        sizes.append(len(got))
        rows.extend(got)

    query = (
        herald_source(spark, url, topic, sub, maxRecordsPerTrigger=60)
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "availableNow did not finish in 120 s"
    finally:
        query.stop()
    assert query.exception() is None
    assert sizes and max(sizes) <= 60
    assert sorted(rows) == sorted((i % 3, i // 3) for i in range(250))


def test_node_urls_come_from_urls_or_a_comma_separated_url() -> None:
    from spark_bridge.nodes import node_urls

    assert node_urls({"url": "http://a:1/, http://b:2"}) == ("http://a:1", "http://b:2")
    assert node_urls({"urls": "http://a:1", "url": "http://b:2"}) == ("http://a:1",)
    assert node_urls({}) == ("http://127.0.0.1:8080",)


def test_node_killed_mid_stream_keeps_parquet_exactly_once(
    spark: Any, herald_server: Any, unique: Any, tmp_path: Path
) -> None:
    # PROTOCOL §7: the bridge given a cluster's nodes goes on when the one it talks to
    # dies. Here the list is a dead node and one node killed -9 mid-stream and started
    # again on its port and data: the receiver reconnects through the list, records in
    # flight come back (those committed are acked and dropped, acks lost in the kill's
    # last second included) and the parquet output holds every record once.
    node = herald_server.url
    urls = f"http://127.0.0.1:{free_port()},{node}"
    topic, sub = unique("kq"), unique("sub")
    httpx.put(f"{node}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
    publish(node, topic, [{"value": {"n": i}, "key": f"k{i}"} for i in range(200)])
    out, cp = tmp_path / "out", tmp_path / "cp"

    rows = herald_source(spark, urls, topic, sub, maxRecordsPerTrigger=50)
    query = into_parquet(rows.select("partition", "offset", "value"), out, cp)
    try:
        wait_for_rows(spark, out, 50, 90, query)
        herald_server.kill()
        herald_server.restart()
        publish(node, topic, [{"value": {"n": i}, "key": f"k{i}"} for i in range(200, 300)])
        wait_for_rows(spark, out, 300, 120, query)
        assert query.exception() is None
    finally:
        query.stop()
    assert_each_record_once(spark, out, 300)
