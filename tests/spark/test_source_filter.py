"""The `herald` source over a subscription with a filter (PROTOCOL §8 Filter), against a
real Herald server and a real local Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from spark_bridge.source import HeraldStreamReader, read_range
from tests.spark.conftest import publish, subscription_of
from tests.spark.streams import herald_source, into_parquet, wait_for_rows

FILTER = 'headers.region = "eu" OR hasPrefix(key, "vip-")'


def _message(i: int) -> dict[str, Any]:
    return {
        "value": {"n": i},
        "key": f"vip-{i}" if i % 50 == 7 else f"k{i}",
        "headers": {"region": "eu" if i % 10 == 3 else "us"},
        "partition": i % 2,
    }


def _matching(i: int) -> bool:
    """FILTER, spelled out in plain Python."""
    return i % 10 == 3 or i % 50 == 7


def test_filtered_source_yields_exactly_the_matching_records_across_a_restart(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, topic, sub = shared_herald.url, unique("flt"), unique("sub")
    httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
    publish(url, topic, [_message(i) for i in range(400)])
    out, cp = tmp_path / "out", tmp_path / "cp"

    def start() -> Any:
        # With a filter maxRecordsPerTrigger bounds the offsets a batch spans: many small
        # batches, so the restart below lands between them.
        rows = herald_source(spark, url, topic, sub, filter=FILTER, maxRecordsPerTrigger=60)
        return into_parquet(rows.select("partition", "offset", "key", "headers", "value"), out, cp)

    query = start()
    try:
        wait_for_rows(spark, out, 20, 90, query)
    finally:
        query.stop()
    assert subscription_of(url, sub)["config"]["filter"] == FILTER  # created with it
    # Stopped mid-stream: more records arrive while the query is down.
    publish(url, topic, [_message(i) for i in range(400, 600)])
    wanted = sorted(i for i in range(600) if _matching(i))
    query = start()
    try:
        wait_for_rows(spark, out, len(wanted), 120, query)
    finally:
        query.stop()

    rows = spark.read.parquet(str(out)).collect()
    got = sorted(orjson.loads(r.value)["n"] for r in rows)
    assert got == wanted  # exactly the matching records, none twice, none missing
    for r in rows:
        n = orjson.loads(r.value)["n"]
        assert (r.partition, r.key, r.headers) == (
            n % 2,
            _message(n)["key"],
            _message(n)["headers"],
        )

    stats = subscription_of(url, sub)["stats"]
    # The records the filter dropped were acked by the server once, unsent, and stayed
    # acked across the query's restart: never sent to the bridge, never redelivered.
    assert stats["filtered_total"] == 600 - len(wanted)
    assert stats["delivered_total"] - stats["redelivered_total"] == len(wanted)
    assert stats["dead_lettered_total"] == 0


def test_filter_option_must_be_the_subscriptions_filter(shared_herald: Any, unique: Any) -> None:
    url, topic, sub = shared_herald.url, unique("flt"), unique("sub")
    httpx.put(f"{url}/v1/topics/{topic}").raise_for_status()
    httpx.put(
        f"{url}/v1/subscriptions/{sub}", json={"topic": topic, "filter": "headers:priority"}
    ).raise_for_status()
    options = {"url": url, "topic": topic, "subscription": sub}

    with pytest.raises(ValueError, match="has filter 'headers:priority'"):
        HeraldStreamReader({**options, "filter": 'key = "a"'})._ensure_subscription()

    # Without the option the bridge takes the subscription's own filter, and re-reads
    # through it.
    reader = HeraldStreamReader(options)
    reader._ensure_subscription()
    assert reader._filter == "headers:priority"
    assert reader._matches is not None
    publish(url, topic, [{"value": 1, "headers": {"priority": "high"}}, {"value": 2}])
    assert [r.offset for r in read_range(reader.opts, 0, 0, 2, reader._matches)] == [0]


def test_malformed_filter_option_names_the_position() -> None:
    with pytest.raises(ValueError, match="at position 5"):
        HeraldStreamReader({"topic": "t", "filter": "key ="})
