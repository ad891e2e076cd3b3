"""Watches on a real etcd: order, history, resume, compaction, a restarted etcd."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from cluster.etcd import Compare, EtcdClient, Put, WatchCompacted
from cluster.etcd_watch import EventType, Watch, WatchEvent
from tests.cluster.conftest import EtcdProcess

WAIT_S = 15.0


async def take(watch: Watch, n: int) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async with asyncio.timeout(WAIT_S):
        while len(events) < n:
            events.append(await anext(watch))
    return events


def summary(events: list[WatchEvent]) -> list[tuple[str, bytes, bytes]]:
    return [(e.type.value, e.kv.key, e.kv.value) for e in events]


async def test_watch_sees_puts_and_deletes_under_the_prefix_in_order(etcd: EtcdClient) -> None:
    async with etcd.watch("/w/", prefix=True) as watch:
        first = await etcd.put("/w/a", "1")
        await etcd.put("/elsewhere", "x")
        await etcd.put("/w/b", "2")
        await etcd.delete("/w/a")
        await etcd.put("/w/b", "3")
        events = await take(watch, 4)
    assert summary(events) == [
        ("PUT", b"/w/a", b"1"),
        ("PUT", b"/w/b", b"2"),
        ("DELETE", b"/w/a", b""),
        ("PUT", b"/w/b", b"3"),
    ]
    revisions = [e.revision for e in events]
    assert revisions == sorted(revisions) and revisions[0] == first
    assert events[3].kv.version == 2


async def test_a_watch_from_a_past_revision_replays_the_history(etcd: EtcdClient) -> None:
    start = await etcd.put("/w/k", "1")
    await etcd.put("/w/k", "2")
    await etcd.delete("/w/k")
    async with etcd.watch("/w/k", start_revision=start) as watch:
        events = await take(watch, 3)
    assert summary(events) == [
        ("PUT", b"/w/k", b"1"),
        ("PUT", b"/w/k", b"2"),
        ("DELETE", b"/w/k", b""),
    ]


async def test_a_new_watch_from_next_revision_continues_exactly_after_the_last_event(
    etcd: EtcdClient,
) -> None:
    async with etcd.watch("/w/", prefix=True) as watch:
        assert watch.next_revision > 0  # "from now" is named by etcd
        for i in range(3):
            await etcd.put(f"/w/{i}", str(i))
        events = await take(watch, 2)
        resume = watch.next_revision
    assert resume == events[-1].revision + 1
    await etcd.put("/w/3", "3")
    async with etcd.watch("/w/", prefix=True, start_revision=resume) as watch:
        rest = await take(watch, 2)
    assert [e.kv.key for e in events + rest] == [b"/w/0", b"/w/1", b"/w/2", b"/w/3"]


async def test_events_of_one_transaction_share_a_revision_and_resume_includes_them(
    etcd: EtcdClient,
) -> None:
    async with etcd.watch("/w/", prefix=True) as watch:
        txn = await etcd.txn(
            [Compare.version("/w/x", "=", 0)], [Put.of("/w/x", "1"), Put.of("/w/y", "2")]
        )
        (first,) = await take(watch, 1)
        assert first.revision == txn.revision
        assert watch.next_revision == txn.revision  # the second event of it is still unread
        (second,) = await take(watch, 1)
        assert second.revision == txn.revision and watch.next_revision == txn.revision + 1


async def test_a_watch_from_a_compacted_revision_raises_watch_compacted(etcd: EtcdClient) -> None:
    start = await etcd.put("/w/k", "1")
    latest = await etcd.put("/w/k", "2")
    await etcd.compact(latest)
    with pytest.raises(WatchCompacted) as compacted:
        async with etcd.watch("/w/k", start_revision=start) as watch:
            await take(watch, 1)
    assert compacted.value.compact_revision == latest


async def test_a_watch_goes_on_across_an_etcd_restart_without_loss_or_repeat(
    etcd_server: EtcdProcess,
) -> None:
    # A budget that outlasts the restart: the watch reconnects instead of giving up.
    etcd = EtcdClient(etcd_server.urls, timeout=WAIT_S, attempt_timeout=1.0)
    async with etcd, etcd.watch("/w/", prefix=True) as watch:
        await etcd.put("/w/before", "1")
        assert summary(await take(watch, 1)) == [("PUT", b"/w/before", b"1")]
        etcd_server.kill()
        await asyncio.to_thread(etcd_server.start)
        await etcd.put("/w/after", "2")
        await etcd.delete("/w/before")
        events = await take(watch, 2)
    assert summary(events) == [("PUT", b"/w/after", b"2"), ("DELETE", b"/w/before", b"")]


async def test_events_carry_their_type_and_revisions(etcd: EtcdClient) -> None:
    async with etcd.watch("/w/t") as watch:
        created = await etcd.put("/w/t", "v")
        (event,) = await take(watch, 1)
    assert event.type is EventType.PUT
    assert event.kv.create_revision == event.kv.mod_revision == created


async def test_many_open_watches_do_not_starve_calls(etcd: EtcdClient) -> None:
    # Each watch holds an HTTP connection for as long as it is open: more of them than
    # any one connection pool holds.
    async with contextlib.AsyncExitStack() as stack:
        watches = [await stack.enter_async_context(etcd.watch(f"/many/{i}")) for i in range(70)]
        started = time.monotonic()
        revision = await etcd.put("/many/7", "x")
        assert time.monotonic() - started < WAIT_S
        (event,) = await take(watches[7], 1)
        assert event.revision == revision
