"""The replica manager (cluster/replica_manager.py): a real storage on a temp dir, one
registered node on a real etcd, the metadata view filled as etcd would fill it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.errors import LeaderUnavailable
from cluster.etcd import EtcdClient
from cluster.follower import FetchRequest, FetchResponse
from cluster.following import FollowerRole
from cluster.leading import LeaderRole
from cluster.membership import Membership
from cluster.metadata import MetadataView
from cluster.replica_manager import ReplicaManager
from cluster.state import (
    PartitionState,
    VersionedState,
    create_partition,
    partition_key,
    read_partition,
)
from storage.config import TopicConfig
from storage.engine import Storage
from storage.partition_log import PartitionLog
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


async def test_an_append_whose_leader_is_deposed_on_its_way_to_the_log_is_refused(
    etcd: EtcdClient, membership: Membership, replicas: ReplicaManager
) -> None:
    """The stale-reads test's hang (CI, 2026-11-27): an acks=all publish passed its
    leader's checks, and the role was deposed (the topic deleted and created again) while
    the batch was with the writer thread. Its commit waiter came after depose() had
    refused the others, and nothing ever answered it: the publish hung."""
    topic = await synced_topic(etcd, replicas)
    mine = {"n1": membership.incarnation, "n2": 7}
    state = PartitionState(("n1", "n2"), "n1", 1, ("n1", "n2"), mine)
    await replicas.assign_role(topic, REF, VersionedState(state, 1), observed=())

    append = asyncio.create_task(topic.partitions[0].append([NewRecord(b'"x"')], Acks.ALL))
    await asyncio.sleep(0)  # checked and handed to the writer thread, not yet written
    await replicas.drop_role(REF)

    async with asyncio.timeout(30):
        with pytest.raises(LeaderUnavailable):
            await append


async def test_a_leader_never_writes_its_isr_over_a_partition_of_a_topic_created_again(
    etcd: EtcdClient, membership: Membership, replicas: ReplicaManager
) -> None:
    """A topic deleted and created again while a leader's view lagged: the new partition
    is led by the same node at the same epoch (0). The old role's ISR change found the
    key changed and took the new partition's state for its own; its next change then
    went through, over the new topic's ISR."""
    topic = await synced_topic(etcd, replicas)
    key = partition_key(CLUSTER, *REF)
    state = PartitionState(("n1", "n2"), "n1", 0, ("n1", "n2"), {"n1": membership.incarnation})
    first = await create_partition(etcd, key, state)
    assert first.succeeded and first.current is not None
    await replicas.assign_role(topic, REF, first.current, observed=())
    role = replicas.roles[REF]
    assert isinstance(role, LeaderRole)

    await etcd.delete(key)
    again = await create_partition(etcd, key, state)  # the topic's new partition
    assert again.succeeded and again.current is not None

    for _ in range(5):  # n2 is not live: each tick proposes an ISR without it
        role.tick()
        for _ in range(100):
            if role._isr_write is None:
                break
            await asyncio.sleep(0.02)
    now = await read_partition(etcd, key)
    assert now is not None and now.state.isr == ("n1", "n2"), now
    assert now.mod_revision == again.current.mod_revision


async def test_a_follower_whose_node_is_not_live_never_joins_the_isr(
    etcd: EtcdClient, membership: Membership, replicas: ReplicaManager
) -> None:
    """KIP-841: a node cut off from etcd (its key lapsed) goes on fetching. Each of its
    fetches readmitted it and the next tick dropped it again as not live: nemesis seed
    1001 logged the ISR of one partition written every 0.7 s for as long as the cut
    lasted. It joins once it is live again, as the incarnation its fetches carry."""
    topic = await synced_topic(etcd, replicas)
    key = partition_key(CLUSTER, *REF)
    state = PartitionState(("n1", "n2"), "n1", 0, ("n1",), {"n1": membership.incarnation})
    created = await create_partition(etcd, key, state)
    assert created.succeeded and created.current is not None
    await replicas.assign_role(topic, REF, created.current, observed=())
    role = replicas.roles[REF]
    assert isinstance(role, LeaderRole)

    async def fetch_at_the_log_end(incarnation: int) -> None:
        end = topic.partitions[0].log_end_offset
        request = FetchRequest("t", 0, 0, end, end, 1 << 20, topic_id=10)
        assert role.note_fetch("n2", request, incarnation) is None
        for _ in range(250):  # an ISR write, if one was proposed, ends
            if role._isr_write is None:
                break
            await asyncio.sleep(0.02)

    await fetch_at_the_log_end(incarnation=12345)  # n2 holds no key in etcd
    role.tick()
    stored = await read_partition(etcd, key)
    assert stored is not None and stored.state.isr == ("n1",), stored
    assert role.replica.isr == ("n1",)

    async with Membership(
        etcd, cluster=CLUSTER, node_id="n2", advertise_url="http://127.0.0.1:9", ttl_s=5
    ) as n2:
        for _ in range(500):  # n1's view of the members learns of n2 (bounded)
            if membership.is_current("n2", n2.incarnation):
                break
            await asyncio.sleep(0.02)
        assert membership.is_current("n2", n2.incarnation)
        await fetch_at_the_log_end(incarnation=n2.incarnation)
        stored = await read_partition(etcd, key)
        assert stored is not None and stored.state.isr == ("n1", "n2"), stored
        assert stored.state.incarnation_of("n2") == n2.incarnation


async def test_a_refused_fetch_answer_is_not_retried_in_a_hot_loop(
    etcd: EtcdClient, replicas: ReplicaManager, tmp_path: Path
) -> None:
    """A follower whose appends were refused ("batch at offset 13510 where offset 13520
    was expected": the nemesis, seed 2005, 2026-11-28) sent its next request at once,
    28,000 times in 8 minutes. A refused answer now waits before the next request."""
    topic = await synced_topic(etcd, replicas)
    state = PartitionState(("n2", "n1"), "n2", 1, ("n2", "n1"), {"n2": 5, "n1": 6})
    await replicas.assign_role(topic, REF, VersionedState(state, 1), observed=())
    role = replicas.roles[REF]
    assert isinstance(role, FollowerRole)
    leader_log = PartitionLog(tmp_path / "leader")
    try:
        leader_log.append([NewRecord(b'"a"')] * 5, 1, leader_epoch=1)
        leader_log.append([NewRecord(b'"b"')], 1, leader_epoch=1)
        not_contiguous = leader_log.read_batches(5, 1 << 20)  # the follower's log is empty
    finally:
        leader_log.close()
    role.replica.truncated(0, -1)  # fetching from 0
    before = asyncio.get_running_loop().time()
    await role.on_fetch_response(FetchResponse(None, not_contiguous, 6, 0))
    assert topic.partitions[0].log_end_offset == 0
    assert role.retry_at >= before + 0.1
