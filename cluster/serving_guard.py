"""Whether this node may serve from its own copies (PROTOCOL §7, no stale reads), and
stopping what it serves the moment it may not.

Past its lease, a node serves from its own copy only while etcd is down for every node
(cluster/fence.py decides, asking the other nodes). While it holds its lease, a read or
a tail also checks that its copy of the topic is of the topic etcd has *now* — a
linearizable read of the topic's key, shared by the reads and tails arriving together
(cluster/fresh_reads.py) — since the node's view of etcd may lag a delete and re-create
(a re-created name is a new thing).

The fence is watched from a timer, not from a reconcile pass that may be waiting on
etcd: before another node can start a subscription's runtime (one coordinator at a
time), this node's must have stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cluster.clock import lease_clock_ms
from cluster.etcd import EtcdClient, EtcdUnavailable, KeyValue
from cluster.fence import Fence
from cluster.fresh_reads import FreshReads
from cluster.membership import Membership
from cluster.topics import topic_key

log = logging.getLogger("herald.cluster")

FENCE_EVERY_S = 0.1  # how often the fence looks once the lease may have lapsed
TOPIC_CHECK_S = 0.5  # a read's or tail's check of its topic's id in etcd, at most


class ServingGuard:
    def __init__(
        self,
        etcd: EtcdClient,
        cluster: str,
        membership: Membership,
        fence: Fence,
        *,
        topic_id: Callable[[str], int | None],
        on_fenced: Callable[[], None] | None,
        stop_subscriptions: Callable[[str], Awaitable[None]],
    ) -> None:
        self.membership = membership
        self.fence = fence
        self._topic_id = topic_id  # the id of the topic this node's copy is of
        self._on_fenced = on_fenced
        self._stop_subscriptions = stop_subscriptions
        # Reads and tails check their topic's id in etcd; those arriving together share
        # one read started after they arrived (cluster/fresh_reads.py).
        self._topic_reads: FreshReads[str, KeyValue | None] = FreshReads(
            lambda topic: etcd.get(topic_key(cluster, topic), within_s=TOPIC_CHECK_S)
        )
        self._etcd_failed_at: float | None = None  # a topic check etcd did not answer

    async def may_serve(self, topic: str) -> bool:
        """Whether this node may answer a read or open a tail of ``topic`` from its own
        copy: it is not fenced off (cluster/fence.py), and its copy is of the topic etcd
        has now — checked with a linearizable read of the topic's key, since this node's
        view of etcd may lag a delete and re-create (PROTOCOL §7, a re-created name is a
        new thing). With etcd unreachable from here, only if it is down for every node
        (then nobody deletes or creates anything)."""
        if not await self.fence.allows():
            return False
        if not self.membership.holds_lease():
            return True  # past its lease, and etcd is down for every node: nothing changes
        held = self._topic_id(topic)
        failed_at = self._recent_etcd_failure()
        if failed_at is None:
            sent = lease_clock_ms() / 1000
            try:
                kv = await self._topic_reads.get(topic)
            except EtcdUnavailable:
                self._etcd_failed_at = failed_at = sent
            else:
                self._etcd_failed_at = None
                return kv is not None and held is not None and kv.create_revision == held
        return await self.fence.down_for_all(failed_at)

    def _recent_etcd_failure(self) -> float | None:
        """A topic check etcd left unanswered just now: the next ones ask the fence."""
        failed = self._etcd_failed_at
        if failed is None or lease_clock_ms() / 1000 - failed > TOPIC_CHECK_S:
            return None
        return failed

    async def run(self) -> None:
        """Stop what this node serves from its own copies the moment the fence says so
        (cut off alone, its lease still running; or its lease lapsed with no verdict)."""
        serving = True
        while True:
            now = lease_clock_ms() / 1000
            until = self.membership.lease_valid_until() - now
            await asyncio.sleep(min(until, FENCE_EVERY_S) if until > 0 else FENCE_EVERY_S)
            failing = self.membership.failing_since()
            if failing is not None and lease_clock_ms() / 1000 - failing > FENCE_EVERY_S:
                # Renewals go unanswered: keep the verdict fresh, for when the lease lapses.
                try:
                    await self.fence.refresh()
                except Exception:
                    log.exception("asking the other nodes for their renewals failed")
            now_serving = self.fence.serving()
            if serving and not now_serving:
                log.warning("fenced off: %s", self.fence.refusal())
                await self._stop_serving()
            serving = now_serving

    async def _stop_serving(self) -> None:
        """PROTOCOL §7: no deliveries (consumers get 1012 and reconnect elsewhere) and no
        tails from this node's copies while another node may coordinate or lead them."""
        if self._on_fenced is not None:
            try:
                self._on_fenced()
            except Exception:
                log.exception("closing the tails on this node failed")
        await self._stop_subscriptions("stopped, this node may no longer coordinate it")
