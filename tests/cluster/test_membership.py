"""Membership on a real etcd: register under a lease, see others come and go, one id per node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import orjson
import pytest

from cluster.etcd import EtcdClient
from cluster.lease import LeaseKeeper
from cluster.membership import Member, Membership, NodeIdInUse, node_key
from tests.cluster.conftest import EtcdProcess, TcpGate, eventually

WAIT_S = 15.0


def node(
    etcd: EtcdClient, node_id: str, *, ttl_s: int = 2, takeover_wait_s: float | None = None
) -> Membership:
    return Membership(
        etcd,
        cluster="c",
        node_id=node_id,
        advertise_url=f"http://127.0.0.1:9/{node_id}",
        ttl_s=ttl_s,
        takeover_wait_s=takeover_wait_s,
    )


def ids(members: Mapping[str, Member]) -> set[str]:
    return set(members)


async def test_a_node_registers_its_url_under_its_lease_and_leaves_on_exit(
    etcd: EtcdClient,
) -> None:
    async with node(etcd, "n1") as n1:
        kv = await etcd.get(node_key("c", "n1"))
        assert kv is not None and kv.lease != 0
        assert orjson.loads(kv.value) == {"id": "n1", "url": "http://127.0.0.1:9/n1"}
        assert ids(n1.members) == {"n1"} and n1.members["n1"].url == "http://127.0.0.1:9/n1"
        assert n1.holds_lease()
        assert time.monotonic() < n1.lease_valid_until() < time.monotonic() + 2
    assert await etcd.get(node_key("c", "n1")) is None  # revoked, not left to expire
    assert not n1.holds_lease()


async def test_nodes_see_each_other_join_and_leave(etcd: EtcdClient) -> None:
    async with node(etcd, "n1") as n1:
        async with node(etcd, "n2") as n2:
            assert ids(n2.members) == {"n1", "n2"}  # read at registration
            async with asyncio.timeout(WAIT_S):
                await n1.wait_until(lambda m: ids(m) == {"n1", "n2"})  # seen by the watch
        async with asyncio.timeout(WAIT_S):
            await n1.wait_until(lambda m: ids(m) == {"n1"})


async def test_a_node_whose_lease_lapses_drops_out_of_the_member_set(etcd: EtcdClient) -> None:
    async with node(etcd, "n1") as n1:
        # A node that dies: registered under a lease nobody renews.
        lease = await etcd.lease_grant(1)
        await etcd.put(node_key("c", "dead"), b'{"id": "dead", "url": "http://x"}', lease=lease.id)
        async with asyncio.timeout(WAIT_S):
            await n1.wait_until(lambda m: "dead" in m)
            await n1.wait_until(lambda m: "dead" not in m)
        assert ids(n1.members) == {"n1"}


async def test_a_node_id_held_by_a_live_process_is_refused(etcd: EtcdClient) -> None:
    async with LeaseKeeper(etcd, ttl_s=2) as holder:
        await etcd.put(node_key("c", "n1"), b'{"id": "n1", "url": "http://other"}', lease=holder.id)
        with pytest.raises(NodeIdInUse):
            async with node(etcd, "n1", takeover_wait_s=1.0):
                pass
        kv = await etcd.get(node_key("c", "n1"))
        assert kv is not None and kv.lease == holder.id  # untouched


async def test_a_restarted_node_waits_for_its_previous_incarnation_to_expire(
    etcd: EtcdClient,
) -> None:
    # The previous process was killed: its key stays until its lease runs out, a second
    # from the grant at the earliest (measured from before it: the put may be slow).
    started = time.monotonic()
    lease = await etcd.lease_grant(1)
    await etcd.put(node_key("c", "n1"), b'{"id": "n1", "url": "http://old"}', lease=lease.id)
    async with node(etcd, "n1") as n1:
        assert time.monotonic() - started >= 0.5
        kv = await etcd.get(node_key("c", "n1"))
        assert kv is not None and kv.lease not in (0, lease.id)
        assert n1.members["n1"].url == "http://127.0.0.1:9/n1"


async def test_a_node_that_lost_its_lease_to_a_frozen_etcd_registers_again(
    etcd_server: EtcdProcess,
) -> None:
    etcd = EtcdClient(etcd_server.urls, timeout=2.0, attempt_timeout=1.0)
    async with etcd, node(etcd, "n1", ttl_s=2) as n1:
        first_lease = n1.members["n1"].lease
        etcd_server.pause()
        try:
            paused_at = time.monotonic()
            # etcd hears nothing after paused_at, so it cannot expire the lease before
            # paused_at + ttl: the node's own bound ends no later.
            assert n1.lease_valid_until() <= paused_at + 2

            async def lapsed() -> bool:
                return not n1.holds_lease()

            await eventually(lapsed, WAIT_S, "the node stops holding its lease")
            # The fault lasts beyond the TTL: etcd expires the lease once it runs again.
            await asyncio.sleep(2.5)
        finally:
            etcd_server.resume()

        async def registered_again() -> bool:
            kv = await etcd.get(node_key("c", "n1"))
            return kv is not None and kv.lease != first_lease and n1.holds_lease()

        await eventually(registered_again, WAIT_S, "the node registers under a new lease")
        async with asyncio.timeout(WAIT_S):
            await n1.wait_until(lambda m: "n1" in m and m["n1"].lease != first_lease)
        assert n1.error is None


async def test_the_member_set_is_reloaded_when_its_history_was_compacted_meanwhile(
    etcd: EtcdClient, etcd_gate: TcpGate
) -> None:
    cut_off = EtcdClient([etcd_gate.url], timeout=WAIT_S, attempt_timeout=2.0)
    async with cut_off, node(cut_off, "n1", ttl_s=10) as n1:
        await etcd.put(node_key("c", "n2"), b'{"id": "n2", "url": "http://n2"}')
        async with asyncio.timeout(WAIT_S):
            await n1.wait_until(lambda m: "n2" in m)
        await etcd_gate.cut()
        # While n1 cannot see etcd: n2 leaves, n3 joins, and etcd forgets that history.
        await etcd.delete(node_key("c", "n2"))
        latest = await etcd.put(node_key("c", "n3"), b'{"id": "n3", "url": "http://n3"}')
        await etcd.compact(latest)
        await etcd_gate.open()
        async with asyncio.timeout(WAIT_S):
            await n1.wait_until(lambda m: set(m) == {"n1", "n3"})
        assert n1.revision >= latest and n1.error is None
