"""A 3-member etcd on loopback: one member freezes, the client goes on with the others."""

from __future__ import annotations

import asyncio
import time

from cluster.etcd import Compare, EtcdClient, EtcdOutcomeUnknown, Put
from tests.cluster.conftest import EtcdProcess

WAIT_S = 20.0


def endpoints(members: list[EtcdProcess]) -> list[str]:
    return [m.urls[0] for m in members]


async def put_through(etcd: EtcdClient, key: str, value: str) -> int:
    """A put while a member is frozen: if it was the raft leader, writes in flight during
    the election time out on etcd's side ("request timed out"), outcome unknown. The
    value is the same each time, so putting again is harmless."""
    for _attempt in range(5):
        try:
            return await etcd.put(key, value)
        except EtcdOutcomeUnknown:
            continue
    raise AssertionError(f"no put of {key} went through")


async def test_reads_and_writes_go_on_when_the_member_in_use_freezes(
    etcd_cluster: list[EtcdProcess],
) -> None:
    async with EtcdClient(endpoints(etcd_cluster), timeout=WAIT_S, attempt_timeout=3.0) as etcd:
        await etcd.put("/c/k", "before")
        assert etcd.current_endpoint == etcd_cluster[0].urls[0]
        etcd_cluster[0].pause()
        try:
            started = time.monotonic()
            kv = await etcd.get("/c/k")  # the frozen member times out; another answers
            assert kv is not None and kv.value == b"before"
            assert time.monotonic() - started < WAIT_S
            assert etcd.current_endpoint != etcd_cluster[0].urls[0]
            await put_through(etcd, "/c/k", "during")
        finally:
            etcd_cluster[0].resume()
        kv = await etcd.get("/c/k")
        assert kv is not None and kv.value == b"during"


async def test_a_conditional_write_lost_in_a_frozen_member_cannot_land_over_a_later_one(
    etcd_cluster: list[EtcdProcess],
) -> None:
    async with EtcdClient(endpoints(etcd_cluster), timeout=WAIT_S, attempt_timeout=3.0) as etcd:
        read = await etcd.put("/c/k", "1")
        etcd_cluster[0].pause()
        try:
            try:
                await etcd.txn([Compare.mod_revision("/c/k", "=", read)], [Put.of("/c/k", "2")])
            except EtcdOutcomeUnknown:
                pass  # it sits in the frozen member's socket: it may still be applied
            else:
                raise AssertionError("a frozen member answered")
            assert etcd.current_endpoint != etcd_cluster[0].urls[0]  # the next call goes on
            later = await put_through(etcd, "/c/k", "3")
        finally:
            etcd_cluster[0].resume()
        await etcd.put("/c/other", "x")  # the resumed member has caught up past it by now
        # Were the lost write applied after all, its compare failed: the key changed.
        kv = await etcd.get("/c/k")
        assert kv is not None and kv.value == b"3" and kv.mod_revision == later


async def test_a_watch_moves_to_another_member_without_losing_or_repeating_events(
    etcd_cluster: list[EtcdProcess],
) -> None:
    others = endpoints(etcd_cluster[1:])
    async with (
        EtcdClient(endpoints(etcd_cluster), timeout=WAIT_S, attempt_timeout=3.0) as etcd,
        EtcdClient(others, timeout=WAIT_S, attempt_timeout=3.0) as writer,
        etcd.watch("/c/", prefix=True, idle_probe_s=0.5) as watch,
    ):
        start = await writer.put("/c/0", "0")
        async with asyncio.timeout(WAIT_S):
            assert (await anext(watch)).revision == start
        etcd_cluster[0].pause()  # the member the watch streams from
        try:
            for i in range(1, 4):
                await put_through(writer, f"/c/{i}", str(i))
            async with asyncio.timeout(WAIT_S):
                seen = [await anext(watch) for _ in range(3)]
        finally:
            etcd_cluster[0].resume()
        end = await writer.put("/c/end", "")
        async with asyncio.timeout(WAIT_S):
            while seen[-1].revision < end:
                seen.append(await anext(watch))
        # What it delivered is exactly etcd's history of the prefix, as a fresh watch
        # replays it: nothing lost, nothing twice, in order.
        async with writer.watch("/c/", prefix=True, start_revision=start + 1) as replay:
            async with asyncio.timeout(WAIT_S):
                history = [await anext(replay) for _ in seen]
        assert seen == history
        assert [e.kv.key for e in seen][-1] == b"/c/end"
        assert {b"/c/1", b"/c/2", b"/c/3"} <= {e.kv.key for e in seen}
