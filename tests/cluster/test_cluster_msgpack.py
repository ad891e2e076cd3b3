"""msgpack in a cluster (docs/protocol.md "MessagePack"). A msgpack publish sent to a node
that leads only some of its partitions: the node appends its own part and forwards the
rest to their leaders (as JSON), and every partition then holds the records the body
described, as every node reads them. A consumer that offers msgpack to a node that
relays it to its subscription's coordinator (PROTOCOL §7) gets msgpack frames through
the relay."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import httpx
import msgspec
import pytest

from herald import Consumer, Message, Producer
from tests.cluster.nodes import HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated

pytestmark = pytest.mark.timeout(240)


def test_a_msgpack_publish_through_any_node_stores_what_it_says(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    cluster = shared_cluster
    topic = unique("packed")
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    leaders = {p: cluster.leader(topic, p).node_id for p in range(3)}
    # A node that does not lead partition 0, so that some of the batch is forwarded.
    via = next(n for n in sorted(cluster.nodes) if n != leaders[0])
    messages = []
    expected: dict[int, list[dict[str, object]]] = {0: [], 1: [], 2: []}
    for i in range(12):
        partition = i % 3
        if i % 2:
            payload = bytes([i]) * (100 + i)
            messages.append({"value": payload, "key": f"k{i}", "partition": partition})
            expected[partition].append({"value_b64": base64.b64encode(payload).decode()})
        else:
            text = '{ "n" : ' + str(i) + ', "s": "é" }'
            messages.append({"value_json": text, "headers": {"i": str(i)}, "partition": partition})
            expected[partition].append({"value": {"n": i, "s": "é"}, "headers": {"i": str(i)}})
    answer = httpx.post(
        f"{cluster.nodes[via].url}/v1/topics/{topic}/messages",
        content=msgspec.msgpack.encode({"messages": messages}),
        headers={"content-type": "application/vnd.msgpack"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["partition"] for r in results] == [i % 3 for i in range(12)]

    def read(node: str, partition: int) -> list[dict[str, object]]:
        answer = cluster.get(node, f"/v1/topics/{topic}/partitions/{partition}/messages", offset=0)
        assert answer.status_code == 200, answer.text
        records: list[dict[str, object]] = answer.json()["messages"]
        return records

    # A follower shows what it holds up to the high watermark it has learnt: wait for it.
    cluster.wait_for(
        lambda: all(
            len(read(node, p)) == len(wanted)
            for node in cluster.nodes
            for p, wanted in expected.items()
        ),
        within=60,
        what="every node reads every record",
    )
    for partition, wanted in expected.items():
        for node in cluster.nodes:
            records = read(node, partition)
            for record, want in zip(records, wanted, strict=True):
                for member, value in want.items():
                    assert record[member] == value, (node, partition, record)


async def _take(consumer: Consumer, count: int) -> list[Message]:
    taken: list[Message] = []
    async with asyncio.timeout(60):
        while len(taken) < count:
            taken += await consumer.take_batch(count - len(taken))
    return taken


async def test_a_consumer_relayed_to_its_coordinator_gets_msgpack_when_it_asks(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    cluster = shared_cluster
    topic, packed_sub, json_sub = unique("packed"), unique("psub"), unique("jsub")
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    for sub in (packed_sub, json_sub):
        created = cluster.put(
            "n1", f"/v1/subscriptions/{sub}", {"topic": topic, "start": "earliest"}
        )
        assert created.status_code == 201, created.text
    payloads = [bytes([i]) * 64 for i in range(20)]
    values: list[object] = [*payloads, *({"n": i} for i in range(10))]
    urls = [node.url for node in cluster.nodes.values()]
    async with Producer(urls) as producer:
        await producer.send_many(topic, values)
    for sub, encoding, frames in ((packed_sub, "auto", "msgpack"), (json_sub, "json", "json")):
        relay = next(n for n in sorted(cluster.nodes) if n != wait_coordinated(cluster, sub))
        async with Consumer(cluster.nodes[relay].url, sub, credit=8, encoding=encoding) as consumer:
            taken = await _take(consumer, len(values))
            assert consumer.frame_encoding == frames, (sub, relay)
            await consumer.ack_many(taken)
        assert sorted(m.value for m in taken if m.is_bytes) == payloads
        assert sorted(m.value["n"] for m in taken if not m.is_bytes) == list(range(10))

        def acked(sub: str = sub) -> bool:
            answer = cluster.get("n1", f"/v1/subscriptions/{sub}")
            return answer.status_code == 200 and answer.json()["stats"]["backlog"] == 0

        cluster.wait_for(acked, within=60, what=f"every record of {sub} acked")
