"""Publishing to the leader (docs/protocol.md): `GET /v1/topics/{topic}` names each
partition's leader URL; a node that forwards records of a publish says how many in its
answer (`Herald-Forwarded-Records`); the SDK's producer, given one node, learns the
leaders from that and sends each record to its partition's leader itself — keyed
records to the leader of the partition their key hashes to, batches of keyless records
(JSON and msgpack alike) to one partition after another — and when a leader dies,
publishes through the node it was given until the layout is read again."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import httpx
import pytest

from herald import Producer
from herald._routing import partition_of_key
from herald.protocol.publish import FORWARDED_RECORDS
from tests.cluster.nodes import HeraldCluster

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 6


def forwarded_total(cluster: HeraldCluster) -> int:
    """Records the serving nodes forwarded to a leader, all told (their /metrics)."""
    total = 0
    for node in cluster.serving():
        text = cluster.get(node, "/metrics").text
        found = re.search(r"^herald_forwarded_records_total (\d+)", text, re.MULTILINE)
        assert found is not None, "no herald_forwarded_records_total in /metrics"
        total += int(found.group(1))
    return total


def test_a_topic_names_its_leaders_urls_and_a_forwarding_node_says_so(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    cluster = shared_cluster
    topic = unique("routed")
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    leaders = {p: cluster.leader(topic, p) for p in range(3)}
    for node in cluster.nodes:
        shown = cluster.get(node, f"/v1/topics/{topic}").json()["partitions"]
        assert {p["partition"]: p["leader_url"] for p in shown} == {
            p: leader.url for p, leader in leaders.items()
        }, node
    leader = leaders[0]
    other = next(n for n in cluster.nodes.values() if n is not leader)
    body = {"messages": [{"value": i, "partition": 0} for i in range(3)]}
    with httpx.Client(timeout=60) as http:
        direct = http.post(f"{leader.url}/v1/topics/{topic}/messages", json=body)
        assert direct.status_code == 200, direct.text
        assert FORWARDED_RECORDS not in direct.headers
        hop = http.post(f"{other.url}/v1/topics/{topic}/messages", json=body)
        assert hop.status_code == 200, hop.text
        assert hop.headers[FORWARDED_RECORDS] == "3"


def test_the_producer_sends_each_record_to_its_leader_and_survives_a_dead_one(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    cluster.create_topic("routed", partitions=PARTITIONS, replication_factor=3)
    leaders = {p: cluster.leader("routed", p).node_id for p in range(PARTITIONS)}
    # The node the producer is given leads some partitions, not all.
    home = next(n for n in sorted(cluster.nodes) if n in leaders.values())
    assert set(leaders.values()) != {home}, leaders

    async def scenario() -> None:
        async with Producer(cluster.nodes[home].url, max_batch=10) as producer:
            # Learning from the answers: the first sends are forwarded, and once the
            # producer read the layout none is (bounded: the read runs in the background).
            for _round in range(100):
                before = forwarded_total(cluster)
                await asyncio.gather(
                    *(producer.send("routed", {"k": k}, key=f"key-{k}") for k in range(24))
                )
                if forwarded_total(cluster) == before:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the producer never stopped going through its node")

            # Keyed records land where the key hashes (the server decides), each sent to
            # its leader; keyless batches, JSON and bytes, go to one partition after
            # another.
            before = forwarded_total(cluster)
            keyed = await asyncio.gather(
                *(producer.send("routed", k, key=f"user-{k}") for k in range(60))
            )
            keyless = await producer.send_many("routed", [{"n": n} for n in range(40)])
            payloads = [bytes([n]) * 100 for n in range(40)]
            binary = await producer.send_many("routed", payloads)
            assert forwarded_total(cluster) == before
            for k, result in enumerate(keyed):
                assert result is not None
                assert result.partition == partition_of_key(f"user-{k}", PARTITIONS)
            assert len({r.partition for r in keyless if r is not None}) > 1
            assert len({r.partition for r in binary if r is not None}) > 1

            # A leader killed: its records go through the home node (which waits for the
            # new leader) and are published all the same.
            victim = next(n for n in leaders.values() if n != home)
            victim_partition = next(p for p, n in leaders.items() if n == victim)
            key = next(
                f"late-{i}"
                for i in range(1000)
                if partition_of_key(f"late-{i}", PARTITIONS) == victim_partition
            )
            cluster.kill(victim)
            late = await asyncio.wait_for(producer.send_and_wait("routed", "late", key=key), 120)
            assert late is not None and late.partition == victim_partition
            shown = cluster.get(
                home,
                f"/v1/topics/routed/partitions/{victim_partition}/messages",
                offset=late.offset,
            ).json()["messages"]
            assert shown and shown[0]["value"] == "late"

    asyncio.run(scenario())


def test_keyless_records_routed_by_a_layout_of_a_deleted_topic_are_published(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    """The layout read names 6 partitions; the topic is deleted and created again with
    one. Keyless batches the producer sends to partitions 1-5 are refused (no such
    partition) and go again without one: every record is published."""
    cluster = shared_cluster
    topic = unique("recreated")
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    home = cluster.leader(topic, 0).node_id

    def recreate() -> None:
        gone = httpx.delete(f"{cluster.nodes[home].url}/v1/topics/{topic}", timeout=60)
        assert gone.status_code == 204, gone.text
        cluster.create_topic(topic, partitions=1, replication_factor=3)

    async def scenario() -> None:
        async with Producer(cluster.nodes[home].url, max_batch=5) as producer:
            assert await producer.partitions_for(topic) == list(range(PARTITIONS))
            await asyncio.to_thread(recreate)
            results = await asyncio.wait_for(
                producer.send_many(topic, [{"n": n} for n in range(30)]), 120
            )
            assert [r.partition for r in results if r is not None] == [0] * 30

    asyncio.run(scenario())
