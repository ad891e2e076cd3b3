"""Leases on a real etcd: expiry deletes keys, keepalive keeps them, the validity bound."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.etcd import EtcdClient, LeaseNotFound
from cluster.lease import LeaseKeeper
from tests.cluster.conftest import EtcdProcess, eventually


async def test_a_key_under_a_lease_that_is_not_renewed_is_deleted(etcd: EtcdClient) -> None:
    lease = await etcd.lease_grant(1)
    assert lease.ttl >= 1
    await etcd.put("/l/ephemeral", "x", lease=lease.id)
    await etcd.put("/l/durable", "y")
    kv = await etcd.get("/l/ephemeral")
    assert kv is not None and kv.lease == lease.id

    async def gone() -> bool:
        return await etcd.get("/l/ephemeral") is None

    waited = await eventually(gone, 15.0, "the leased key expires")
    assert waited >= lease.ttl - 0.5  # not before its TTL
    assert await etcd.get("/l/durable") is not None
    with pytest.raises(LeaseNotFound):
        await etcd.lease_keepalive(lease.id)


async def test_a_put_under_an_unknown_lease_is_refused(etcd: EtcdClient) -> None:
    with pytest.raises(LeaseNotFound):
        await etcd.put("/l/k", "v", lease=0x1234)
    assert await etcd.get("/l/k") is None


async def test_revoking_a_lease_deletes_its_keys_at_once_and_twice_is_harmless(
    etcd: EtcdClient,
) -> None:
    lease = await etcd.lease_grant(60)
    await etcd.put("/l/a", "1", lease=lease.id)
    await etcd.put("/l/b", "2", lease=lease.id)
    await etcd.lease_revoke(lease.id)
    assert (await etcd.range("/l/", prefix=True)).kvs == ()
    await etcd.lease_revoke(lease.id)


async def test_keeper_keeps_the_key_alive_for_several_ttls(etcd: EtcdClient) -> None:
    async with LeaseKeeper(etcd, ttl_s=2) as lease:
        await etcd.put("/l/node", "me", lease=lease.id)
        first_sent = lease.last_keepalive_sent
        deadline = time.monotonic() + 3 * lease.ttl
        while time.monotonic() < deadline:  # bounded: three TTLs of real time
            assert await etcd.get("/l/node") is not None, "the key expired while kept alive"
            assert not lease.lost.is_set()
            await asyncio.sleep(0.1)
        assert lease.last_keepalive_sent > first_sent
        assert lease.valid_until() == lease.last_keepalive_sent + lease.ttl
        assert lease.valid_until() > time.monotonic()
    # Leaving revokes it: the key goes now, not a TTL later.
    assert await etcd.get("/l/node") is None
    assert lease.lost.is_set()


async def test_keeper_validity_is_measured_from_the_send_time_of_the_keepalive(
    etcd: EtcdClient,
) -> None:
    # A clock that advances 10 s on every reading: the grant's send time is the reading
    # taken BEFORE the request, so validity ends ttl after it, not after the answer.
    readings: list[float] = []

    def clock() -> float:
        readings.append(time.monotonic() + 10.0 * len(readings))
        return readings[-1]

    keeper = LeaseKeeper(etcd, ttl_s=30, clock=clock)
    async with keeper as lease:
        assert lease.last_keepalive_sent == readings[0]
        assert lease.valid_until() == readings[0] + lease.ttl


async def test_keeper_notices_a_lease_revoked_behind_its_back(etcd: EtcdClient) -> None:
    async with LeaseKeeper(etcd, ttl_s=1) as lease:
        await etcd.lease_revoke(lease.id)
        await asyncio.wait_for(lease.lost.wait(), 10.0)
        assert lease.valid_until() == float("-inf")


async def test_keeper_declares_the_lease_lost_before_a_frozen_etcd_could_expire_it(
    etcd_server: EtcdProcess, etcd: EtcdClient
) -> None:
    async with LeaseKeeper(etcd, ttl_s=2) as lease:
        await etcd.put("/l/leader", "me", lease=lease.id)
        etcd_server.pause()
        try:
            paused_at = time.monotonic()
            await asyncio.wait_for(lease.lost.wait(), 15.0)
            noticed = time.monotonic()
            # etcd received no keepalive after the pause, so it cannot expire the lease
            # before paused_at + ttl; the keeper's bound counts from a send before that.
            assert lease.last_keepalive_sent <= paused_at
            bound = lease.last_keepalive_sent + lease.ttl
            assert bound <= paused_at + lease.ttl
            # And it noticed after its bound passed, within seconds on a loaded host
            # (what keeps it safe is the bound: it acts on valid_until, not on noticing).
            assert noticed < bound + 5.0
        finally:
            etcd_server.resume()

    async def expired() -> bool:
        return await etcd.get("/l/leader") is None

    await eventually(expired, 15.0, "etcd expires the lease the keeper gave up")
