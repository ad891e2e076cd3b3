"""Issue 25 item 9: a new leader answering a duplicate id at acks=all.

A duplicate (a message id already published) is answered with the original's offset; at
``acks=all`` only once that offset is committed — on every ISR member's disk (PROTOCOL
§7). A new leader knows the commit point only as its last fetch response told it; it is
established once the ISR of the new epoch has fetched (Raft: a leader commits nothing of
earlier terms before an entry of its own; Kafka: the leader epoch start offset). Before,
a new leader answered such a duplicate 200 at once from its inherited mark while an ISR
member had not confirmed anything in the new epoch.

Real processes: three nodes, the leader killed, one follower frozen (SIGSTOP) inside a
long lease so it stays in the ISR, a duplicate sent to the new leader.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from cluster.etcd import EtcdClient
from cluster.membership import node_key
from cluster.state import partition_key
from tests.cluster.nodes import HeraldCluster

TOPIC = "dups"
FROZEN_TTL_MS = 60_000  # the frozen follower keeps its lease (and its ISR place) meanwhile
NOT_BEFORE_S = 3.0  # how long the duplicate is watched while the follower is frozen


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[HeraldCluster]:
    # replica_lag_ms long: the frozen follower stays in the ISR for the whole test (it is
    # not the lag rule that is tested here).
    with HeraldCluster(tmp_path / "cluster", 3, replica_lag_ms=120_000) as cluster:
        yield cluster


async def _back_in_the_isr(cluster: HeraldCluster, node: str) -> bool:
    """Whether etcd's ISR of the partition holds ``node`` as the incarnation it is now.
    GET /v1/topics may still list the incarnation before a restart: the leader drops
    the new one from the ISR only when it first fetches, and takes it back once caught
    up (issue 25 item 2)."""
    assert cluster.etcd is not None
    async with EtcdClient(cluster.etcd.urls) as etcd:
        registered = await etcd.get(node_key(cluster.cluster_name, node))
        state = await etcd.get(partition_key(cluster.cluster_name, TOPIC, 0))
    if registered is None or state is None:
        return False
    value = orjson.loads(state.value)
    incarnation = value.get("incarnations", {}).get(node)
    return node in value.get("isr", []) and incarnation == registered.create_revision


def message(message_id: str) -> dict[str, object]:
    value = base64.b64encode(message_id.encode()).decode()
    return {"id": message_id, "value_b64": value, "partition": 0}


def test_a_new_leader_answers_a_duplicate_at_acks_all_only_once_its_isr_confirmed(
    cluster: HeraldCluster,
) -> None:
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3, min_insync_replicas=2)
    # One follower gets a long lease: restarted with it, then back in the ISR.
    frozen = cluster.followers(TOPIC)[0].node_id
    cluster.nodes[frozen].node_ttl_ms = FROZEN_TTL_MS
    cluster.restart(frozen)
    cluster.wait_for(
        lambda: asyncio.run(_back_in_the_isr(cluster, frozen)),
        60.0,
        f"{frozen} back in the ISR as its new incarnation",
    )
    cluster.wait_isr(TOPIC, 0, cluster.nodes, within=60.0)
    old_leader = cluster.leader(TOPIC).node_id

    body = {"messages": [message("original")]}
    first = cluster.post(old_leader, f"/v1/topics/{TOPIC}/messages", body, acks="all")
    assert first.status_code == 200, first.text
    offset = first.json()["results"][0]["offset"]

    cluster.pause(frozen)
    cluster.kill(old_leader)
    state = cluster.wait_leader(TOPIC, not_on=[old_leader], within=60.0)
    new_leader = state["leader"]
    assert new_leader != frozen and frozen in state["isr"]

    url = f"{cluster.nodes[new_leader].url}/v1/topics/{TOPIC}/messages"
    with httpx.Client(timeout=120.0) as http, ThreadPoolExecutor(1) as pool:
        answer: Future[httpx.Response] = pool.submit(
            http.post, url, json=body, params={"acks": "all"}
        )
        # The frozen ISR member has fetched nothing in this epoch: the new leader cannot
        # know the original is on its disk, so it does not answer 200 yet.
        deadline = time.monotonic() + NOT_BEFORE_S
        while time.monotonic() < deadline and not answer.done():
            time.sleep(0.1)
        if answer.done():
            early = answer.result()
            assert early.status_code != 200, f"answered from the inherited mark: {early.text}"
        cluster.resume(frozen)
        got = answer.result(timeout=120.0)
    if got.status_code != 200:  # a 503 while the follower was frozen: retrying is safe
        got = cluster.post(new_leader, f"/v1/topics/{TOPIC}/messages", body, acks="all")
    assert got.status_code == 200, got.text
    result = got.json()["results"][0]
    assert result["duplicate"] is True and result["offset"] == offset
