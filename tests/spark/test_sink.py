"""The `herald` sink: a round trip through Spark, and a replayed batch deduplicated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.spark.conftest import publish, read_all, wait_until
from tests.spark.streams import herald_source


def test_sink_round_trips_and_a_replayed_batch_adds_no_duplicates(
    spark: Any, shared_herald: Any, unique: Any, tmp_path: Path
) -> None:
    url, src, dst, sub = shared_herald.url, unique("in"), unique("out"), unique("sub")
    sent = [
        {"value": {"n": i}, "key": f"k{i % 4}", "headers": {"h": str(i)}} for i in range(60)
    ] + [{"value_b64": "AAEC", "headers": {"h": "bytes"}}]
    publish(url, src, sent)
    cp = tmp_path / "cp"

    def run() -> Any:
        return (
            herald_source(spark, url, src, sub)
            .select("key", "headers", "value", "value_bytes")
            .writeStream.format("herald")
            .option("url", url)
            .option("topic", dst)
            .option("checkpointLocation", str(cp))
            .trigger(availableNow=True)
            .start()
        )

    query = run()
    assert query.awaitTermination(120), "the first run did not finish"
    assert query.exception() is None
    wait_until(lambda: len(read_all(url, dst)) >= 61, 30, "61 records in the output topic")
    # Replay: forget that the last batch was committed; Spark runs it again with the
    # same batch id, so the same producer ids, and Herald drops them as duplicates.
    commits = sorted((cp / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert commits
    last = commits[-1]
    last.unlink()
    (cp / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    query = run()
    assert query.awaitTermination(120), "the replay did not finish"
    assert query.exception() is None
    assert (cp / "commits" / last.name).exists()  # the batch did run again

    got = read_all(url, dst)
    assert len(got) == 61
    by_h = {m["headers"]["h"]: m for m in got}
    for m in sent:
        out = by_h[m["headers"]["h"]]
        assert out.get("key") == m.get("key")
        if "value" in m:
            assert out["value"] == m["value"]
        else:
            assert out["value_b64"] == m["value_b64"]
    stats = httpx.get(f"{url}/v1/topics/{dst}").json()
    assert sum(p["end_offset"] for p in stats["partitions"]) == 61
