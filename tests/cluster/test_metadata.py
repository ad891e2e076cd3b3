"""The metadata view (cluster/metadata.py): this node's mirror of etcd, read in full and
followed by a watch, on a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson

from cluster.coordination import coordinators_prefix, subscriptions_prefix
from cluster.etcd import EtcdClient, KeyValue, RangeResult
from cluster.log_ends import LogEnds, log_ends_prefix
from cluster.metadata import MetadataView
from cluster.state import PartitionState, partition_key
from cluster.topics import config_to_json, topic_key
from cluster.trust import SEALED
from storage.config import TopicConfig
from tests.cluster.conftest import eventually

CLUSTER = "meta"
WAIT_S = 15.0


def state(leader: str, epoch: int) -> bytes:
    return PartitionState(("n1", "n2"), leader, epoch, ("n1", "n2"), {"n1": 1, "n2": 2}).to_json()


async def test_a_full_read_holds_topics_their_ids_and_partition_states(etcd: EtcdClient) -> None:
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    await etcd.put(
        topic_key(CLUSTER, "auto"),
        config_to_json(TopicConfig(partitions=1), auto_created=True),
    )
    await etcd.put(partition_key(CLUSTER, "t", 0), state("n1", 1))
    created = await etcd.get(topic_key(CLUSTER, "t"))
    assert created is not None
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)

    revision = await view.load()

    assert view.loaded and revision >= created.create_revision
    assert set(view.topics) == {"t", "auto"}
    assert view.topic_ids["t"] == created.create_revision
    assert view.auto_created_topics == {"auto"}
    assert view.states[("t", 0)].state.leader == "n1"


async def test_a_topic_config_that_does_not_parse_is_unreadable_not_deleted(
    etcd: EtcdClient,
) -> None:
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    await view.load()
    await etcd.put(topic_key(CLUSTER, "t"), b"{not json")
    broken = await etcd.get(topic_key(CLUSTER, "t"))
    assert broken is not None

    view.apply(broken)

    assert "t" in view.unreadable_topics
    assert "t" in view.topics  # the local copy stays: a bad value is no delete


async def test_the_watch_follows_a_delete_and_a_re_creation_as_a_new_topic(
    etcd: EtcdClient,
) -> None:
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    await etcd.put(partition_key(CLUSTER, "t", 0), state("n1", 1))
    changes = asyncio.Event()
    view = MetadataView(etcd, CLUSTER, keys=None, changed=changes.set)
    revision = await view.load()
    old_id = view.topic_ids["t"]
    follow = asyncio.create_task(view.follow(revision + 1))
    try:
        await etcd.delete(topic_key(CLUSTER, "t"))

        async def gone() -> bool:
            return "t" not in view.topics and ("t", 0) not in view.states

        await eventually(gone, WAIT_S, "the delete seen, the partition states with it")
        await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))

        async def back() -> bool:
            return view.topic_ids.get("t", old_id) != old_id

        await eventually(back, WAIT_S, "the re-created topic seen under a new id")
        assert changes.is_set()
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)


async def test_a_partition_state_older_than_the_one_held_changes_nothing(
    etcd: EtcdClient,
) -> None:
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    key = partition_key(CLUSTER, "t", 0).encode()
    view.apply(KeyValue(key, state("n2", 2), 5, 20, 2))

    view.apply(KeyValue(key, state("n1", 1), 5, 10, 1))  # a watch event from before a read

    assert view.states[("t", 0)].state.leader == "n2"
    assert view.states[("t", 0)].mod_revision == 20


async def test_a_sealed_subscription_is_not_taken_by_a_node_without_the_cluster_secret(
    etcd: EtcdClient,
) -> None:
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    sealed = (subscriptions_prefix(CLUSTER) + "s").encode()
    clear = (subscriptions_prefix(CLUSTER) + "c").encode()
    config = orjson.dumps({"topic": "t"})

    view.apply(KeyValue(sealed, SEALED + b"k1:whatever", 7, 7, 1))
    view.apply(KeyValue(clear, config, 8, 8, 1))

    assert view.subscriptions == {"c": config}
    assert view.subscription_ids == {"c": 8}


async def test_a_coordinator_key_older_than_the_one_held_changes_nothing(
    etcd: EtcdClient,
) -> None:
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    key = (coordinators_prefix(CLUSTER) + "s").encode()
    view.apply(KeyValue(key, b"n2", 3, 30, 1, lease=22))

    view.apply(KeyValue(key, b"n1", 3, 12, 1, lease=11))

    assert view.coordinators["s"].node == "n2" and view.coordinators["s"].lease == 22
    view.apply(KeyValue(key, b"", 3, 40, 1), deleted=True)
    assert "s" not in view.coordinators


async def test_a_watch_replaying_what_a_full_read_saw_changes_nothing(etcd: EtcdClient) -> None:
    """Issue 25, found by the nemesis (seed 105): a node reads the state afresh when its
    lease is new, while its watch goes on from where etcd last answered it — before a
    delete and re-creation of a topic the new read already holds. Replayed, the delete
    removed the new topic from the view for a moment; the node reconciled in that moment,
    deleted its copy of the new topic with 20 records acknowledged at acks=all, and led
    the re-created partition again from offset 0."""
    key = topic_key(CLUSTER, "t")
    await etcd.put(key, config_to_json(TopicConfig(partitions=1)))
    await etcd.put(partition_key(CLUSTER, "t", 0), state("n1", 1))
    before = await etcd.get(key)
    assert before is not None
    await etcd.delete(key)
    await etcd.delete(partition_key(CLUSTER, "t", 0))
    await etcd.put(key, config_to_json(TopicConfig(partitions=1)))
    await etcd.put(partition_key(CLUSTER, "t", 0), state("n2", 0))
    recreated = await etcd.get(key)
    assert recreated is not None
    views: list[tuple[int | None, str | None]] = []  # (topic id, leader) at each change

    def changed() -> None:
        known = view.states.get(("t", 0))
        views.append((view.topic_ids.get("t"), known.state.leader if known else None))

    view = MetadataView(etcd, CLUSTER, keys=None, changed=changed)
    await view.load()
    follow = asyncio.create_task(view.follow(before.mod_revision))  # from before the delete
    try:
        await etcd.put(topic_key(CLUSTER, "later"), config_to_json(TopicConfig(partitions=1)))

        async def replayed() -> bool:
            return "later" in view.topics

        await eventually(replayed, WAIT_S, "the watch past the replay")
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
    assert views and all(seen == (recreated.create_revision, "n2") for seen in views), views


class _ReadOvertaken:
    """The etcd client, except that a full read's answer arrives only after a change made
    once etcd answered it — and after the watch applied that change."""

    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self.meanwhile: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._etcd, name)

    async def range(self, key: str | bytes, **options: Any) -> RangeResult:
        result = await self._etcd.range(key, **options)
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        return result


async def test_a_full_read_keeps_what_the_watch_applied_while_it_was_answered(
    etcd: EtcdClient,
) -> None:
    """The flake of 2026-11-28: after an etcd outage every node of a partition's ISR
    registered anew, so the most up-to-date one takes it once each has reported its log
    ends (cluster/log_ends.py). n2 read the state afresh for its new lease; n3's report
    arrived through the watch while that read was on its way, and the read, answered
    before n3 wrote it, then erased it. n2 waited for n3's report for good, and the
    partition had no leader until the test gave up a minute later."""
    client = _ReadOvertaken(etcd)
    view = MetadataView(cast(EtcdClient, client), CLUSTER, keys=None, changed=lambda: None)
    await etcd.put(topic_key(CLUSTER, "t"), config_to_json(TopicConfig(partitions=1)))
    await etcd.put(partition_key(CLUSTER, "t", 0), state("n1", 1))
    revision = await view.load()
    follow = asyncio.create_task(view.follow(revision + 1))
    report = LogEnds("n3", 7, {("t", 0): (1, 20)})

    async def meanwhile() -> None:
        await etcd.put(log_ends_prefix(CLUSTER) + "n3", report.to_json())
        await etcd.put(partition_key(CLUSTER, "t", 0), state("n2", 2))

        async def applied() -> bool:
            known = view.states.get(("t", 0))
            return "n3" in view.log_ends and known is not None and known.state.epoch == 2

        await eventually(applied, WAIT_S, "the watch applying both changes")

    try:
        client.meanwhile = meanwhile
        await view.load()
        assert client.meanwhile is None  # the read was overtaken
        assert view.log_ends.get("n3") == report
        assert view.states[("t", 0)].state.leader == "n2"
        # The watch goes on from there: a later change is seen too.
        await etcd.delete(log_ends_prefix(CLUSTER) + "n3")

        async def deleted() -> bool:
            return "n3" not in view.log_ends

        await eventually(deleted, WAIT_S, "the report's delete")
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
