"""The subscription figures of bench/cluster.py (issue 15), on the same 3-node cluster:

- ``consume``: end-to-end records/s through the SDK — a ``herald.Producer`` (defaults,
  acks=all) publishing to one node and a ``herald.Consumer`` (defaults, acking each
  record) on *another* node than the subscription's coordinator, so every delivery is
  relayed — on a topic with replication_factor 3; from the first send to the last ack.
- ``coordinator``: kill -9 of a subscription's coordinator while a Consumer on another
  node consumes: the time from the kill to the first record delivered again (a record
  that was in flight at the kill, redelivered by the next coordinator).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from herald import Consumer, Producer
from tests.cluster.nodes import HeraldCluster

VALUE = "x" * 98  # a 100-byte JSON value with its quotes


def _coordinator(cluster: HeraldCluster, name: str) -> str | None:
    for node in cluster.serving():
        try:
            view = cluster.cluster_view(node)
        except httpx.TransportError:
            continue
        for entry in view.get("subscriptions", ()):
            node = entry["coordinator"]
            if entry["name"] == name and node in cluster.nodes and cluster.nodes[node].serving:
                return str(node)
    return None


def _subscription(cluster: HeraldCluster, name: str, topic: str) -> str:
    answer = cluster.put(
        cluster.any_serving(), f"/v1/subscriptions/{name}", {"topic": topic, "start": "earliest"}
    )
    assert answer.status_code in (200, 201), answer.text
    found: dict[str, str] = {}

    def coordinated() -> bool:
        node = _coordinator(cluster, name)
        if node is not None:
            found["node"] = node
        return node is not None

    cluster.wait_for(coordinated, 30.0, f"a coordinator of {name}")
    return found["node"]


def consume_throughput(cluster: HeraldCluster, records: int) -> None:
    topic, name = "bench-consume", "bench-consume-sub"
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    owner = _subscription(cluster, name, topic)
    others = [n for n in sorted(cluster.nodes) if n != owner and cluster.nodes[n].serving]
    producer_url, consumer_url = cluster.nodes[others[0]].url, cluster.nodes[others[-1]].url

    async def run() -> float:
        done = asyncio.Event()
        got = 0

        async def consume() -> None:
            nonlocal got
            async with Consumer(consumer_url, name) as consumer:
                async for message in consumer:
                    await message.ack()
                    got += 1
                    if got >= records:
                        done.set()
                        return

        task = asyncio.create_task(consume())
        started = time.perf_counter()
        async with Producer(producer_url) as producer:
            for first in range(0, records, 1000):
                await asyncio.gather(
                    *(producer.send(topic, VALUE) for _ in range(min(1000, records - first)))
                )
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - started
        await task
        return elapsed

    elapsed = asyncio.run(run())
    print(
        f"consume    {records} records RF 3, producer on {others[0]}, consumer on "
        f"{others[-1]} (coordinator {owner}, relayed): {records / elapsed:,.0f} records/s "
        f"end to end",
        flush=True,
    )


def coordinator_failover(cluster: HeraldCluster, times: int) -> None:
    results: list[float] = []
    for turn in range(times):
        topic, name = f"bench-coord-{turn}", f"bench-coord-sub-{turn}"
        cluster.create_topic(topic, partitions=3, replication_factor=3)
        owner = _subscription(cluster, name, topic)
        others = [n for n in sorted(cluster.nodes) if n != owner and cluster.nodes[n].serving]

        async def run(topic: str, name: str, owner: str, others: list[str]) -> float:
            async with Producer(cluster.nodes[others[0]].url) as producer:
                await asyncio.gather(*(producer.send(topic, i) for i in range(5000)))
            killed: dict[str, Any] = {}
            seen: set[int] = set()
            consumer = Consumer(cluster.nodes[others[-1]].url, name, credit=100)
            try:
                async with asyncio.timeout(120):
                    async for message in consumer:
                        value = int(message.value)
                        if "at" in killed and value in seen:  # in flight at the kill
                            return time.monotonic() - float(killed["at"])
                        seen.add(value)
                        if "at" not in killed and value >= 500:
                            await asyncio.to_thread(cluster.kill, owner)
                            killed["at"] = time.monotonic()
                            continue  # left unacked: in flight at the kill
                        await message.ack()
            finally:
                await consumer.close()
            raise AssertionError("no redelivery seen")

        results.append(asyncio.run(run(topic, name, owner, others)))
        print(
            f"coordinator kill -9 of {owner} -> first redelivery: {results[-1]:.2f} s", flush=True
        )
        cluster.restart(owner)
        cluster.wait_live(len(cluster.nodes))
    print(
        f"coordinator failover median {statistics.median(results):.2f} s over {len(results)} "
        f"(node_ttl_ms {cluster.node_ttl_ms})",
        flush=True,
    )
