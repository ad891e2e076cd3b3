"""The serving guard (cluster/serving_guard.py): a node holding its lease serves a topic
from its own copy only while that copy is of the topic etcd has now — one registered
node on a real etcd."""

from __future__ import annotations

from collections.abc import Mapping

from cluster.etcd import EtcdClient, KeyValue
from cluster.membership import Membership
from cluster.serving_guard import ServingGuard
from cluster.topics import config_to_json, topic_key
from storage.config import TopicConfig
from tests.cluster.conftest import fence_alone

CLUSTER = "guard"


def guard(etcd: EtcdClient, membership: Membership, held: Mapping[str, int]) -> ServingGuard:
    fence = fence_alone(membership)

    async def stop(why: str) -> None:
        pass

    return ServingGuard(
        etcd,
        CLUSTER,
        membership,
        fence,
        topic_id=held.get,
        on_fenced=None,
        stop_subscriptions=stop,
    )


async def put_topic(etcd: EtcdClient) -> KeyValue:
    """Topic "t" created in etcd: its key as etcd holds it (create_revision: its id)."""
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    kv = await etcd.get(topic_key(CLUSTER, "t"))
    assert kv is not None
    return kv


async def test_a_copy_of_the_topic_etcd_has_is_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    kv = await put_topic(etcd)

    assert await guard(etcd, membership, {"t": kv.create_revision}).may_serve("t")


async def test_a_copy_of_a_topic_deleted_and_created_again_is_not_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    old = await put_topic(etcd)
    await etcd.delete(topic_key(CLUSTER, "t"))
    await put_topic(etcd)

    assert not await guard(etcd, membership, {"t": old.create_revision}).may_serve("t")


async def test_a_topic_etcd_no_longer_has_is_not_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    assert not await guard(etcd, membership, {"t": 5}).may_serve("t")
    assert not await guard(etcd, membership, {}).may_serve("t")
