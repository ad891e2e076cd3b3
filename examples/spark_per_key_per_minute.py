"""Count records per key per minute from a Herald topic, into a topic and parquet.

    python examples/spark_per_key_per_minute.py --url http://127.0.0.1:8080 \\
        --topic clicks --out-topic clicks-per-minute --out-dir /tmp/clicks [--demo]

Reads `--topic` through the `herald` source, counts records per key and per
one-minute window of event time (the value's `ts` in ms when present, else the broker
timestamp), with a 30 s watermark, and writes the finished windows

  * to `--out-topic` through the `herald` sink (value: {"key","window_start","count"}),
  * to parquet under `--out-dir`/parquet,

two queries with their own subscriptions and checkpoints under `--out-dir`, so both
are exactly-once across restarts. `--demo` first publishes sample clicks spread over
five minutes. By default the queries drain what is there and stop
(`trigger(availableNow=True)`); `--follow` keeps them running.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx


def publish_demo(url: str, topic: str) -> None:
    start = (int(time.time()) // 60 - 10) * 60_000
    messages = [
        {"key": f"user-{i % 3}", "value": {"ts": start + i * 1000, "page": f"/p/{i % 7}"}}
        for i in range(300)
    ]
    # A late-enough click closes the last window (the watermark passes its end).
    messages.append({"key": "user-0", "value": {"ts": start + 400_000, "page": "/"}})
    httpx.post(f"{url}/v1/topics/{topic}/messages", json={"messages": messages}).raise_for_status()
    print(f"published {len(messages)} demo records to {topic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--out-topic", default="clicks-per-minute")
    parser.add_argument("--out-dir", default="/tmp/herald-clicks")
    parser.add_argument("--demo", action="store_true")
    parser.add_argument("--follow", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.demo:
        publish_demo(args.url, args.topic)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import herald.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("herald-per-key-per-minute")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    herald.spark.register(spark)
    out = Path(args.out_dir)

    def per_minute(subscription: str):  # type: ignore[no-untyped-def]
        clicks = (
            spark.readStream.format("herald")
            .option("url", args.url)
            .option("topic", args.topic)
            .option("subscription", subscription)
            .option("startingOffsets", "earliest")
            .load()
        )
        ts = F.get_json_object("value", "$.ts").cast("long")
        event_time = F.coalesce((ts / 1000).cast("timestamp"), F.col("timestamp"))
        return (
            clicks.withColumn("event_time", event_time)
            .withWatermark("event_time", "30 seconds")
            .groupBy(F.col("key"), F.window("event_time", "1 minute"))
            .count()
            .select(
                "key",
                F.col("window.start").alias("window_start"),
                F.col("count"),
            )
        )

    trigger = {"processingTime": "5 seconds"} if args.follow else {"availableNow": True}
    to_topic = (
        per_minute(f"{args.topic}-per-minute-topic")
        .select(
            "key",
            F.to_json(
                F.struct(
                    "key",
                    F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                    "count",
                )
            ).alias("value"),
        )
        .writeStream.format("herald")
        .option("url", args.url)
        .option("topic", args.out_topic)
        .option("checkpointLocation", str(out / "cp-topic"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    to_parquet = (
        per_minute(f"{args.topic}-per-minute-parquet")
        .writeStream.format("parquet")
        .option("path", str(out / "parquet"))
        .option("checkpointLocation", str(out / "cp-parquet"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    try:
        for query in (to_topic, to_parquet):
            query.awaitTermination()
    finally:
        for query in (to_topic, to_parquet):
            query.stop()
    results = spark.read.parquet(str(out / "parquet")).orderBy("window_start", "key")
    print(f"{results.count()} (key, minute) counts in {out / 'parquet'}:")
    results.show(50, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
