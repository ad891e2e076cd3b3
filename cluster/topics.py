"""Topic configs in etcd (PROTOCOL §7: etcd is the truth in cluster mode) and where each
partition's replicas go.

``/herald/<cluster>/topics/<name>`` holds the topic's config (TopicConfig as JSON, with
``replication_factor`` and ``min_insync_replicas``, and ``"auto_created": true`` when a
publish or a subscription made it: docs/protocol.md "Auto-created topics"); each partition's state is at
``/herald/<cluster>/partitions/<name>/<n>`` (cluster/state.py). A topic is created by
writing its partitions' states first, then its config key, each write guarded by "not
there yet": readers act on partitions only once the topic's key exists, so a creation
cut short by a crash leaves nothing anyone acts on, and the next creation of the name
finds the key absent and proceeds (overwriting stale partition keys is allowed then).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from cluster.etcd import Compare, Delete, EtcdClient, Get, Put, RangeResult
from cluster.state import MAX_TXN_OPS, PartitionState, partition_key
from herald.protocol.errors import LimitExceeded
from storage.config import TopicConfig


def cluster_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/"


def topics_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/topics/"


def topic_key(cluster: str, name: str) -> str:
    return topics_prefix(cluster) + name


def partitions_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/partitions/"


def topic_partitions_prefix(cluster: str, name: str) -> str:
    return f"{partitions_prefix(cluster)}{name}/"


def config_to_json(config: TopicConfig, *, auto_created: bool = False) -> bytes:
    body = config.to_dict()
    if auto_created:  # written only when true: a key from before the mark reads false
        body["auto_created"] = True
    return orjson.dumps(body)


def config_from_json(data: bytes) -> TopicConfig | None:
    """The config, or None for bytes that are not one (logged by the caller)."""
    try:
        raw = orjson.loads(data)
        return TopicConfig.from_dict(raw) if isinstance(raw, dict) else None
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None


def auto_created_from_json(data: bytes) -> bool:
    """The mark of a topic config that :func:`config_from_json` read."""
    raw = orjson.loads(data)
    return isinstance(raw, dict) and raw.get("auto_created") is True


def assign_replicas(
    name: str,
    partitions: int,
    replication_factor: int,
    nodes: Sequence[str],
    leads: Mapping[str, int],
) -> list[tuple[str, ...]]:
    """Each partition's replicas, its first leader first: leaders spread evenly (each
    partition led by the node leading fewest so far, counting ``leads``, the partitions
    each node leads already), followers the nodes after the leader in a ring, so that
    each node follows about as many partitions as it leads."""
    if not 1 <= replication_factor <= len(nodes):
        raise ValueError(f"replication_factor {replication_factor} with {len(nodes)} node(s)")
    ring = sorted(nodes)
    # Ties go round the ring from a point that depends on the name, so that topics of
    # one partition each do not all start on the first node.
    start = zlib.crc32(name.encode()) % len(ring)
    order = ring[start:] + ring[:start]
    counts = {node: leads.get(node, 0) for node in ring}
    placement: list[tuple[str, ...]] = []
    for _ in range(partitions):
        leader = min(order, key=lambda node: counts[node])
        counts[leader] += 1
        at = ring.index(leader)
        placement.append(tuple(ring[(at + i) % len(ring)] for i in range(replication_factor)))
        order = order[1:] + order[:1]
    return placement


@dataclass(frozen=True, slots=True)
class Created:
    created: bool
    config: TopicConfig  # the topic's config in etcd (the existing one if not created)


async def check_topic_room(etcd: EtcdClient, cluster: str, name: str, max_topics: int) -> None:
    """LimitExceeded when ``name`` is not a topic and etcd holds ``max_topics`` already."""
    counted = await etcd.range(topics_prefix(cluster), prefix=True, count_only=True)
    if counted.count >= max_topics and await etcd.get(topic_key(cluster, name)) is None:
        raise LimitExceeded(
            f"the cluster holds its maximum of {max_topics} topics (--max-topics)",
            max_topics=max_topics,
        )


async def create_topic(
    etcd: EtcdClient,
    cluster: str,
    name: str,
    config: TopicConfig,
    replicas: Sequence[tuple[str, ...]],
    incarnations: Mapping[str, int] | None = None,
    *,
    auto_created: bool = False,
) -> Created:
    """Write the partitions' first states, then the topic's key, unless it exists.
    ``incarnations`` are the live nodes' (cluster/state.py): each replica holds its first
    part under the incarnation it had when the topic was created. ``auto_created`` is
    the creating node's word that a publish or a subscription made it."""
    key = topic_key(cluster, name)
    absent = Compare.version(key, "=", 0)
    known = incarnations or {}
    states = [
        Put.of(
            partition_key(cluster, name, n),
            PartitionState(
                r, r[0], 0, r, {node: known[node] for node in r if node in known}
            ).to_json(),
        )
        for n, r in enumerate(replicas)
    ]
    chunk = MAX_TXN_OPS - 1
    for first in range(0, len(states), chunk):
        result = await etcd.txn([absent], states[first : first + chunk], [Get.of(key)])
        if not result.succeeded:
            return _existing(result.results[0], config)
    result = await etcd.txn(
        [absent], [Put.of(key, config_to_json(config, auto_created=auto_created))], [Get.of(key)]
    )
    if result.succeeded:
        return Created(True, config)
    return _existing(result.results[0], config)


def _existing(found: object, wanted: TopicConfig) -> Created:
    assert isinstance(found, RangeResult)
    existing = config_from_json(found.kvs[0].value) if found.kvs else None
    return Created(False, existing or wanted)


async def delete_topic(etcd: EtcdClient, cluster: str, name: str) -> bool:
    """Delete the topic's key and its partitions' states; False if it did not exist."""
    key = topic_key(cluster, name)
    result = await etcd.txn(
        [Compare.version(key, ">", 0)],
        [Delete.of(key), Delete.of(topic_partitions_prefix(cluster, name), prefix=True)],
    )
    return result.succeeded
