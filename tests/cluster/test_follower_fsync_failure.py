"""Issue 25 item 9: a follower that writes but cannot fsync.

``acks=all`` is answered once every ISR member has fsynced the records (PROTOCOL §7). A
follower whose disk takes writes but fails every fsync went on fetching up to the
leader's log end, so it stayed in the ISR while its fsynced end stood still: every
acks=all publish to the partition hung, never answered. Now a follower counts as caught
up only by what it has fsynced: it leaves the ISR after ``replica_lag_ms`` and the
publish is answered over the ISR that remains (or 503 if that is below
``min_insync_replicas``), and it rejoins once its disk works again.

The failing disk is real: the follower's data directory is an ext4 file system on a loop
device whose backing file lives on a small tmpfs. Filling that tmpfs leaves ext4 free
space (writes land in the page cache and succeed) but makes every write-back, hence every
fsync, fail with ENOSPC — thin-provisioned storage running out. Needs root (mount).
"""

from __future__ import annotations

import asyncio
import base64

import httpx
import orjson
import pytest

from cluster.etcd import EtcdClient
from cluster.state import partition_key
from tests.cluster.nodes import HeraldCluster
from tests.failing_disk import FailingDisk, needs_failing_disk

pytestmark = needs_failing_disk

TOPIC = "durable"
FAULTY = "n3"  # the node whose data directory is n3_disk (tests/cluster/conftest.py)
ANSWER_WITHIN_S = 60.0  # far beyond replica_lag_ms: a publish not answered by then hangs
# Each record's value: a publish of several spans new blocks of the image (an append inside
# a block the backing file already holds would be written back, and fsynced, fine).
VALUE_BYTES = 200_000


async def _etcd_isr(cluster: HeraldCluster, partition: int) -> list[str]:
    """The partition's ISR as etcd holds it now (acks=all counts only on a stored ISR)."""
    assert cluster.etcd is not None
    async with EtcdClient(cluster.etcd.urls) as etcd:
        state = await etcd.get(partition_key(cluster.cluster_name, TOPIC, partition))
    assert state is not None, f"{TOPIC}/{partition} not in etcd"
    isr: list[str] = orjson.loads(state.value)["isr"]
    return isr


def publish(
    http: httpx.Client, cluster: HeraldCluster, node: str, partition: int, ids: list[str]
) -> httpx.Response:
    messages = [
        {
            "id": i,
            "value_b64": base64.b64encode(i.encode() * (VALUE_BYTES // len(i))).decode(),
            "partition": partition,
        }
        for i in ids
    ]
    url = f"{cluster.nodes[node].url}/v1/topics/{TOPIC}/messages"
    return http.post(url, json={"messages": messages}, params={"acks": "all"})


def test_a_follower_that_cannot_fsync_leaves_the_isr_and_acks_all_is_answered(
    cluster_n3_on_disk: HeraldCluster, n3_disk: FailingDisk
) -> None:
    cluster, failing_disk = cluster_n3_on_disk, n3_disk  # n3's data directory on the disk
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3, min_insync_replicas=2)
    states = cluster.topic(TOPIC)["partitions"]
    # A partition the faulty node follows (leaders are spread: two of three qualify).
    state = next(s for s in states if s["leader"] != FAULTY and FAULTY in s["isr"])
    partition, leader = state["partition"], state["leader"]

    with httpx.Client(timeout=ANSWER_WITHIN_S) as http:
        healthy = publish(http, cluster, leader, partition, ["before-0", "before-1"])
        assert healthy.status_code == 200, healthy.text

        failing_disk.fail_fsyncs()
        try:
            answer = publish(http, cluster, leader, partition, [f"during-{k}" for k in range(10)])
        except httpx.TimeoutException:
            pytest.fail(f"acks=all not answered within {ANSWER_WITHIN_S} s: it hangs")
        # Two of three fsync: answered 200 over the remaining ISR (a 503 would be
        # allowed too if the ISR had fallen below min_insync_replicas; it has not).
        assert answer.status_code == 200, answer.text
        # etcd's ISR, not GET /v1/topics: a node shows the ISR as its watch of etcd has
        # seen it, which may still lag the shrink the leader stored before it answered
        # (a whole-suite loop of 2026-11-27 read ['n1', 'n2', 'n3'] that way).
        isr = asyncio.run(_etcd_isr(cluster, partition))
        assert FAULTY not in isr, f"acknowledged with {FAULTY} (no fsync) in the ISR {isr}"

        failing_disk.heal()
        cluster.wait_isr(TOPIC, partition, cluster.nodes, within=60.0)
        after = publish(http, cluster, leader, partition, ["after-0"])
        assert after.status_code == 200, after.text


def test_a_topic_deleted_while_a_node_cannot_fsync_is_gone_there_and_created_again(
    cluster_n3_on_disk: HeraldCluster, n3_disk: FailingDisk
) -> None:
    """The nemesis (seed 2807) deleted a topic while a node's disk failed its fsyncs: the
    close's fsync raised, though the storage had removed the topic's files all the same,
    and the node logged a traceback and left its bookkeeping of the topic half done. Now
    the deletion counts as done when the topic is gone from the storage."""
    cluster, failing_disk = cluster_n3_on_disk, n3_disk
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3, min_insync_replicas=1)
    states = cluster.topic(TOPIC)["partitions"]
    # The partition the faulty node leads (leaders are spread: each node leads one).
    partition = next(s["partition"] for s in states if s["leader"] == FAULTY)
    with httpx.Client(timeout=ANSWER_WITHIN_S) as http:
        failing_disk.fail_fsyncs()
        try:
            # acks=1: on the leader's disk only in its page cache, which cannot write back
            # (a megabyte: new blocks of the image, not ones the backing file holds).
            value = base64.b64encode(b"x" * VALUE_BYTES).decode()
            answer = http.post(
                f"{cluster.nodes[FAULTY].url}/v1/topics/{TOPIC}/messages",
                json={"messages": [{"value_b64": value, "partition": partition}] * 5},
                params={"acks": "1"},
            )
            assert answer.status_code == 200, answer.text
            gone = http.delete(f"{cluster.nodes[FAULTY].url}/v1/topics/{TOPIC}")
            assert gone.status_code == 204, gone.text
            cluster.wait_for(
                lambda: cluster.get(FAULTY, f"/v1/topics/{TOPIC}").status_code == 404,
                30.0,
                f"the topic gone on {FAULTY}",
            )
        finally:
            failing_disk.heal()
        # Mostly the close's own fsync fails ("deleted here, its close failing" in the
        # log); when the periodic flush met the error first, the close does not: either
        # way the deletion is done, not "failed" and tried again.
        assert f"deleting topic {TOPIC} here failed" not in cluster.nodes[FAULTY].log()
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        leader = cluster.leader(TOPIC).node_id
        again = publish(http, cluster, leader, 0, ["again"])
        assert again.status_code == 200, again.text
        shown = cluster.get(FAULTY, f"/v1/topics/{TOPIC}/partitions/0/messages", offset=0)
        assert shown.status_code == 200, shown.text
        assert [m["id"] for m in shown.json()["messages"]] == ["0-0"]
