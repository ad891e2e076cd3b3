"""`herald.Consumer` given a cluster's node URLs (PROTOCOL §7) across the kill -9 of a
subscription's coordinator, on a real 3-node cluster: one Consumer object per reader for
the whole run, no reconnection by the test — the SDK goes round its URL list."""

from __future__ import annotations

import asyncio

from herald import Consumer
from tests.cluster.nodes import HeraldCluster
from tests.cluster.test_cluster_subscriptions import CoordinatorKill


def test_consumers_given_every_node_go_on_when_the_coordinator_is_killed(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    run = CoordinatorKill(cluster, "jobs", "work", count=2000)
    owner, others = run.owner, run.others
    # One consumer starts on the coordinator itself (its socket dies with the node), the
    # other on another node (relayed; closed with 1012 when the coordinator dies).
    lists = [
        [cluster.nodes[n].url for n in (owner, *others)],
        [cluster.nodes[n].url for n in (others[0], owner, others[1])],
    ]
    consumers = [Consumer(urls, "work", credit=50, max_backoff=1.0) for urls in lists]

    async def consume(consumer: Consumer) -> None:
        async for message in consumer:
            if await run.take(message):
                return

    async def both() -> None:
        tasks = [asyncio.create_task(consume(c)) for c in consumers]
        try:
            async with asyncio.timeout(180):
                while not run.done:
                    done, _ = await asyncio.wait(tasks, timeout=0.5)
                    for task in done:
                        task.result()  # a consumer that gave up fails the test
        finally:
            for consumer in consumers:
                await consumer.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(both())
    run.check()
    # What was acked after the kill came through a consumer that went round its list
    # and was ready again on a live node.
    assert max(c.connections for c in consumers) >= 2
