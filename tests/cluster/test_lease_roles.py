"""A partition role given under a lease this node has since lost leads nothing, even
before the node reconciles (the seed-12 nemesis finding: reads on a node that had just
registered again missed records acknowledged before they began). An in-process node on
a real etcd; its lease is revoked the way etcd expires it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cluster.etcd import EtcdClient
from cluster.node import ClusterNode, ClusterSettings
from storage.config import TopicConfig
from storage.engine import Storage
from tests.cluster.conftest import EtcdProcess, eventually


async def test_a_role_given_under_a_lost_lease_no_longer_leads(
    etcd: EtcdClient, etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    storage = await Storage.open(tmp_path / "n1")

    async def deleted(name: str) -> None:
        await storage.delete_topic(name)

    node = ClusterNode(
        storage,
        ClusterSettings(
            endpoints=etcd_server.urls,
            name="lapse",
            node_id="n1",
            advertise_url="http://127.0.0.1:9",
            node_ttl_ms=2000,
            replica_lag_ms=3000,
        ),
        on_topic_deleted=deleted,
    )
    await node.start()
    try:
        await node.create_topic("t", TopicConfig(partitions=1))

        async def leads() -> bool:
            return node.leads("t", 0)

        await eventually(leads, 30.0, "n1 leading t/0")
        # Hold back the next reconcile pass, which drops roles of a lost lease: what is
        # checked here is the window before it.
        reconcile = node.tasks.named("herald-cluster-reconcile")
        assert reconcile is not None
        reconcile.cancel()
        await asyncio.gather(reconcile, return_exceptions=True)
        old = node.membership.lease_id
        await etcd.lease_revoke(old)

        async def registered_again() -> bool:
            return node.membership.lease_id not in (0, old)

        await eventually(registered_again, 30.0, "n1 registered under a new lease")
        assert node.leader_role("t", 0) is not None, "the old role is still held"
        assert not node.leads("t", 0), "a role given under the lost lease still leads"
    finally:
        await node.close()
        await storage.close()
