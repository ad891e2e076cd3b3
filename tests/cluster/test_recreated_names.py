"""Issue 25, item 4: a name deleted and created again is a new thing (PROTOCOL §7,
settled 2026-11-26; Kafka's topic IDs, KIP-516).

A node that was down while a topic was deleted and created again under the same name
must not keep the old topic's log under that name (before topic ids it did, and a tail
on it showed the old records at offsets where the new topic has others). A subscription
deleted and created again starts from its own ``start`` with its own config, never from
the old one's cursor.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import pytest

from cluster.etcd import EtcdClient
from cluster.topics import topic_key
from tests.cluster.checker import check_replicas
from tests.cluster.nodes import HeraldCluster, message_bytes, read_all


def publish(cluster: HeraldCluster, node: str, topic: str, ids: list[str]) -> None:
    messages = [
        {"id": i, "value_b64": base64.b64encode(i.encode()).decode(), "partition": 0} for i in ids
    ]
    # A topic just created through another node may not lead here yet: 503 (PROTOCOL §7,
    # "being created; try again"), retried with the same ids, as a producer would.
    deadline = time.monotonic() + 60.0
    while True:
        answer = cluster.post(
            node, f"/v1/topics/{topic}/messages", {"messages": messages}, acks="all"
        )
        if answer.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"


@pytest.mark.timeout(300)
def test_a_node_down_while_its_topic_was_created_again_drops_the_old_log(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    cluster.create_topic("t", replication_factor=3, min_insync_replicas=2)
    publish(cluster, "n1", "t", [f"old-{k}" for k in range(20)])

    cluster.kill("n3")
    cluster.wait_for(
        lambda: all(cluster.live_ids(n) == {"n1", "n2"} for n in ("n1", "n2")),
        60.0,
        "n3 gone from the cluster",
    )
    assert cluster.http.delete(f"{cluster.nodes['n1'].url}/v1/topics/t").status_code == 204
    again = cluster.put("n2", "/v1/topics/t", {"replication_factor": 2, "min_insync_replicas": 1})
    assert again.status_code == 201, again.text
    publish(cluster, "n1", "t", ["new-0", "new-1"])

    cluster.restart("n3")  # serving means its first pass over etcd's state is done
    cluster.wait_live(3, within=60.0)
    got = cluster.get("n3", "/v1/topics/t")
    assert got.status_code == 200 and "n3" not in got.json()["partitions"][0]["replicas"]
    cluster.stop_nodes()
    report = check_replicas({"n3": cluster.replica_dirs("t", 0, ["n3"])["n3"]}, high_watermark=0)
    assert report.replicas["n3"].end == 0, f"n3 kept the old topic's log: {report.replicas}"


def pull(
    cluster: HeraldCluster, node: str, name: str, wait_ms: int = 5000, most: int = 100
) -> list[dict[str, Any]]:
    answer = cluster.post(
        node, f"/v1/subscriptions/{name}/pull", {"max_messages": most, "wait_ms": wait_ms}
    )
    assert answer.status_code == 200, answer.text
    messages: list[dict[str, Any]] = answer.json()["messages"]
    return messages


@pytest.mark.timeout(300)
def test_a_subscription_created_again_at_once_starts_from_its_own_start(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    cluster = shared_cluster
    topic, billing = unique("orders"), unique("billing")
    cluster.create_topic(topic, replication_factor=3, min_insync_replicas=2)
    publish(cluster, "n1", topic, [f"before-{k}" for k in range(10)])
    created = cluster.put(
        "n1", f"/v1/subscriptions/{billing}", {"topic": topic, "start": "earliest"}
    )
    assert created.status_code == 201, created.text
    first: list[dict[str, Any]] = []
    cluster.wait_for(
        lambda: bool(first.extend(pull(cluster, "n2", billing, most=3)) or first), 60.0, "a pull"
    )
    ack = cluster.post("n2", f"/v1/subscriptions/{billing}/ack", {"ids": [m["id"] for m in first]})
    assert ack.status_code == 200, ack.text
    time.sleep(0.05)
    since = int(time.time() * 1000)  # every earlier record is older

    # Deleted and created again, starting from now, at once (one etcd watch batch apart):
    # the old one's cursor would deliver the 7 records it never sent.
    assert (
        cluster.http.delete(f"{cluster.nodes['n3'].url}/v1/subscriptions/{billing}").status_code
        == 204
    )
    again = cluster.put(
        "n3", f"/v1/subscriptions/{billing}", {"topic": topic, "start": {"timestamp": since}}
    )
    assert again.status_code == 201, again.text
    publish(cluster, "n1", topic, ["after"])

    seen: list[bytes] = []

    def delivered_after() -> bool:
        for m in pull(cluster, "n1", billing, wait_ms=2000):
            seen.append(
                base64.b64decode(m["value_b64"]) if "value_b64" in m else str(m["value"]).encode()
            )
        return b"after" in seen

    cluster.wait_for(delivered_after, 60.0, "the new subscription delivering what came after it")
    assert seen == [b"after"], (
        f"the re-created subscription delivered the old one's records: {seen}"
    )


@pytest.mark.timeout(240)
def test_a_topic_config_that_does_not_parse_deletes_nothing(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    """Issue 25, item 9: bytes in etcd that are not a topic config (a bug, a hand edit, a
    newer version's field) leave every node's copy alone."""
    cluster = shared_cluster
    topic = unique("t")
    cluster.create_topic(topic, replication_factor=3, min_insync_replicas=2)
    ids = [f"r-{k}" for k in range(10)]
    publish(cluster, "n1", topic, ids)
    key = topic_key(cluster.cluster_name, topic)

    async def swap(value: bytes) -> bytes:
        assert cluster.etcd is not None
        async with EtcdClient(cluster.etcd.urls) as etcd:
            kv = await etcd.get(key)
            assert kv is not None
            await etcd.put(key, value)
            return kv.value

    good = asyncio.run(swap(b"{not json"))
    time.sleep(3)  # several reconcile passes (every 0.5 s) see the garbage
    asyncio.run(swap(good))
    for node in cluster.nodes:
        cluster.wait_for(
            lambda node=node: (
                [message_bytes(m) for m in read_all(cluster, node, topic)]
                == [i.encode() for i in ids]
            ),
            60.0,
            f"{node} serving every record",
        )
