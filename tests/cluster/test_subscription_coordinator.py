"""The subscription coordinator (cluster/subscription_coordinator.py) of one registered
node on a real etcd: it claims what it should run, hands it to its host, replicates the
cursors of what it runs — never one of a subscription deleted and created since."""

from __future__ import annotations

import asyncio
import errno

import orjson

from cluster.coordination import (
    CLAIM_PAUSE_S,
    coordinators_prefix,
    cursors_prefix,
    subscriptions_prefix,
)
from cluster.etcd import EtcdClient
from cluster.membership import Membership
from cluster.metadata import MetadataView
from cluster.subscription_coordinator import SubscriptionCoordinator
from tests.cluster.conftest import fence_alone

CLUSTER = "subs"
CONFIG = orjson.dumps({"topic": "t", "start": "earliest"})


class Host:
    """Runs subscriptions the way the delivery engine does, as far as the node can see."""

    def __init__(self) -> None:
        self.runtimes: dict[str, bytes | None] = {}  # name -> the cursor it started from
        self.ended: list[tuple[str, str]] = []

    def running(self) -> set[str]:
        return set(self.runtimes)

    async def adopt(self, name: str, config: bytes, cursor: bytes | None) -> None:
        self.runtimes[name] = cursor

    async def release(self, name: str) -> None:
        self.runtimes.pop(name, None)
        self.ended.append((name, "released"))

    async def deleted(self, name: str) -> None:
        self.runtimes.pop(name, None)
        self.ended.append((name, "deleted"))


async def coordinator(
    etcd: EtcdClient, membership: Membership, host: Host | None = None, **tuning: float
) -> tuple[SubscriptionCoordinator, MetadataView, Host]:
    """Node n1's coordinator over ``host`` (a plain Host if none); ``tuning``: its
    keyword bounds (give_up_after_s, shun_s)."""
    view = MetadataView(etcd, CLUSTER, keys=None, changed=lambda: None)
    fence = fence_alone(membership)
    subscriptions = SubscriptionCoordinator(
        etcd,
        CLUSTER,
        "n1",
        membership,
        view,
        fence,
        caught_up=lambda topic: True,
        changed=lambda: None,
        **tuning,
    )
    subscriptions.host = host = host or Host()
    return subscriptions, view, host


async def run_here(
    subscriptions: SubscriptionCoordinator, view: MetadataView, membership: Membership
) -> None:
    """Create subscription "s" and reconcile until this node runs it: one pass claims
    it, the next (its view told of the claim) runs it."""
    assert await subscriptions.create("s", CONFIG)
    await view.load()
    await subscriptions.reconcile(membership.members)  # claims it
    await view.load()
    await subscriptions.reconcile(membership.members)  # runs it


async def test_a_new_subscription_is_claimed_under_the_lease_and_run_from_no_cursor(
    etcd: EtcdClient, membership: Membership
) -> None:
    subscriptions, view, host = await coordinator(etcd, membership)
    await run_here(subscriptions, view, membership)

    claimed = await etcd.get(coordinators_prefix(CLUSTER) + "s")
    assert claimed is not None
    assert (claimed.value, claimed.lease) == (b"n1", membership.lease_id)
    assert subscriptions.coordinates("s")
    assert host.runtimes == {"s": None}


async def test_a_saved_cursor_reaches_etcd_while_this_node_coordinates(
    etcd: EtcdClient, membership: Membership
) -> None:
    subscriptions, view, _host = await coordinator(etcd, membership)
    await run_here(subscriptions, view, membership)

    subscriptions.cursor_saved("s", b"cursor-1")
    await subscriptions.flush_cursors()

    stored = await etcd.get(cursors_prefix(CLUSTER) + "s")
    assert stored is not None and stored.value == b"cursor-1"


async def test_a_subscription_created_again_ends_the_old_runtime_and_not_with_its_cursor(
    etcd: EtcdClient, membership: Membership
) -> None:
    subscriptions, view, host = await coordinator(etcd, membership)
    await run_here(subscriptions, view, membership)
    assert host.running() == {"s"}
    # Deleted and created again on another node, this one's view not yet told.
    await etcd.delete(subscriptions_prefix(CLUSTER) + "s")
    await etcd.put(subscriptions_prefix(CLUSTER) + "s", CONFIG)
    await etcd.put(coordinators_prefix(CLUSTER) + "s", "n1", lease=membership.lease_id)

    subscriptions.cursor_saved("s", b"old-cursor")
    await subscriptions.flush_cursors()
    assert await etcd.get(cursors_prefix(CLUSTER) + "s") is None

    await view.load()
    await subscriptions.reconcile(membership.members)
    assert ("s", "deleted") in host.ended


async def test_a_deleted_subscription_ends_its_runtime(
    etcd: EtcdClient, membership: Membership
) -> None:
    subscriptions, view, host = await coordinator(etcd, membership)
    await run_here(subscriptions, view, membership)

    assert await subscriptions.delete("s")
    await view.load()
    await subscriptions.reconcile(membership.members)

    assert host.running() == set()
    assert host.ended == [("s", "deleted")]
    assert not await subscriptions.delete("s")


async def test_a_cursor_written_after_a_runtime_read_it_is_never_written_over_by_an_older_one(
    etcd: EtcdClient, membership: Membership
) -> None:
    """The nemesis finding of 2026-11-27 (seed 1, `cursor-back`): a node stopped its
    runtime (its lease looked lost during an etcd election) and adopted the subscription
    again 0.4 s later, reading etcd's cursor while the old runtime's last write was still
    on its way; that write landed after the read, and the new runtime's first write, from
    the older position, took the cursor back. A write now goes only over the cursor its
    runtime last read or wrote; a runtime overtaken that way starts again from etcd's."""
    subscriptions, view, host = await coordinator(etcd, membership)
    await run_here(subscriptions, view, membership)
    cursor_key = cursors_prefix(CLUSTER) + "s"
    subscriptions.cursor_saved("s", b"at-10")
    await subscriptions.flush_cursors()

    await subscriptions.stop_all("its lease looked lost")
    await subscriptions.reconcile(membership.members)  # adopted again, from "at-10"
    assert host.runtimes == {"s": b"at-10"}
    # The old runtime's last write lands now, after the new runtime read the cursor.
    await etcd.put(cursor_key, b"at-14")

    subscriptions.cursor_saved("s", b"at-12")  # the new runtime, from the older position
    await subscriptions.flush_cursors()
    stored = await etcd.get(cursor_key)
    assert stored is not None and stored.value == b"at-14"

    await subscriptions.reconcile(membership.members)  # ends the overtaken runtime
    await subscriptions.reconcile(membership.members)  # and adopts it from etcd's cursor
    assert host.runtimes == {"s": b"at-14"}
    subscriptions.cursor_saved("s", b"at-15")
    await subscriptions.flush_cursors()
    stored = await etcd.get(cursor_key)
    assert stored is not None and stored.value == b"at-15"


async def test_a_runtime_that_ended_during_a_flush_never_writes_its_cursor(
    etcd: EtcdClient, membership: Membership
) -> None:
    """The nemesis finding of 2026-11-28 (seed 2002, `cursor-back`): a flush took the
    pending cursors, and while it waited on one subscription's write the runtime of
    another ended (its lease looked lost while etcd's leader was paused). Its cursor was
    then written with no guard on the cursor's revision, timed out unanswered, and
    landed after the next runtime had moved etcd's cursor on: the cursor went back."""
    subscriptions, view, host = await coordinator(etcd, membership)
    assert await subscriptions.create("a", CONFIG)
    await run_here(subscriptions, view, membership)  # "s", and "a" with it
    assert host.running() == {"a", "s"}

    subscriptions.cursor_saved("a", b"a-at-3")
    subscriptions.cursor_saved("s", b"s-at-10")
    flush = asyncio.create_task(subscriptions.flush_cursors())
    await asyncio.sleep(0)  # the flush has taken both and waits on the write of "a"
    await subscriptions.stop_all("its lease looked lost")
    await flush

    assert await etcd.get(cursors_prefix(CLUSTER) + "s") is None


class BrokenDiskHost(Host):
    """A node whose disk no longer lets it start a subscription (the nemesis, seed 2811:
    a failing disk's `cursors` directory unreadable, EBADMSG, for good)."""

    async def adopt(self, name: str, config: bytes, cursor: bytes | None) -> None:
        raise OSError(errno.EBADMSG, "Bad message", "cursors")


async def test_a_subscription_this_node_cannot_run_is_given_up_to_the_others(
    etcd: EtcdClient, membership: Membership
) -> None:
    """It tries again for a while, then deletes its claim, and does not claim it again
    while another node is live, preferred or not; alone, it does."""
    async with Membership(
        etcd, cluster=CLUSTER, node_id="n2", advertise_url="http://127.0.0.1:9", ttl_s=5
    ) as other:
        both = {**membership.members, "n2": other.members["n2"]}
        alone = {"n1": membership.members["n1"]}
        subscriptions, view, _ = await coordinator(
            etcd, membership, BrokenDiskHost(), give_up_after_s=0.3
        )
        key = coordinators_prefix(CLUSTER) + "s"
        assert await subscriptions.create("s", CONFIG)
        await etcd.put(key, "n1", lease=membership.lease_id)

        await view.load()
        await subscriptions.reconcile(both)  # fails: tried again
        claim = await etcd.get(key)
        assert claim is not None and claim.value == b"n1"

        await asyncio.sleep(0.4)
        await view.load()
        await subscriptions.reconcile(both)  # fails past the bound: given up
        assert await etcd.get(key) is None

        await asyncio.sleep(CLAIM_PAUSE_S + 0.2)  # past the pause: anyone may claim it
        for _ in range(2):
            await view.load()
            await subscriptions.reconcile(both)
        assert await etcd.get(key) is None, "claimed again while another node is live"

        await view.load()
        await subscriptions.reconcile(alone)
        claim = await etcd.get(key)
        assert claim is not None and claim.value == b"n1", "alone, it tries again"
