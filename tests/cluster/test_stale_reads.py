"""Issue 25, item 5: no stale reads from a node that lost its lease (PROTOCOL §7,
settled 2026-11-26).

A leader cut off from etcd alone (the other nodes still reach it) loses its lease and
another node takes its partition and acknowledges newer writes. Before this, the cut-off
node went on answering reads from its own copy, without them. Now, once another node
renewed its lease after this node's first unanswered renewal (cluster/fence.py), it
answers 503 ``leader_unavailable`` (the client reads elsewhere) and stops its
subscriptions; once it reaches etcd again it follows the new leader and serves
everything. With etcd down for every node, reads and deliveries go on.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pytest
import websockets

from cluster.coordination import preferred_coordinator
from tests.cluster.link import Link
from tests.cluster.nodes import HeraldCluster, message_bytes, read_all


@pytest.fixture
def cluster_with_a_cuttable_node(tmp_path: Path) -> Iterator[tuple[HeraldCluster, Link]]:
    """Three nodes; n1 reaches etcd through a link the test can cut."""
    cluster = HeraldCluster(tmp_path / "cluster", 3)
    cluster.start()
    link: Link | None = None
    try:
        assert cluster.etcd is not None
        link = Link(urlparse(cluster.etcd.urls[0]).port or 0).start()
        cluster.nodes["n1"].etcd_urls = [link.url]
        cluster.terminate("n1")
        cluster.restart("n1")
        cluster.wait_live(3, within=60.0)
        yield cluster, link
    finally:
        if link is not None:
            link.close()
        cluster.stop()


def publish(cluster: HeraldCluster, node: str, partition: int, value: str) -> int:
    message = {"id": value, "value_b64": base64.b64encode(value.encode()).decode()}
    for _ in range(60):  # a 503 (a leader just changed) is retried, as the SDK does
        answer = cluster.post(
            node,
            "/v1/topics/t/messages",
            {"messages": [{**message, "partition": partition}]},
            acks="all",
        )
        if answer.status_code != 503:
            break
        time.sleep(0.5)
    assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"
    offset: int = answer.json()["results"][0]["offset"]
    return offset


def a_partition_n1_leads(cluster: HeraldCluster) -> int:
    """Create topic "t" (3 partitions, replication 3) through n1, the node that can be
    cut off; one of the partitions it leads (leaders are spread: it leads one)."""
    cluster.create_topic("t", via="n1", partitions=3, replication_factor=3, min_insync_replicas=2)
    topic = cluster.topic("t", "n2")
    led = [p["partition"] for p in topic["partitions"] if p["leader"] == "n1"]
    assert led, f"n1 leads none of {topic['partitions']}"
    number: int = led[0]
    return number


@pytest.mark.timeout(300)
def test_a_leader_cut_off_from_etcd_alone_serves_no_stale_read(
    cluster_with_a_cuttable_node: tuple[HeraldCluster, Link],
) -> None:
    cluster, link = cluster_with_a_cuttable_node
    number = a_partition_n1_leads(cluster)
    publish(cluster, "n1", number, "before")

    link.cut()
    try:

        def taken_over() -> bool:
            state = cluster.partition_state("t", number, "n2")
            return state["leader"] not in (None, "n1")

        cluster.wait_for(taken_over, 60.0, f"another node leading t/{number}")
        after = publish(cluster, "n2", number, "after")
        read = cluster.get("n1", f"/v1/topics/t/partitions/{number}/messages", offset=0)
        if read.status_code == 200:
            values = [message_bytes(m) for m in read.json()["messages"]]
            assert b"after" in values, (
                f"n1 answered a read begun after offset {after} was acknowledged without it: "
                f"{values}"
            )
        else:
            assert read.status_code == 503, read.text
            assert read.json()["code"] == "leader_unavailable", read.text
    finally:
        link.heal()

    cluster.wait_for(
        lambda: b"after" in [message_bytes(m) for m in read_all(cluster, "n1", "t", number)],
        60.0,
        "n1 serving the new leader's records once it reaches etcd again",
    )


@pytest.mark.timeout(300)
def test_a_coordinator_cut_off_from_etcd_alone_stops_delivering(
    cluster_with_a_cuttable_node: tuple[HeraldCluster, Link],
) -> None:
    """Issue 25, item 6: one coordinator per subscription at a time. The node cut off
    from etcd alone cannot know whether it still coordinates: once etcd shows to work for
    another node and not for it, it stops delivering — its consumer is closed with 1012
    before another node has claimed the subscription (let alone started its runtime)."""
    cluster, link = cluster_with_a_cuttable_node
    name = next(
        f"s{k}" for k in range(1000) if preferred_coordinator(f"s{k}", ["n1", "n2", "n3"]) == "n1"
    )
    cluster.create_topic("t", partitions=1, replication_factor=3, min_insync_replicas=2)
    created = cluster.put("n2", f"/v1/subscriptions/{name}", {"topic": "t", "start": "earliest"})
    assert created.status_code == 201, created.text

    def coordinator(node: str) -> str | None:
        for s in cluster.get(node, "/v1/cluster").json()["subscriptions"]:
            if s["name"] == name:
                found: str | None = s["coordinator"]
                return found
        return None

    cluster.wait_for(lambda: coordinator("n2") == "n1", 60.0, f"n1 coordinating {name}")
    for k in range(5):
        publish(cluster, "n2", 0, f"r{k}")
    consumer = Consumer(cluster.nodes["n1"].url, name)
    consumer.start()
    assert consumer.ready.wait(60.0), f"no consumer of {name} on n1"

    link.cut()
    try:
        cluster.wait_for(
            lambda: coordinator("n2") not in (None, "n1"), 60.0, f"another node coordinating {name}"
        )
        moved_at = time.monotonic()
        consumer.join(30.0)
        assert consumer.close_code == 1012, f"n1's consumer: {consumer.close_code}"
        assert consumer.closed_at is not None and consumer.closed_at < moved_at, (
            f"n1's consumer was closed {consumer.closed_at and consumer.closed_at - moved_at:.3f}"
            f" s after n2 saw another coordinator of {name}"
        )
        answer = cluster.post(
            "n1", f"/v1/subscriptions/{name}/pull", {"max_messages": 100, "wait_ms": 1000}
        )
        delivered = answer.json().get("messages", []) if answer.status_code == 200 else []
        assert not delivered, (
            f"n1 delivered {len(delivered)} records after losing its lease while "
            f"{coordinator('n2')} coordinates {name}"
        )
    finally:
        link.heal()
    # The new coordinator delivers them all.
    got: list[bytes] = []

    def pulled_all() -> bool:
        answer = cluster.post(
            "n3", f"/v1/subscriptions/{name}/pull", {"max_messages": 100, "wait_ms": 1000}
        )
        if answer.status_code == 200:
            got.extend(message_bytes(m) for m in answer.json()["messages"])
        return {f"r{k}".encode() for k in range(5)} <= set(got)

    cluster.wait_for(pulled_all, 60.0, "every record delivered by the new coordinator")


class Consumer(threading.Thread):
    """A WebSocket consumer of one subscription on one node, in its own thread: it takes
    what it is sent (acking nothing) and notes when and how its connection was closed."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(daemon=True)
        self.url = url.replace("http://", "ws://") + f"/v1/subscriptions/{name}/ws?credit=100"
        self.ready = threading.Event()
        self.close_code: int | None = None
        self.closed_at: float | None = None

    def run(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        async with websockets.connect(self.url, open_timeout=60) as ws:
            try:
                async with asyncio.timeout(120):
                    async for frame in ws:
                        if orjson.loads(frame).get("type") == "ready":
                            self.ready.set()
            except websockets.ConnectionClosed:
                pass
            self.closed_at = time.monotonic()
            self.close_code = ws.close_code


def publish_many(cluster: HeraldCluster, node: str, values: list[str]) -> None:
    messages = [
        {"id": v, "value_b64": base64.b64encode(v.encode()).decode(), "partition": 0}
        for v in values
    ]
    answer = cluster.post(node, "/v1/topics/t/messages", {"messages": messages}, acks="all")
    assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"


@pytest.mark.timeout(300)
def test_with_etcd_down_for_every_node_reads_and_deliveries_go_on(
    herald_cluster: HeraldCluster,
) -> None:
    """PROTOCOL §7, "etcd unreachable": with etcd gone for every node, committed records
    stay readable and deliverable — in the first seconds of the outage, while some node
    renewed its lease a moment before etcd stopped, and after every lease ran out (the
    first fence broke exactly this: it refused reads and stopped deliveries)."""
    cluster = herald_cluster
    etcd = cluster.etcd
    assert etcd is not None
    ttl_s = cluster.node_ttl_ms / 1000
    cluster.create_topic("t", partitions=1, replication_factor=3, min_insync_replicas=2)
    values = [f"r{k}" for k in range(300)]
    publish_many(cluster, "n1", values)
    created = cluster.put("n2", "/v1/subscriptions/s", {"topic": "t", "start": "earliest"})
    assert created.status_code == 201, created.text
    cluster.wait_known_everywhere("/v1/subscriptions/s")  # n3's watch may lag n2's put
    first = cluster.post("n3", "/v1/subscriptions/s/pull", {"max_messages": 1, "wait_ms": 5000})
    assert first.status_code == 200 and first.json()["messages"], first.text

    etcd.pause()
    down_at = time.monotonic()
    rounds = 0
    try:
        while time.monotonic() - down_at < 3 * ttl_s + 2.0:
            rounds += 1
            into = time.monotonic() - down_at
            for node in ("n1", "n2", "n3"):
                got = [message_bytes(m) for m in read_all(cluster, node, "t")]
                assert got == [v.encode() for v in values], (
                    f"{node}, {into:.2f} s into the outage: {len(got)} of {len(values)} records"
                )
            via = ("n1", "n2", "n3")[rounds % 3]
            pulled = cluster.post(
                via, "/v1/subscriptions/s/pull", {"max_messages": 2, "wait_ms": 2000}
            )
            assert pulled.status_code == 200, (
                f"pull via {via}, {into:.2f} s into the outage: {pulled.status_code} {pulled.text}"
            )
            messages = pulled.json()["messages"]
            assert messages, f"pull via {via}, {into:.2f} s into the outage: nothing delivered"
            acked = cluster.post(
                via, "/v1/subscriptions/s/ack", {"ids": [m["id"] for m in messages]}
            )
            assert acked.status_code == 200, acked.text
            # At most ~80 rounds of 2 records in the outage: the 300 last to its end (on a
            # quiet host a round takes a few ms, and 150 of them took every record).
            time.sleep(0.1)
    finally:
        etcd.resume()
    print(f"\n{rounds} rounds of reads on every node and pulls over {3 * ttl_s + 2.0:.1f} s")
    cluster.wait_live(3, within=60.0)


async def tail_values(url: str, within_s: float) -> tuple[list[bytes], int | None]:
    """What a tail from the earliest record receives within ``within_s``, and its close
    code (None: still open)."""
    got: list[bytes] = []
    ws_url = url.replace("http://", "ws://") + "/v1/topics/t/ws?from=earliest&credit=100"
    async with websockets.connect(ws_url, open_timeout=30) as ws:
        try:
            async with asyncio.timeout(within_s):
                async for frame in ws:
                    message = orjson.loads(frame)
                    if message.get("type") == "deliver":
                        got += [message_bytes(r) for r in message["messages"]]
        except TimeoutError:
            return got, None
        except websockets.ConnectionClosed:
            pass
        return got, ws.close_code


@pytest.mark.timeout(300)
def test_a_node_whose_view_lags_a_re_creation_serves_nothing_of_the_old_topic(
    cluster_with_a_cuttable_node: tuple[HeraldCluster, Link],
) -> None:
    """The seed-12 nemesis finding: a tail (and a read) opened on a node whose view of etcd
    lagged a topic's delete and re-create showed the old topic's records. Its watches are
    held back here while its lease renewals and reads of etcd still pass."""
    cluster, link = cluster_with_a_cuttable_node
    number = a_partition_n1_leads(cluster)
    for k in range(5):
        publish(cluster, "n1", number, f"old-{k}")

    link.freeze_watches()
    try:
        assert cluster.http.delete(cluster.nodes["n2"].url + "/v1/topics/t").status_code == 204
        again = cluster.put("n2", "/v1/topics/t", {"partitions": 3, "replication_factor": 3})
        assert again.status_code in (200, 201), again.text
        # n1 still has the old topic, and believes it leads partition `number`.
        assert cluster.get("n1", "/v1/topics/t").status_code == 200
        read = cluster.get("n1", f"/v1/topics/t/partitions/{number}/messages", offset=0)
        if read.status_code == 200:
            values = [message_bytes(m) for m in read.json()["messages"]]
            assert not [v for v in values if v.startswith(b"old-")], (
                f"n1 served records of the deleted topic from its copy: {values}"
            )
        else:
            assert read.status_code == 503, read.text
            assert read.json()["code"] == "leader_unavailable", read.text
        got, code = asyncio.run(tail_values(cluster.nodes["n1"].url, 3.0))
        assert not [v for v in got if v.startswith(b"old-")], (
            f"a tail on n1 showed records of the deleted topic: {got}"
        )
        assert code in (None, 1012), code
    finally:
        link.thaw_watches()

    def only_the_new_topic() -> bool:
        for n in range(3):
            answer = cluster.get("n1", f"/v1/topics/t/partitions/{n}/messages", offset=0)
            if answer.status_code != 200:
                return False
            if any(message_bytes(m).startswith(b"old-") for m in answer.json()["messages"]):
                return False
        return True

    cluster.wait_for(only_the_new_topic, 60.0, "n1 serving only the new topic once it catches up")


@pytest.mark.timeout(300)
def test_a_leader_whose_view_lags_a_re_creation_gives_its_followers_nothing_of_the_old_topic(
    cluster_with_a_cuttable_node: tuple[HeraldCluster, Link],
) -> None:
    """The seed-202 nemesis finding: a topic deleted and created again with the same
    placement is led by the same node at the same epoch (0). Its leader, whose view of
    etcd lagged, still led the old topic; the new topic's followers fetched from it and
    copied the old records into their fresh copies, then served them (and one of them
    took the partition over with them). A fetch now carries the id of the topic the
    follower's copy is of, and a leader of another topic of that name gives it nothing
    (Kafka's topic ids, KIP-516)."""
    cluster, link = cluster_with_a_cuttable_node
    config = {"partitions": 3, "replication_factor": 3, "min_insync_replicas": 2}
    cluster.create_topic("t", via="n2", **config)
    placement = {p["partition"]: p["leader"] for p in cluster.topic("t", "n2")["partitions"]}
    number = next(p for p, leader in placement.items() if leader == "n1")
    for k in range(5):
        publish(cluster, "n1", number, f"old-{k}")

    link.freeze_watches()
    try:
        assert cluster.http.delete(cluster.nodes["n2"].url + "/v1/topics/t").status_code == 204
        again = cluster.put("n2", "/v1/topics/t", config)
        assert again.status_code in (200, 201), again.text
        new = {p["partition"]: p for p in cluster.topic("t", "n2")["partitions"]}
        # The scenario: the new topic's partition is led by n1 at epoch 0, as the old one
        # was, and n1 (its watches held back) still leads the old one there.
        assert new[number]["leader"] == "n1" and new[number]["epoch"] == 0, new
        for node in ("n2", "n3"):
            got, code = asyncio.run(tail_values(cluster.nodes[node].url, 4.0))
            assert not [v for v in got if v.startswith(b"old-")], (
                f"{node} copied records of the deleted topic from n1: {got}"
            )
            assert code in (None, 1012), code
    finally:
        link.thaw_watches()

    publish(cluster, "n1", number, "new-0")

    def every_copy_holds_only_the_new_topic() -> bool:
        for node in ("n1", "n2", "n3"):
            got, _ = asyncio.run(tail_values(cluster.nodes[node].url, 2.0))
            if b"new-0" not in got or any(v.startswith(b"old-") for v in got):
                return False
        return True

    cluster.wait_for(every_copy_holds_only_the_new_topic, 90.0, "every copy holding the new topic")
