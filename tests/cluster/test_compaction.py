"""Issue 25, item 7: Herald compacts etcd's history (PROTOCOL §7, "etcd's history is kept
small"), against a real etcd: one node compacts, keeping ``keep_s`` of history, and a
watcher that fell behind past it is told so (and reads the state afresh)."""

from __future__ import annotations

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
