"""Issue 25 item 7: a cluster on an etcd with a small space quota keeps working.

etcd keeps every revision of every key until its history is compacted; its database may
not grow past ``--quota-backend-bytes`` (2 GiB by default), and once it would, etcd
raises its NOSPACE alarm and refuses every write — no registration, no failover, no
topic — until an operator compacts, defragments and disarms. Cursor writes alone (one
every 0.3 s per delivering subscription) fill the default quota in hours to days.

Here etcd gets a 16 MiB quota and the nodes keep 1 s of history (``--etcd-history-s``).
While a subscription is consumed and acked steadily (its cursor written to etcd), the
test writes twice the quota's worth of revisions to etcd at a steady pace
(real cursor writes are a few hundred bytes each: filling 16 MiB with them alone would
take hours). Without compaction etcd would refuse writes within seconds; with it, every
write succeeds, etcd's database stays under the quota, and afterwards the cluster still
creates topics and elects a new leader when one dies. Giving the freed space back to the
disk (defragmentation) is an operator's task: docs/protocol.md, "etcd's history".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from cluster.etcd import EtcdClient
from tests.cluster.conftest import EtcdProcess
from tests.cluster.nodes import HeraldCluster

QUOTA_BYTES = 16 << 20
HISTORY_S = 1
QUOTAS_WRITTEN = 2  # the writes go on until this many quotas' worth went to etcd...
DRIVE_CAP_S = 200.0  # ... or this long (a loaded machine), and the test fails
VALUE_BYTES = 256 << 10  # one filler revision
BYTES_PER_S = 1 << 20  # at most: HISTORY_S of it is far under the quota


class QuotaEtcd(EtcdProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--quota-backend-bytes", str(QUOTA_BYTES)]


class QuotaCluster(HeraldCluster):
    def _start_etcd(self) -> EtcdProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        return QuotaEtcd(self.root / "etcd").start()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[HeraldCluster]:
    # The default node TTL (5 s), not the fault tests' 2 s: etcd busy writing and a loaded
    # host can delay a keepalive past 2 s, and a lease lost is not what is tested here.
    cluster = QuotaCluster(
        tmp_path / "cluster",
        3,
        node_ttl_ms=5000,
        extra_args=["--etcd-history-s", str(HISTORY_S)],
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def _status(etcd_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        answer = await http.post(f"{etcd_url}/v3/maintenance/status", content=b"{}")
        body: dict[str, Any] = orjson.loads(answer.content)
        return body


async def _drive(cluster: HeraldCluster) -> tuple[int, int, int]:
    """Publish, pull and ack, and write filler revisions, until QUOTAS_WRITTEN quotas'
    worth are written; returns (filler bytes written, records acked, etcd's largest
    database size seen)."""
    assert cluster.etcd is not None
    urls = [node.url for node in cluster.nodes.values()]
    started = time.monotonic()
    give_up_at = started + DRIVE_CAP_S
    done = asyncio.Event()
    acked = 0
    written = 0
    largest_db = 0

    async def publisher(http: httpx.AsyncClient) -> None:
        sequence = 0
        while not done.is_set():
            messages = [{"value": {"n": sequence + k}} for k in range(20)]
            sequence += 20
            # Only there to give the subscription something to ack: a publish refused now
            # and then (a node's lease renewal slowed by the load) changes nothing.
            with contextlib.suppress(httpx.TransportError):
                await http.post(
                    f"{urls[sequence % 3]}/v1/topics/orders/messages",
                    json={"messages": messages},
                    params={"acks": "1"},
                )
            await asyncio.sleep(0.1)

    async def consumer(http: httpx.AsyncClient) -> None:
        nonlocal acked
        turn = 0
        while not done.is_set():
            turn += 1
            url = urls[turn % 3]
            try:
                pulled = await http.post(
                    f"{url}/v1/subscriptions/billing/pull",
                    json={"max_messages": 100, "wait_ms": 200},
                )
                ids = [m["id"] for m in pulled.json()["messages"]] if pulled.is_success else []
                if ids:
                    answer = await http.post(
                        f"{url}/v1/subscriptions/billing/ack", json={"ids": ids}
                    )
                    if answer.is_success:
                        acked += len(answer.json()["ok"])
            except httpx.TransportError:
                await asyncio.sleep(0.2)

    async def filler(etcd: EtcdClient) -> None:
        nonlocal written, largest_db
        value = b"x" * VALUE_BYTES
        k = 0
        try:
            while written < QUOTAS_WRITTEN * QUOTA_BYTES and time.monotonic() < give_up_at:
                # Refused once etcd's database would pass the quota ("database space
                # exceeded"): the test fails here.
                await etcd.put(f"/filler/{k % 8}", value)
                written += VALUE_BYTES
                k += 1
                if k % 16 == 0:
                    assert cluster.etcd is not None
                    size = int((await _status(cluster.etcd.urls[0])).get("dbSize", 0))
                    largest_db = max(largest_db, size)
                await asyncio.sleep(max(0.0, started + written / BYTES_PER_S - time.monotonic()))
        finally:
            done.set()

    async with (
        httpx.AsyncClient(timeout=30.0) as http,
        EtcdClient(cluster.etcd.urls) as etcd,
        asyncio.TaskGroup() as tasks,
    ):
        tasks.create_task(publisher(http))
        tasks.create_task(consumer(http))
        tasks.create_task(filler(etcd))
    return written, acked, largest_db


@pytest.mark.timeout(300)
def test_a_cluster_on_a_small_etcd_quota_keeps_electing_and_creating(
    cluster: HeraldCluster,
) -> None:
    cluster.create_topic("orders", partitions=3, replication_factor=3, min_insync_replicas=2)
    created = cluster.put("n2", "/v1/subscriptions/billing", {"topic": "orders"})
    assert created.status_code == 201, created.text

    written, acked, largest_db = asyncio.run(_drive(cluster))
    print(
        f"wrote {written / (1 << 20):.1f} MiB of revisions ({written / QUOTA_BYTES:.1f} quotas) "
        f"; {acked} records acked; etcd's database at most "
        f"{largest_db / (1 << 20):.1f} MiB of a {QUOTA_BYTES >> 20} MiB quota"
    )
    assert written >= QUOTAS_WRITTEN * QUOTA_BYTES
    assert acked > 0  # the cursor was written all along
    assert largest_db < QUOTA_BYTES

    # etcd still takes writes: every node is registered, a new topic is created, with
    # leaders on every node...
    cluster.wait_live(3, within=60.0)
    cluster.create_topic("later", partitions=1, replication_factor=3)
    # ... and a leader that dies is replaced.
    leader = cluster.leader("later").node_id
    cluster.kill(leader)
    state = cluster.wait_leader("later", not_on=[leader], within=60.0)
    assert state["leader"] != leader
