"""Cluster membership on etcd: who is live, and until when this node surely is.

PROTOCOL §7: "a node is live while it holds its etcd lease". Each node keeps
``/herald/<cluster>/nodes/<node_id>`` = ``{"id": …, "url": <advertise URL>}`` under a
lease of ``--node-ttl-ms`` it renews (:class:`LeaseKeeper`), and follows the whole
``nodes/`` prefix with a watch, so every node sees the same member set in the same
order of changes.

A node id is held by one process at a time (Kafka's broker registration): a node that
finds its key held under another lease — a previous incarnation killed within the last
TTL, or a second process started with the same id — waits for that lease to run out,
and gives up with :class:`NodeIdInUse` if it does not. A node that lost its own lease
(etcd unreachable longer than the TTL) registers again under a new one, taking over
its key if its old lease still holds it.

``lease_valid_until()`` is the instant on the lease clock (:mod:`cluster.clock`) before
which etcd cannot have expired this node's lease, less a margin for the two clocks' rates; a leader stops
acknowledging writes once it has passed (PROTOCOL §7).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson

from cluster.clock import Clock, lease_clock
from cluster.etcd import (
    Compare,
    EtcdClient,
    EtcdUnavailable,
    Get,
    KeyValue,
    Put,
    RangeResult,
    WatchCompacted,
)
from cluster.etcd_watch import EventType
from cluster.lease import LeaseKeeper

log = logging.getLogger("herald.cluster")

RETRY_PAUSE_S = 0.5  # between attempts while etcd is unreachable


class NodeIdInUse(Exception):
    """Another live process holds this node id's registration."""


def nodes_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/nodes/"


def node_key(cluster: str, node_id: str) -> str:
    return nodes_prefix(cluster) + node_id


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    url: str
    lease: int  # the etcd lease its key lives under
    joined_revision: int  # the key's create revision: when this incarnation registered

    def to_json(self) -> bytes:
        return orjson.dumps({"id": self.node_id, "url": self.url})

    @classmethod
    def from_kv(cls, kv: KeyValue) -> Member | None:
        try:
            raw: Any = orjson.loads(kv.value)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            return None
        node_id = kv.key.decode(errors="replace").rsplit("/", 1)[-1]
        return cls(node_id, raw["url"], kv.lease, kv.create_revision)


class Membership:
    """``async with Membership(etcd, cluster="herald", node_id="n1", advertise_url=u) as m:``

    On entry the node is registered and ``m.members`` holds the member set; the owned
    task keeps the registration alive and the set current until exit, which removes the
    node's key (revokes its lease).
    """

    def __init__(
        self,
        etcd: EtcdClient,
        *,
        cluster: str,
        node_id: str,
        advertise_url: str,
        ttl_s: int = 5,
        clock: Clock = lease_clock,
        clock_margin_s: float | None = None,
        takeover_wait_s: float | None = None,
    ) -> None:
        if not node_id or "/" in node_id:
            raise ValueError(f"invalid node id {node_id!r}")
        self._etcd = etcd
        self.cluster = cluster
        self.node_id = node_id
        self.advertise_url = advertise_url
        self._ttl_s = ttl_s
        self._clock = clock
        # Monotonic clocks of two machines differ in rate by far less than 1 %.
        self._margin = 0.05 + 0.01 * ttl_s if clock_margin_s is None else clock_margin_s
        self._takeover_wait = (
            2 * ttl_s + etcd.timeout if takeover_wait_s is None else takeover_wait_s
        )
        self._key = node_key(cluster, node_id)
        self._lease: LeaseKeeper | None = None
        self._incarnation = 0
        self._members: dict[str, Member] = {}
        self.revision = 0  # the etcd revision ``members`` reflects
        self._watch_from = 0  # where the member watch continues
        self.error: BaseException | None = None  # why the node left for good (NodeIdInUse)
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ public

    @property
    def members(self) -> Mapping[str, Member]:
        return dict(self._members)

    def lease_valid_until(self) -> float:
        """Monotonic instant before which this node's lease surely still holds."""
        if self._lease is None:
            return float("-inf")
        return self._lease.valid_until() - self._margin

    @property
    def lease_id(self) -> int:
        """The lease this node's key lives under now (it changes when a lost lease is
        replaced: whatever this node decided under the old one must be decided again)."""
        return self._lease.id if self._lease is not None else 0

    @property
    def incarnation(self) -> int:
        """This node's incarnation: the create revision of its node key as it registered
        it (PROTOCOL §7, "restarts are new incarnations"). Every process start registers
        a new one; so does a registration after the old key lapsed (its lease expired),
        since the node cannot know what it missed meanwhile. 0 before registering."""
        return self._incarnation

    def is_current(self, node_id: str, incarnation: int) -> bool:
        """Whether ``node_id`` is live as ``incarnation`` (not dead, not registered anew)."""
        if node_id == self.node_id:
            return incarnation != 0 and incarnation == self._incarnation
        member = self._members.get(node_id)
        return member is not None and incarnation != 0 and member.joined_revision == incarnation

    def holds_lease(self) -> bool:
        return self._clock() < self.lease_valid_until()

    def failing_since(self) -> float | None:
        """The monotonic send time of the first renewal etcd left unanswered since the
        last it answered, failed or still under way (None: the last one was answered).
        It stays set while this node registers again after losing its lease, until a new
        lease is granted."""
        if self._lease is None:
            return None
        return self._lease.unanswered_since()

    def renewed_ago_s(self) -> float | None:
        """Seconds since this node sent the last renewal of its lease that etcd answered
        (the grant counts); None before registering. Other nodes ask for it (PROTOCOL §7,
        stale reads): a renewal after their own first unanswered one shows that etcd
        works, for this node at least."""
        if self._lease is None or self._lease.last_keepalive_sent == float("-inf"):
            return None
        return self._clock() - self._lease.last_keepalive_sent

    async def wait_until(self, predicate: Callable[[Mapping[str, Member]], bool]) -> None:
        """Wait until the member set satisfies ``predicate`` (bound it with a timeout)."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self._members))

    async def __aenter__(self) -> Membership:
        self._lease = await self._register(previous=None)
        try:
            await self._reload()
            self._task = asyncio.create_task(self._run(), name=f"membership {self.node_id}")
        except BaseException:
            await self._lease.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._lease is not None:
            await self._lease.__aexit__(None, None, None)  # revokes: our key goes now

    # ------------------------------------------------------------- registration

    async def _register(self, previous: LeaseKeeper | None) -> LeaseKeeper:
        lease = LeaseKeeper(self._etcd, self._ttl_s, clock=self._clock)
        await lease.__aenter__()
        try:
            await self._claim_key(lease.id, previous.id if previous else 0)
        except BaseException:
            await lease.__aexit__(None, None, None)
            raise
        log.info(
            "node %s registered in cluster %s (lease %x)", self.node_id, self.cluster, lease.id
        )
        return lease

    async def _claim_key(self, lease_id: int, previous_lease: int) -> None:
        value = Member(self.node_id, self.advertise_url, lease_id, 0).to_json()
        put = [Put.of(self._key, value, lease=lease_id)]
        give_up_at = self._clock() + self._takeover_wait
        while True:
            claimed = await self._etcd.txn(
                [Compare.version(self._key, "=", 0)], put, [Get.of(self._key)]
            )
            if claimed.succeeded:
                self._incarnation = claimed.revision  # the put's revision: its create revision
                return
            (existing,) = claimed.results
            assert isinstance(existing, RangeResult)
            if existing.kvs and previous_lease and existing.kvs[0].lease == previous_lease:
                # Our own key under the lease we lost, still there (etcd never expired
                # it): move it to the new lease; this is still the same incarnation.
                retake = await self._etcd.txn(
                    [Compare.lease(self._key, "=", previous_lease)], put, []
                )
                if retake.succeeded:
                    self._incarnation = existing.kvs[0].create_revision
                    return
                continue
            remaining = give_up_at - self._clock()
            if remaining <= 0:
                raise NodeIdInUse(
                    f"node id {self.node_id!r} is held by another live process "
                    f"({existing.kvs[0].value.decode(errors='replace') if existing.kvs else '?'})"
                )
            log.warning("node id %s still registered; waiting for its lease to end", self.node_id)
            await self._wait_deleted(existing.revision + 1, remaining)

    async def _wait_deleted(self, from_revision: int, within_s: float) -> None:
        try:
            async with asyncio.timeout(within_s):
                async with self._etcd.watch(self._key, start_revision=from_revision) as watch:
                    async for event in watch:
                        if event.type is EventType.DELETE:
                            return
        except (TimeoutError, WatchCompacted):
            return  # the caller looks once more, then gives up

    # ------------------------------------------------------------------ the task

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._stay_registered())
                tg.create_task(self._follow_members())
        except* NodeIdInUse as group:
            # Our id was taken while we were away: this node is out of the cluster, and
            # lease_valid_until() stays in the past (its lease is lost).
            self.error = group.exceptions[0]
            log.error("node %s left the cluster: %s", self.node_id, self.error)

    async def _stay_registered(self) -> None:
        while True:
            assert self._lease is not None
            await self._lease.lost.wait()
            log.warning("node %s lost its lease; registering again", self.node_id)
            lost = self._lease
            await lost.__aexit__(None, None, None)  # its task ended; a lost lease is not revoked
            while True:
                try:
                    self._lease = await self._register(previous=lost)
                    break
                except EtcdUnavailable as error:
                    log.info("registering %s again failed: %s", self.node_id, error)
                    await asyncio.sleep(RETRY_PAUSE_S)

    async def _follow_members(self) -> None:
        while True:
            try:
                async with self._etcd.watch(
                    nodes_prefix(self.cluster), prefix=True, start_revision=self._watch_from
                ) as watch:
                    async for event in watch:
                        await self._apply(event.type, event.kv)
                        self._watch_from = watch.next_revision
            except WatchCompacted as compacted:
                log.info("membership history compacted (%s): reading it afresh", compacted)
                await self._reload_when_possible()
            except EtcdUnavailable as error:
                log.info("membership watch interrupted: %s", error)
                await asyncio.sleep(RETRY_PAUSE_S)
            except Exception:
                log.exception("membership watch failed; reading the members afresh")
                await asyncio.sleep(RETRY_PAUSE_S)
                await self._reload_when_possible()

    async def _reload_when_possible(self) -> None:
        while True:
            try:
                await self._reload()
                return
            except EtcdUnavailable:
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _reload(self) -> None:
        result = await self._etcd.range(nodes_prefix(self.cluster), prefix=True)
        members = {m.node_id: m for m in map(Member.from_kv, result.kvs) if m is not None}
        async with self._changed:
            self._members, self.revision = members, result.revision
            self._watch_from = result.revision + 1
            self._changed.notify_all()

    async def _apply(self, kind: EventType, kv: KeyValue) -> None:
        async with self._changed:
            node_id = kv.key.decode(errors="replace").rsplit("/", 1)[-1]
            member = Member.from_kv(kv) if kind is EventType.PUT else None
            if member is None:
                self._members.pop(node_id, None)
            else:
                self._members[node_id] = member
            self.revision = kv.mod_revision
            self._changed.notify_all()
