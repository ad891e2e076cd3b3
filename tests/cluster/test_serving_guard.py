"""The serving guard (cluster/serving_guard.py): a node holding its lease serves a topic
from its own copy only while that copy is of the topic etcd has now — one registered
node on a real etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import pytest

from cluster.etcd import EtcdClient
from cluster.fence import Fence
from cluster.membership import Membership
from cluster.serving_guard import ServingGuard
from cluster.topics import config_to_json, topic_key
from storage.config import TopicConfig

CLUSTER = "guard"


async def _no_answers(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
    return {}


@pytest.fixture
async def membership(etcd: EtcdClient) -> AsyncIterator[Membership]:
    async with Membership(
        etcd, cluster=CLUSTER, node_id="n1", advertise_url="http://127.0.0.1:9", ttl_s=5
    ) as membership:
        yield membership


def guard(etcd: EtcdClient, membership: Membership, held: Mapping[str, int]) -> ServingGuard:
    fence = Fence(
        holds_lease=membership.holds_lease,
        failing_since=membership.failing_since,
        peers=lambda: ({}, set()),
        ask=_no_answers,
    )

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


async def test_a_copy_of_the_topic_etcd_has_is_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    kv = await etcd.get(topic_key(CLUSTER, "t"))
    assert kv is not None

    assert await guard(etcd, membership, {"t": kv.create_revision}).may_serve("t")


async def test_a_copy_of_a_topic_deleted_and_created_again_is_not_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    old = await etcd.get(topic_key(CLUSTER, "t"))
    assert old is not None
    await etcd.delete(topic_key(CLUSTER, "t"))
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))

    assert not await guard(etcd, membership, {"t": old.create_revision}).may_serve("t")


async def test_a_topic_etcd_no_longer_has_is_not_served(
    etcd: EtcdClient, membership: Membership
) -> None:
    assert not await guard(etcd, membership, {"t": 5}).may_serve("t")
    assert not await guard(etcd, membership, {}).may_serve("t")
