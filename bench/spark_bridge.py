"""Spark bridge benchmark: rows/s through the `herald` source, lag, backlog drain, RSS.

    python -m bench.spark_bridge [--rates 5000,10000,20000,30000] [--seconds 10]
                                 [--warmup 20000] [--backlog 100000] [--url URL]

Starts a Herald server (unless --url is given) and a local Spark session (`local[2]`).
For each offered rate, a query with `trigger(processingTime='1 second')` reads a fresh
topic through the source (foreachBatch: count and oldest record timestamp per batch).
It is first warmed up: `--warmup` records are published at once and the time until
the query has them all is reported (the query's first batches: Python workers, JIT).
Then publisher threads send 1 KiB records at the offered rate for `--seconds`
(requests of ≤ 1000 records, 4 connections). Reported: rows/s processed during the
phase and the worst lag (batch end minus the broker timestamp of the oldest record in
the batch) over its batches. Then `--backlog` records are drained by
a fresh query with `trigger(availableNow=True)`. Peak RSS is sampled over this process
and its descendants (the JVM and its Python workers), the server excluded.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import herald_server, temp_dir

RECORD = "x" * 1000  # with the JSON quotes and the small object: ~1 KiB per record
PAGE = 1000


def rss_of_tree(root: int, exclude: int | None) -> int:
    """Summed VmRSS (bytes) of `root` and its descendants, `exclude`'s tree left out."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid == exclude:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
        stack.extend(children.get(pid, []))
    return total


def publish(http: httpx.Client, topic: str, body: bytes) -> None:
    http.post(
        f"/v1/topics/{topic}/messages",
        params={"acks": "1"},
        content=body,
        headers={"content-type": "application/json"},
    ).raise_for_status()


def herald_stream(spark: Any, url: str, topic: str) -> Any:
    """The bridge's source on ``topic`` from its earliest record, own subscription."""
    return (
        spark.readStream.format("herald")
        .option("url", url)
        .option("topic", topic)
        .option("subscription", f"{topic}-spark")
        .option("startingOffsets", "earliest")
        .load()
    )


class Publisher(threading.Thread):
    """Offers `rate` records/s: every 100 ms, requests of ≤ 1000 records spread over
    `connections` threads, so one slow request does not hold the others back."""

    def __init__(
        self, url: str, topic: str, rate: int, seconds: float, connections: int = 4
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.topic, self.rate, self.seconds = url, topic, rate, seconds
        self.connections = connections
        self.sent = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        share = self.rate // self.connections
        workers = [
            threading.Thread(target=self._send, args=(share,), daemon=True)
            for _ in range(self.connections)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _send(self, rate: int) -> None:
        size = max(1, min(1000, rate // 10))
        body = orjson.dumps({"messages": [{"value": {"p": RECORD}}] * size})
        per_tick = max(1, rate // 10 // size)
        with httpx.Client(base_url=self.url, timeout=30) as http:
            start = time.monotonic()
            tick = 0
            while time.monotonic() - start < self.seconds:
                for _ in range(per_tick):
                    publish(http, self.topic, body)
                    with self._lock:
                        self.sent += size
                tick += 1
                delay = start + tick * 0.1 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="5000,10000,20000,30000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(temp_dir("herald-spark-bench-"))
        url, server_pid = (args.url, None) if args.url else stack.enter_context(herald_server())
        measure(args, tmp, url, server_pid)


def measure(args: argparse.Namespace, tmp: Path, url: str, server_pid: int | None) -> None:
    """Every figure, printed; ``server_pid`` (the server started here) is left out of RSS."""
    peak = [0]
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(0.5):
            peak[0] = max(peak[0], rss_of_tree(os.getpid(), server_pid))

    threading.Thread(target=sample, daemon=True).start()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import herald.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    herald.spark.register(spark)
    run = str(int(time.time()))
    try:
        print(f"1 KiB records, processingTime='1 second', {args.seconds:.0f} s per rate")
        print(f"{'offered/s':>10} {'sent/s':>9} {'rows/s':>9} {'max lag s':>10} {'warm-up s':>10}")
        for rate in [int(r) for r in args.rates.split(",")]:
            topic = f"bench-{run}-{rate}"
            httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
            stats: list[tuple[float, int, float]] = []  # (end time, rows, lag)

            def measure(
                df: Any, batch_id: int, stats: list[tuple[float, int, float]] = stats
            ) -> None:
                row = df.agg(F.count("*").alias("n"), F.min("timestamp").alias("t")).collect()[0]
                if row.n:
                    oldest = row.t.replace(tzinfo=UTC).timestamp()
                    now = datetime.now(UTC).timestamp()
                    stats.append((time.monotonic(), row.n, now - oldest))

            query = (
                herald_stream(spark, url, topic)
                .writeStream.foreachBatch(measure)
                .option("checkpointLocation", f"{tmp}/cp-{rate}")
                .trigger(processingTime="1 second")
                .start()
            )
            time.sleep(3)  # the query's first (empty) batches
            warm_began = time.monotonic()
            with httpx.Client(base_url=url, timeout=60) as http:
                for size in [PAGE] * (args.warmup // PAGE) + [args.warmup % PAGE]:
                    if size:
                        body = orjson.dumps({"messages": [{"value": {"p": RECORD}}] * size})
                        publish(http, topic, body)
            deadline = time.monotonic() + 60
            while sum(n for _, n, _ in stats) < args.warmup and time.monotonic() < deadline:
                time.sleep(0.05)
            warm_up = time.monotonic() - warm_began
            time.sleep(1.5)  # the warm-up's batch has ended
            warm_rows = sum(n for _, n, _ in stats)
            del stats[:]
            publisher = Publisher(url, topic, rate, args.seconds)
            began = time.monotonic()
            publisher.start()
            publisher.join()
            expected = publisher.sent + max(0, args.warmup - warm_rows)
            deadline = time.monotonic() + 30
            while sum(n for _, n, _ in stats) < expected and time.monotonic() < deadline:
                time.sleep(0.2)
            query.stop()
            rows = sum(n for _, n, _ in stats)
            elapsed = (stats[-1][0] - began) if stats else float("nan")
            lag = max((lag for _, _, lag in stats), default=float("nan"))
            print(
                f"{rate:>10} {publisher.sent / args.seconds:>9.0f} "
                f"{rows / elapsed:>9.0f} {lag:>10.2f} {warm_up:>10.1f}"
                + ("" if rows >= expected else f"  (only {rows} of {expected})")
            )

        topic = f"bench-{run}-backlog"
        httpx.put(f"{url}/v1/topics/{topic}", json={"partitions": 2}).raise_for_status()
        body = orjson.dumps({"messages": [{"value": {"p": RECORD}}] * PAGE})
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(args.backlog // PAGE):
                publish(http, topic, body)
        counted = [0]

        def count(df: Any, batch_id: int) -> None:
            counted[0] += df.count()

        began = time.monotonic()
        query = (
            herald_stream(spark, url, topic)
            .writeStream.foreachBatch(count)
            .option("checkpointLocation", f"{tmp}/cp-backlog")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(600)
        elapsed = time.monotonic() - began
        print(
            f"backlog drain (availableNow): {counted[0]} records in {elapsed:.1f} s "
            f"= {counted[0] / elapsed:.0f} records/s (query start included)"
        )
    finally:
        spark.stop()
        stop_sampling.set()
    print(f"peak RSS (this process, the JVM and its Python workers): {peak[0] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
