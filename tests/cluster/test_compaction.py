"""Issue 25, item 7: Herald compacts etcd's history (PROTOCOL §7, "etcd's history is kept
small"), against a real etcd: one node compacts, keeping ``keep_s`` of history, and a
watcher that fell behind past it is told so (and reads the state afresh)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.compaction import Compactor
from cluster.etcd import EtcdClient, EtcdError, WatchCompacted


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_history_older_than_keep_s_is_compacted_and_newer_history_kept(
    etcd: EtcdClient,
) -> None:
    clock = FakeClock()
    compactor = Compactor(etcd, is_compactor=lambda: True, probe_key="/p", keep_s=300, clock=clock)
    for k in range(5):
        await etcd.put("/herald/c/cursors/s", f"cursor {k}")
    assert await compactor.step() is None  # a first mark: nothing is old enough yet
    noted = compactor._marks[-1][1]
    clock.now += 299
    for k in range(5):
        await etcd.put("/herald/c/cursors/s", f"later {k}")
    assert await compactor.step() is None  # still under keep_s
    recent = compactor._marks[-1][1]
    clock.now += 1
    assert await compactor.step() == noted

    with pytest.raises(EtcdError, match="compacted"):
        await etcd.range("/herald/c/cursors/s", revision=noted - 1)
    kept = await etcd.range("/herald/c/cursors/s", revision=recent)
    assert kept.kvs[0].value == b"later 4"
    with pytest.raises(WatchCompacted):
        async with etcd.watch("/herald/c/", prefix=True, start_revision=2) as watch:
            async for _ in watch:
                break


async def test_only_the_compacting_node_compacts(etcd: EtcdClient) -> None:
    clock = FakeClock()
    idle = Compactor(etcd, is_compactor=lambda: False, probe_key="/p", keep_s=10, clock=clock)
    await etcd.put("/k", "v")
    await idle.step()
    clock.now += 10
    await etcd.put("/k", "w")
    assert await idle.step() is None
    first = await etcd.range("/k", revision=2)  # history still there
    assert first.kvs and first.kvs[0].value == b"v"


async def test_a_revision_someone_else_compacted_further_is_no_error(etcd: EtcdClient) -> None:
    clock = FakeClock()
    compactor = Compactor(etcd, is_compactor=lambda: True, probe_key="/p", keep_s=10, clock=clock)
    await etcd.put("/k", "v")
    await compactor.step()
    for k in range(3):
        await etcd.put("/k", str(k))
    latest = await etcd.put("/k", "last")
    await etcd.compact(latest)  # another node went further meanwhile
    clock.now += 10
    assert await compactor.step() is not None


@pytest.mark.timeout(240)
def test_a_cluster_compacts_its_own_history_while_it_works(tmp_path: Path) -> None:
    """Three real nodes keeping 2 s of history: etcd's old revisions go, and the nodes
    (their watches told of it) go on working."""
    from tests.cluster.nodes import HeraldCluster

    with HeraldCluster(tmp_path / "c", 3, extra_args=["--etcd-history-s", "2"]) as cluster:
        assert cluster.etcd is not None
        cluster.create_topic("orders", replication_factor=3, min_insync_replicas=2)

        async def compacted_past(revision: int) -> bool:
            assert cluster.etcd is not None
            async with EtcdClient(cluster.etcd.urls) as etcd:
                try:
                    await etcd.range("/herald/", prefix=True, revision=revision)
                except EtcdError as exc:
                    return "compacted" in exc.message
                return False

        cluster.wait_for(lambda: asyncio.run(compacted_past(2)), 60.0, "etcd compacted")
        answer = cluster.post(
            "n2", "/v1/topics/orders/messages", {"messages": [{"value": 1}]}, acks="all"
        )
        assert answer.status_code == 200, answer.text
        created = cluster.put("n3", "/v1/topics/later", None)
        assert created.status_code == 201, created.text
        cluster.create_topic("later")  # every node sees it, with leaders
