"""Issue 25, items 1 and 2, end to end: restarts are new incarnations (PROTOCOL §7,
settled 2026-11-26).

A node that stops and starts again, however quickly, with its data directory intact or
empty, leads nothing until an election makes it leader (epoch + 1); a replica whose log
lacks what was committed never becomes leader while a replica that has it lives; a
restarted follower is out of the ISR until it has caught up again.

Before incarnations, a leader killed and restarted with an empty data directory took its
partition back at the same epoch as soon as it registered again, and its followers
truncated to its empty log: every acknowledged record was gone. Each test here proves the
outcome from outside — every acknowledged record served by every node, and the replica
checker over every replica's files — with real processes, a real etcd and kill -9.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.etcd import EtcdClient
from cluster.membership import node_key
from tests.cluster.nodes import Ack, HeraldCluster, message_bytes, read_all

TOPIC_CONFIG: dict[str, Any] = {"replication_factor": 3, "min_insync_replicas": 2}
RECORDS = 60


def publish_acked(cluster: HeraldCluster, node: str, topic: str, prefix: str) -> list[Ack]:
    """RECORDS records at acks=all to partition 0, ten to a request; every one answered
    200 (the cluster is healthy: anything else fails the test)."""
    acks: list[Ack] = []
    for first in range(0, RECORDS, 10):
        ids = [f"{prefix}-{k}" for k in range(first, first + 10)]
        messages = [
            {"id": i, "value_b64": base64.b64encode(i.encode()).decode(), "partition": 0}
            for i in ids
        ]
        sent = time.monotonic()
        answer = cluster.post(
            node, f"/v1/topics/{topic}/messages", {"messages": messages}, acks="all"
        )
        assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"
        now = time.monotonic()
        acks += [
            Ack(i, i.encode(), r["partition"], r["offset"], r["duplicate"], node, sent, now)
            for i, r in zip(ids, answer.json()["results"], strict=True)
        ]
    return acks


def wipe(cluster: HeraldCluster, node: str) -> None:
    """The node's data directory lost (a new disk, a container without its volume)."""
    shutil.rmtree(cluster.nodes[node].data_dir)
    cluster.nodes[node].data_dir.mkdir(parents=True)


def served(cluster: HeraldCluster, node: str, topic: str) -> dict[int, bytes]:
    """offset -> value of partition 0 as ``node`` serves it."""
    return {m["offset"]: message_bytes(m) for m in read_all(cluster, node, topic)}


def assert_every_ack_everywhere(cluster: HeraldCluster, topic: str, acks: list[Ack]) -> None:
    for node in cluster.nodes:

        def holds_all(node: str = node) -> bool:
            try:
                records = served(cluster, node, topic)
            except (AssertionError, httpx.HTTPError):
                return False
            return all(records.get(a.offset) == a.value for a in acks)

        cluster.wait_for(holds_all, 60.0, f"{node} serving all {len(acks)} acknowledged records")


def check_replicas(cluster: HeraldCluster, topic: str, acks: list[Ack]) -> None:
    high_watermark = cluster.high_watermark(topic)
    report = cluster.check(
        topic,
        replicas=list(cluster.nodes),
        high_watermark=high_watermark,
        acknowledged=[(a.offset, a.value) for a in acks],
    )
    assert report.acknowledged == len(acks)


def publish_again_and_check(
    cluster: HeraldCluster, acks: list[Ack], via: str | None = None
) -> None:
    """After a fault: once every node is back in the ISR of orders/0, a second batch is
    acknowledged (through ``via``, else the leader then), and every record acknowledged
    before and since is on every node, the replicas checked."""
    cluster.wait_isr("orders", 0, cluster.nodes, within=60.0)
    node = cluster.leader("orders").node_id if via is None else via
    acks = acks + publish_acked(cluster, node, "orders", "b")
    assert_every_ack_everywhere(cluster, "orders", acks)
    check_replicas(cluster, "orders", acks)


@pytest.fixture
def slow_lease_cluster(tmp_path: Path) -> Iterator[HeraldCluster]:
    """Three nodes whose leases outlive a restart (10 s), so a node can start again, and
    register anew, while its old incarnation still holds its key."""
    with HeraldCluster(tmp_path / "cluster", 3, node_ttl_ms=10_000) as cluster:
        yield cluster


async def _registration(cluster: HeraldCluster, node: str) -> tuple[int, int] | None:
    """(lease, create revision) of ``node``'s key in etcd, None if it has none."""
    assert cluster.etcd is not None
    async with EtcdClient(cluster.etcd.urls) as etcd:
        kv = await etcd.get(node_key(cluster.cluster_name, node))
        return None if kv is None else (kv.lease, kv.create_revision)


@contextmanager
def _kept_alive(cluster: HeraldCluster, lease: int) -> Iterator[None]:
    """The test renews ``lease`` every second while inside: the restarted process meets its
    old incarnation's key however long its start takes on a loaded host (a dead node's
    lease would otherwise end TTL after its last renewal)."""
    assert cluster.etcd is not None
    urls = cluster.etcd.urls
    done = threading.Event()

    async def renew() -> None:
        async with EtcdClient(urls) as etcd:
            while not done.is_set():
                await etcd.lease_keepalive(lease, within_s=5.0)
                await asyncio.to_thread(done.wait, 1.0)

    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(renew())
        except BaseException as exc:  # reported when the block ends
            failure.append(exc)

    renewer = threading.Thread(target=run, name="lease-renewer")
    renewer.start()
    try:
        yield
    finally:
        done.set()
        renewer.join(60)
    assert not failure, f"renewing the old lease failed: {failure[0]!r}"


async def _revoke(cluster: HeraldCluster, lease: int) -> None:
    assert cluster.etcd is not None
    async with EtcdClient(cluster.etcd.urls) as etcd:
        await etcd.lease_revoke(lease)


@pytest.mark.timeout(300)
def test_a_leader_restarted_with_an_empty_disk_inside_its_lease_leads_only_through_an_election(
    slow_lease_cluster: HeraldCluster,
) -> None:
    """The run of 2026-11-26: a leader killed and started again with an empty data
    directory registers the moment its old lease ends. Its followers are frozen across that
    moment here, so that when they look again the leader is already back: before
    incarnations it took its partition back at the same epoch, and they truncated to its
    empty log."""
    cluster = slow_lease_cluster
    cluster.create_topic("orders", **TOPIC_CONFIG)
    before = cluster.partition_state("orders")
    old = before["leader"]
    followers = [r for r in before["replicas"] if r != old]
    acks = publish_acked(cluster, old, "orders", "a")
    registered = asyncio.run(_registration(cluster, old))
    assert registered is not None
    old_lease, old_incarnation = registered

    with ThreadPoolExecutor(1) as pool:
        try:
            with _kept_alive(cluster, old_lease):
                cluster.kill(old)
                wipe(cluster, old)
                waiting = cluster.nodes[old].log().count("waiting for its lease to end")
                restarted = pool.submit(cluster.restart, old)
                cluster.wait_for(
                    lambda: (
                        cluster.nodes[old].log().count("waiting for its lease to end") > waiting
                    ),
                    120.0,
                    f"{old} started again and waiting for its old lease",
                )
                for follower in followers:
                    cluster.pause(follower)
            asyncio.run(_revoke(cluster, old_lease))  # its old lease ends now
            cluster.wait_for(
                lambda: (
                    (asyncio.run(_registration(cluster, old)) or (0, old_incarnation))[1]
                    != old_incarnation
                ),
                30.0,
                f"{old} registered again",
            )
        finally:
            for follower in followers:
                cluster.resume(follower)
        restarted.result(timeout=120.0)

    after = cluster.wait_leader("orders", not_on={old}, within=60.0)
    assert after["epoch"] >= before["epoch"] + 1
    publish_again_and_check(cluster, acks)


@pytest.mark.timeout(300)
def test_a_follower_restarted_empty_is_never_elected_over_one_that_holds_the_records(
    herald_cluster: HeraldCluster,
) -> None:
    """The leader and its first follower die together; the follower comes back at once
    with an empty disk, while the other follower, which has every record, lives on."""
    cluster = herald_cluster
    cluster.create_topic("orders", **TOPIC_CONFIG)
    state = cluster.partition_state("orders")
    leader = state["leader"]
    empty, keeper = [r for r in state["replicas"] if r != leader]  # replica order
    acks = publish_acked(cluster, leader, "orders", "a")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(cluster.kill, [leader, empty]))
    wipe(cluster, empty)
    cluster.restart(empty)

    after = cluster.wait_leader("orders", not_on={leader})
    assert after["leader"] == keeper, f"{after['leader']} elected with an empty log"
    assert after["epoch"] >= state["epoch"] + 1
    cluster.restart(leader)
    publish_again_and_check(cluster, acks, via=keeper)


@pytest.mark.timeout(360)
def test_after_a_whole_cluster_restart_with_one_disk_lost_the_most_up_to_date_replica_leads(
    herald_cluster: HeraldCluster,
) -> None:
    """Every ISR member restarts (a power cut): none is current, so the most up-to-date
    of them leads once all are back — never the one whose disk was lost."""
    cluster = herald_cluster
    cluster.create_topic("orders", **TOPIC_CONFIG)
    state = cluster.partition_state("orders")
    old = state["leader"]
    acks = publish_acked(cluster, old, "orders", "a")

    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        list(pool.map(cluster.kill, list(cluster.nodes)))
    wipe(cluster, old)
    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        list(pool.map(cluster.restart, list(cluster.nodes)))

    after = cluster.wait_leader("orders", not_on={old})
    assert after["epoch"] >= state["epoch"] + 1
    publish_again_and_check(cluster, acks, via=after["leader"])
