"""The replica manager (cluster/replica_manager.py): a real storage on a temp dir, one
registered node on a real etcd, the metadata view filled as etcd would fill it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.etcd import EtcdClient
from cluster.following import FollowerRole
from cluster.leading import LeaderRole
from cluster.membership import Membership
from cluster.metadata import MetadataView
from cluster.replica_manager import ReplicaManager
from cluster.state import PartitionState, VersionedState
from storage.config import TopicConfig
from storage.engine import Storage
from storage.record import Acks, NewRecord
from storage.topic import Topic

CLUSTER = "replicas"
REF = ("t", 0)


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    storage = await Storage.open(tmp_path / "n1")
    try:
        yield storage
    finally:
        await storage.close()


@pytest.fixture
async def replicas(
    etcd: EtcdClient, membership: Membership, storage: Storage
) -> AsyncIterator[ReplicaManager]:
    async def deleted(name: str) -> None:
        await storage.delete_topic(name)

    manager = ReplicaManager(
        storage,
        node_id="n1",
        cluster=CLUSTER,
        etcd=etcd,
        membership=membership,
        replica_lag_ms=3000,
        on_topic_deleted=deleted,
        url_of=lambda node: None,
        peer_headers={},
        peer_trusted=None,
        peer_verify=True,
    )
    try:
        yield manager
    finally:
        await manager.close()


def view_of(etcd: EtcdClient, topics: dict[str, int]) -> MetadataView:
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    view.topics = {name: TopicConfig(partitions=1) for name in topics}
    view.topic_ids = dict(topics)
    view.loaded = True
    return view


async def synced_topic(etcd: EtcdClient, replicas: ReplicaManager, topic_id: int = 10) -> Topic:
    """Topic "t" (id ``topic_id``) synced from etcd's view: its local copy."""
    await replicas.sync_topics(view_of(etcd, {"t": topic_id}))
    topic = replicas.storage.topic("t")
    assert topic is not None
    return topic


async def test_the_local_topics_follow_etcd(etcd: EtcdClient, replicas: ReplicaManager) -> None:
    await replicas.sync_topics(view_of(etcd, {"t": 10, "u": 11}))
    assert {t.name for t in replicas.storage.topics()} == {"t", "u"}
    assert replicas.local_id("t") == 10

    await replicas.sync_topics(view_of(etcd, {"t": 10}))

    assert {t.name for t in replicas.storage.topics()} == {"t"}
    assert replicas.local_id("u") is None


async def test_a_copy_of_a_topic_created_again_is_wiped_before_anything_reads_it(
    etcd: EtcdClient, replicas: ReplicaManager
) -> None:
    topic = await synced_topic(etcd, replicas)
    await topic.partitions[0].append([NewRecord(b'"of the old topic"')], Acks.LEADER)
    assert topic.partitions[0].log_end_offset == 1

    await replicas.sync_topics(view_of(etcd, {"t": 20}))

    assert replicas.local_id("t") == 20
    again = replicas.storage.topic("t")
    assert again is not None and again is not topic
    assert again.partitions[0].log_end_offset == 0


async def test_a_partition_led_by_this_incarnation_gets_a_leader_role(
    etcd: EtcdClient, membership: Membership, replicas: ReplicaManager
) -> None:
    topic = await synced_topic(etcd, replicas)
    state = PartitionState(("n1",), "n1", 1, ("n1",), {"n1": membership.incarnation})

    await replicas.assign_role(topic, REF, VersionedState(state, 1), observed=())

    assert isinstance(replicas.roles[REF], LeaderRole)
    assert replicas.leads("t", 0)


async def test_a_partition_an_earlier_incarnation_led_is_not_led_again_without_an_election(
    etcd: EtcdClient, membership: Membership, replicas: ReplicaManager
) -> None:
    topic = await synced_topic(etcd, replicas)
    earlier = {"n1": membership.incarnation - 1}
    state = PartitionState(("n1",), "n1", 1, ("n1",), earlier)

    await replicas.assign_role(topic, REF, VersionedState(state, 1), observed=())

    assert REF not in replicas.roles
    assert not replicas.leads("t", 0)


async def test_a_partition_is_followed_when_this_node_is_a_replica_or_observes_its_topic(
    etcd: EtcdClient, replicas: ReplicaManager
) -> None:
    await replicas.sync_topics(view_of(etcd, {"t": 10, "u": 11}))
    t, u = replicas.storage.topic("t"), replicas.storage.topic("u")
    assert t is not None and u is not None
    replica = PartitionState(("n2", "n1"), "n2", 1, ("n2", "n1"), {"n2": 5, "n1": 6})
    elsewhere = PartitionState(("n2",), "n2", 1, ("n2",), {"n2": 5})

    await replicas.assign_role(t, REF, VersionedState(replica, 1), observed=())
    await replicas.assign_role(u, ("u", 0), VersionedState(elsewhere, 1), observed=())
    assert isinstance(replicas.roles[REF], FollowerRole)
    assert ("u", 0) not in replicas.roles  # not a replica, and nothing here needs it

    replicas.tail_opened("u")
    await replicas.assign_role(u, ("u", 0), VersionedState(elsewhere, 1), replicas.tailed_topics())
    assert isinstance(replicas.roles[("u", 0)], FollowerRole)  # an observer
