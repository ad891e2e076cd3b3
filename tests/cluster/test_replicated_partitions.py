"""storage.Partition in its replicated mode driven by the replication state machines
(cluster/replication.py, cluster/follower.py), on real directories and writer threads:
the ReplicationHooks of a leader implemented over LeaderReplica, followers copying
with append_batches, a change of leader truncating a diverged tail. The "network" is a
method call; etcd is left out (the ISR changes are stored at once)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.follower import Action, EpochAnswer, FetchResponse, FollowerReplica
from cluster.replication import LeaderReplica, Progress
from herald.protocol.errors import HeraldError
from storage.partition import Partition
from storage.record import Acks, NewRecord
from storage.writer import WriterPool


class NotEnoughReplicas(HeraldError):
    code, status, title = "not_enough_replicas", 503, "Service Unavailable"


class LeaderHooks:
    """ReplicationHooks over a LeaderReplica: the log listener feeds it the partition's
    ends, each Progress moves the high watermark and answers acks=all waiters."""

    def __init__(self, partition: Partition, replica: LeaderReplica) -> None:
        self.partition, self.replica = partition, replica
        self.epoch = replica.epoch
        self._waiting: dict[int, list[asyncio.Future[None]]] = {}
        self.unsubscribe = partition.add_log_listener(self._on_log)

    def _on_log(self, partition: Partition) -> None:
        self.apply(self.replica.on_append(partition.log_end_offset))
        self.apply(self.replica.on_flush(partition.fsynced_offset))

    def apply(self, progress: Progress) -> None:
        if progress.isr_change is not None:
            progress = self.replica.isr_stored(progress.isr_change.isr)  # "etcd" holds it
            self.apply(progress)
        self.partition.set_high_watermark(progress.high_watermark)
        for ends, error in ((progress.committed, None), (progress.refused, True)):
            for end in ends:
                future = self._waiting[end].pop(0)
                if not future.done():
                    if error:
                        future.set_exception(NotEnoughReplicas("the ISR shrank"))
                    else:
                        future.set_result(None)

    def check_append(self, acks: Acks) -> None:
        if self.replica.check_append(acks.value) is not None:
            raise NotEnoughReplicas("the ISR is below min_insync_replicas")

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:
        if acks is not Acks.ALL:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(end_offset, []).append(future)
        self.apply(self.replica.wait_commit(end_offset))
        await future


class FollowerHooks:
    """A follower refuses appends (the cluster layer forwards them to the leader)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def check_append(self, acks: Acks) -> None:
        raise NotEnoughReplicas("not the leader")

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:
        raise AssertionError("a follower never appends")


class Replicas:
    def __init__(self, partitions: dict[str, Partition]) -> None:
        self.partitions = partitions
        self.now = 0.0
        self.leader = ""
        self.hooks: LeaderHooks | None = None
        self.followers: dict[str, FollowerReplica] = {}

    def elect(self, leader: str, epoch: int, isr: tuple[str, ...], min_insync: int = 2) -> None:
        if self.hooks is not None:
            self.hooks.unsubscribe()
        self.leader = leader
        partition = self.partitions[leader]
        replica = LeaderReplica(
            leader,
            epoch=epoch,
            replicas=tuple(self.partitions),
            isr=isr,
            min_insync_replicas=min_insync,
            replica_lag_ms=10_000,
            clock=lambda: self.now,
            log_end=partition.log_end_offset,
            high_watermark=partition.high_watermark,
            fsynced_end=partition.fsynced_offset,
        )
        self.hooks = LeaderHooks(partition, replica)
        partition.replicate(self.hooks)
        self.followers = {}
        for name, other in self.partitions.items():
            if name != leader:
                other.replicate(FollowerHooks(epoch))
                self.followers[name] = FollowerReplica(
                    name,
                    topic="orders",
                    partition=0,
                    leader=leader,
                    epoch=epoch,
                    latest_epoch=other.latest_epoch,
                    log_start=other.log_start_offset,
                    log_end=other.log_end_offset,
                    high_watermark=other.high_watermark,
                    max_bytes=300,
                )

    async def step(self, name: str) -> None:
        """One exchange of follower ``name`` with the leader: the divergence check while
        truncating, else one fetch."""
        assert self.hooks is not None
        leader, follower = self.partitions[self.leader], self.partitions[name]
        state = self.followers[name]
        if state.phase == "truncating":
            query = state.epoch_query()
            epoch, end = leader.end_offset_for_epoch(query.epoch)
            answer = EpochAnswer(None, epoch, end, leader.log_start_offset)
            step = state.on_epoch_answer(answer, follower.end_offset_for_epoch)
            assert step.action is Action.TRUNCATE, step
            await follower.truncate_to(step.offset)
            state.truncated(follower.log_end_offset, follower.latest_epoch)
            return
        request = state.fetch_request(follower.fsynced_offset)
        decision = self.hooks.replica.on_fetch(
            name, request.epoch, request.fetch_offset, request.fsynced_offset
        )
        assert decision.error is None
        self.hooks.apply(decision.progress)
        batches = await leader.read_batches(request.fetch_offset, request.max_bytes)
        response = FetchResponse(
            None, batches, self.hooks.replica.high_watermark, leader.log_start_offset
        )
        step = state.on_fetch_response(response)
        assert step.action is Action.APPEND
        if step.batches:
            await follower.append_batches(step.batches)
        state.appended(follower.log_end_offset, follower.latest_epoch)
        follower.set_high_watermark(state.high_watermark)

    async def rounds(self, n: int) -> None:
        for _ in range(n):
            for name in self.followers:
                await self.step(name)


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    pool = WriterPool(2)
    partitions = {
        name: await Partition.open(tmp_path / name, "orders", 0, writers=pool)
        for name in ("a", "b", "c")
    }
    yield Replicas(partitions)
    for partition in partitions.values():
        await partition.close()
    await asyncio.to_thread(pool.close)


def batch(tag: str, n: int = 3) -> list[NewRecord]:
    return [NewRecord(f'"{tag}{i}"'.encode()) for i in range(n)]


async def test_acks_all_answers_once_the_isr_has_fsynced(replicas: Replicas) -> None:
    replicas.elect("a", 1, ("a", "b", "c"))
    leader = replicas.partitions["a"]
    publish = asyncio.create_task(leader.append(batch("x"), Acks.ALL))
    await asyncio.sleep(0.05)
    assert not publish.done() and leader.end_offset == 0  # nobody has copied it yet
    for _ in range(20):
        await replicas.rounds(1)
        if publish.done():
            break
    assert (await publish)[0] == 0
    assert leader.end_offset == 3
    await replicas.rounds(1)  # the followers learn the mark on their next fetch
    expected = await leader.read(0, 100, 1 << 20)
    for partition in replicas.partitions.values():
        assert await partition.read(0, 100, 1 << 20) == expected
        assert await partition.read_batches(0, 1 << 20) == await leader.read_batches(0, 1 << 20)

    with pytest.raises(NotEnoughReplicas):
        await replicas.partitions["b"].append(batch("y"), Acks.LEADER)  # a follower refuses


async def test_a_change_of_leader_truncates_the_old_leaders_tail(replicas: Replicas) -> None:
    replicas.elect("a", 1, ("a", "b", "c"))
    a, b, c = (replicas.partitions[n] for n in "abc")
    committed = asyncio.create_task(a.append(batch("x"), Acks.ALL))
    while not committed.done():
        await replicas.rounds(1)
    await committed
    await replicas.rounds(1)
    # Written by "a" at acks=1 and never copied: not visible anywhere.
    await a.append(batch("lost", 4), Acks.LEADER)
    assert (a.log_end_offset, a.end_offset) == (7, 3)

    # "b" leads epoch 2 and takes a write; "a" comes back as a follower.
    replicas.elect("b", 2, ("b", "c"))
    first, _ = await b.append(batch("y", 2), Acks.LEADER)
    assert first == 3 and b.latest_epoch == 2
    await replicas.rounds(4)
    assert a.log_end_offset == b.log_end_offset == c.log_end_offset == 5
    batches = await b.read_batches(0, 1 << 20)
    assert await a.read_batches(0, 1 << 20) == batches == await c.read_batches(0, 1 << 20)
    values = [r.value for r in await a.read(0, 100, 1 << 20)]
    assert b'"lost0"' not in values and values[-2:] == [b'"y0"', b'"y1"']
    assert a.end_offset == b.end_offset == 5
