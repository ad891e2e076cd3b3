"""This node's part in running subscriptions over a cluster (PROTOCOL §7 "Subscriptions";
the keys and the choice of node: cluster/coordination.py).

- it claims the subscriptions it should coordinate (its preferred ones at once, any
  left unclaimed after ``CLAIM_PAUSE_S``), and tells the :class:`SubscriptionHost` (the
  delivery engine, via the server) which ones to run here;
- each runtime is *adopted* as one subscription id under one lease: a subscription
  deleted and created again, or a lease this node lost since, ends it (the new one, or
  the next adoption, starts from etcd's cursor, never from this node's older one);
- it replicates the cursors the engine saves, each write guarded by "the coordinator
  key is mine, under my lease" and by the subscription id it was adopted as;
- past its lease, with etcd working for another node (cluster/fence.py), it stops every
  runtime here rather than run two coordinators of one subscription;
- a subscription it cannot run here for ``GIVE_UP_AFTER_S`` (the disk fails: a full one,
  or a directory it can no longer read) it gives up, so that another node claims it, and
  it does not claim that one again for ``SHUN_S`` while another node is live.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from cluster.clock import lease_clock
from cluster.coordination import (
    CLAIM_PAUSE_S,
    CURSOR_EVERY_S,
    GIVE_UP_AFTER_S,
    SHUN_S,
    Coordinator,
    coordinators_prefix,
    cursors_prefix,
    preferred_coordinator,
    subscriptions_prefix,
)
from cluster.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdUnavailable,
    Get,
    Put,
    RangeResult,
    TxnResult,
)
from cluster.fence import Fence
from cluster.membership import Member, Membership, node_key
from cluster.metadata import MetadataView

log = logging.getLogger("herald.cluster")


@dataclass(slots=True)
class Adoption:
    """A runtime here: what it was adopted as, and the revision of etcd's cursor key as
    it last read or wrote it (0: no cursor yet)."""

    subscription_id: int  # the subscription key's create revision
    lease: int
    cursor_revision: int


def _still_ours(result: TxnResult, node_id: str, lease: int) -> bool:
    """Whether a failed cursor write's coordinator key (its first Get) is still this
    node's under ``lease``."""
    first = result.results[0] if result.results else None
    if not isinstance(first, RangeResult) or not first.kvs:
        return False
    kv = first.kvs[0]
    return kv.value == node_id.encode() and kv.lease == lease


class SubscriptionHost(Protocol):
    """What runs subscriptions on this node (the delivery engine and its webhooks, via
    the server): the node tells it which ones to run, as etcd decides."""

    def running(self) -> set[str]: ...

    async def adopt(self, name: str, config: bytes, cursor: bytes | None) -> None: ...

    async def release(self, name: str) -> None: ...

    async def deleted(self, name: str) -> None: ...


class SubscriptionCoordinator:
    def __init__(
        self,
        etcd: EtcdClient,
        cluster: str,
        node_id: str,
        membership: Membership,
        view: MetadataView,
        fence: Fence,
        *,
        caught_up: Callable[[str], bool],
        changed: Callable[[], None],
        give_up_after_s: float = GIVE_UP_AFTER_S,
        shun_s: float = SHUN_S,
    ) -> None:
        self.etcd = etcd
        self.cluster = cluster
        self.node_id = node_id
        self.membership = membership
        self.view = view
        self.fence = fence
        self._caught_up = caught_up
        self._changed = changed
        self.host: SubscriptionHost | None = None
        # running here -> the subscription id it was adopted as, the lease it was adopted
        # under (a runtime lives only as long as both) and the cursor key's revision
        self._adopted: dict[str, Adoption] = {}
        # runtimes whose cursor etcd moved past them: the next pass adopts them anew
        self._overtaken: set[str] = set()
        self._unclaimed_since: dict[str, float] = {}
        self._cursors: dict[str, bytes] = {}  # name -> latest cursor not yet in etcd
        self._cursor_wake = asyncio.Event()
        self._give_up_after_s = give_up_after_s
        self._shun_s = shun_s
        self._failing_since: dict[str, float] = {}  # name -> its first failed start here
        self._shunned_until: dict[str, float] = {}  # name -> given up here until then

    # ------------------------------------------------------------------ queries

    def topic_of(self, name: str) -> str | None:
        try:
            config = orjson.loads(self.view.subscriptions[name])
        except (KeyError, orjson.JSONDecodeError):
            return None
        topic = config.get("topic") if isinstance(config, dict) else None
        return topic if isinstance(topic, str) else None

    def _start_of(self, name: str) -> object:
        try:
            config = orjson.loads(self.view.subscriptions[name])
        except (KeyError, orjson.JSONDecodeError):
            return None
        return config.get("start") if isinstance(config, dict) else None

    def coordinated_topics(self) -> set[str]:
        """The topics of the subscriptions this node coordinates (it copies their logs)."""
        topics = set()
        for name in self.view.subscriptions:
            if self.coordinates(name):
                topic = self.topic_of(name)
                if topic is not None:
                    topics.add(topic)
        return topics

    def coordinates(self, name: str) -> bool:
        """Whether this node is the subscription's coordinator, under its current lease."""
        coordinator = self.view.coordinators.get(name)
        # Not "and the lease still holds": while etcd cannot be reached nobody can take a
        # subscription over, so its coordinator goes on delivering committed records
        # (PROTOCOL §7); its cursor writes stay fenced by the lease, and once etcd answers
        # again a lapsed lease's key is gone and the subscription moves (at least once).
        return (
            coordinator is not None
            and coordinator.node == self.node_id
            and coordinator.lease == self.membership.lease_id
            and self.fence.serving()
        )

    def coordinator(self, name: str) -> str | None:
        """The node etcd names as the subscription's coordinator (None: none)."""
        coordinator = self.view.coordinators.get(name)
        return coordinator.node if coordinator is not None else None

    # ------------------------------------------------------------------ runtimes

    async def _end(self, name: str, host: SubscriptionHost, *, deleted: bool = False) -> None:
        """Stop the runtime here; its cursor not yet in etcd is not etcd's to take."""
        self._adopted.pop(name, None)
        self._overtaken.discard(name)
        if deleted:
            await host.deleted(name)
        else:
            await host.release(name)
        self._cursors.pop(name, None)  # after: a save under way may have added one

    async def stop_all(self, why: str) -> None:
        """Stop every runtime here: this node may no longer coordinate them."""
        host = self.host
        if host is None:
            return
        for name in sorted(host.running()):
            log.warning("subscription %s: %s", name, why)
            await self._end(name, host)

    async def reconcile(self, members: Mapping[str, Member]) -> None:
        host = self.host
        if host is None:
            return
        if not await self.fence.allows():
            # PROTOCOL §7: this node lost its lease while another holds one, so another
            # may coordinate its subscriptions now: it stops delivering them (consumers
            # get 1012 and reconnect elsewhere) rather than run two coordinators.
            await self.stop_all("lease lost while another node holds one")
            return
        await self._claim_unclaimed(members)
        lease = self.membership.lease_id
        for name in sorted(host.running()):
            adopted, wanted = self._adopted.get(name), self.view.subscription_ids.get(name)
            if adopted is not None and wanted is not None and adopted.subscription_id != wanted:
                # Deleted and created again (PROTOCOL §7): the runtime of the old one, its
                # cursor and config included, ends here; the new one starts afresh.
                log.warning("subscription %s was created again: the old one ends here", name)
                await self._end(name, host, deleted=True)
            elif adopted is not None and adopted.lease != lease:
                # Adopted under a lease this node lost: another node may have run it since
                # and moved its cursor on. Even if this node claimed it again, it starts
                # again from etcd's cursor, never writing its older one back.
                log.info("subscription %s was adopted under a lost lease: adopting it anew", name)
                await self._end(name, host)
            elif name in self._overtaken:
                # Its cursor in etcd was written by another runtime since this one read it
                # (an earlier runtime's write that was still on its way): this one's
                # position may be behind it, so it starts again from etcd's cursor rather
                # than writing an older one over it.
                log.info("subscription %s: etcd's cursor moved past it: adopting it anew", name)
                await self._end(name, host)
        running = host.running()
        for name in sorted(self.view.subscriptions):
            mine = self.coordinates(name)
            if mine and name not in running:
                await self._adopt(name, host, lease)
            elif not mine and name in running:
                log.info("subscription %s is coordinated elsewhere now", name)
                await self._end(name, host)
        for name in running - set(self.view.subscriptions):
            await self._end(name, host, deleted=True)

    async def _claim_unclaimed(self, members: Mapping[str, Member]) -> None:
        now = lease_clock()
        live = sorted(members)
        for name in list(self.view.subscriptions):
            coordinator = self.view.coordinators.get(name)
            if coordinator is not None and coordinator.node in members:
                self._unclaimed_since.pop(name, None)
                continue
            since = self._unclaimed_since.setdefault(name, now)
            if self._shunned_until.get(name, 0.0) > now and live != [self.node_id]:
                continue  # given up here: another live node takes it
            preferred = preferred_coordinator(name, live)
            if self.membership.holds_lease() and (
                preferred == self.node_id or now - since > CLAIM_PAUSE_S
            ):
                await self._claim(name)

    async def _adopt(self, name: str, host: SubscriptionHost, lease: int) -> None:
        topic = self.topic_of(name)
        try:
            cursor = await self.etcd.get(cursors_prefix(self.cluster) + name)
            if (
                cursor is None
                and topic is not None
                and self._start_of(name) != "earliest"
                and not self._caught_up(topic)
            ):
                # A new subscription starts at "latest" (or a time) as the leaders have
                # it: wait until this node's copies hold that (the next pass, within half
                # a second, looks again).
                return
            self._adopted[name] = Adoption(
                self.view.subscription_ids.get(name, 0),
                lease,
                cursor.mod_revision if cursor is not None else 0,
            )
            await host.adopt(name, self.view.subscriptions[name], cursor.value if cursor else None)
            self._failing_since.pop(name, None)
            log.info("coordinating subscription %s", name)
        except EtcdUnavailable as exc:
            log.info("taking subscription %s: %s", name, exc)
        except OSError as exc:  # its cursor could not be written here (a full disk...)
            self._adopted.pop(name, None)
            since = self._failing_since.setdefault(name, lease_clock())
            if lease_clock() - since < self._give_up_after_s:
                log.error("running subscription %s here failed (tried again): %s", name, exc)
            else:
                log.error("running subscription %s here failed, giving it up: %s", name, exc)
                await self._give_up(name, lease)
        except Exception:
            log.exception("running subscription %s here failed", name)

    async def _give_up(self, name: str, lease: int) -> None:
        """Let go of the claim on a subscription this node cannot run, if it is still
        this node's under ``lease``, and stay away from it for a while (SHUN_S)."""
        key = coordinators_prefix(self.cluster) + name
        try:
            result = await self.etcd.txn(
                [Compare.value(key, "=", self.node_id), Compare.lease(key, "=", lease)],
                [Delete.of(key)],
            )
        except EtcdUnavailable as exc:
            log.info("giving up subscription %s: %s (tried again)", name, exc)
            return
        self._failing_since.pop(name, None)
        self._shunned_until[name] = lease_clock() + self._shun_s
        if result.succeeded:
            self.view.coordinators.pop(name, None)
            self._changed()

    async def _claim(self, name: str) -> None:
        key = coordinators_prefix(self.cluster) + name
        try:
            result = await self.etcd.txn(
                [
                    Compare.version(key, "=", 0),
                    Compare.version(node_key(self.cluster, self.node_id), ">", 0),
                    Compare.version(subscriptions_prefix(self.cluster) + name, ">", 0),
                ],
                [Put.of(key, self.node_id, lease=self.membership.lease_id)],
                [Get.of(key)],
            )
        except EtcdUnavailable as exc:
            log.info("claiming subscription %s: %s", name, exc)
            return
        if result.succeeded:
            self.view.coordinators[name] = Coordinator(
                self.node_id, self.membership.lease_id, result.revision
            )
            self._changed()

    # ------------------------------------------------------------------ cursors

    def cursor_saved(self, name: str, cursor: bytes) -> None:
        """The engine persisted ``name``'s cursor: replicate it (the latest wins)."""
        self._cursors[name] = cursor
        self._cursor_wake.set()

    async def run_cursors(self) -> None:
        while True:
            await self._cursor_wake.wait()
            self._cursor_wake.clear()
            await self.flush_cursors()
            await asyncio.sleep(CURSOR_EVERY_S)

    async def flush_cursors(self) -> None:
        """Write the pending cursors to etcd, each only while this node coordinates it and
        only over the cursor its runtime last read or wrote: a cursor never goes back."""
        pending, self._cursors = self._cursors, {}
        lease = self.membership.lease_id
        for name, cursor in pending.items():
            key = coordinators_prefix(self.cluster) + name
            cursor_key = cursors_prefix(self.cluster) + name
            guards = [Compare.value(key, "=", self.node_id), Compare.lease(key, "=", lease)]
            adopted = self._adopted.get(name)
            if adopted is None or adopted.lease != lease:
                # A runtime that ended (while this flush waited on another name's write:
                # the nemesis, seed 2002, saw such a write, unguarded, land late and take
                # etcd's cursor back) or of a lost lease: its cursor is not etcd's to take.
                continue
            # Only over what this runtime last saw: a write of an earlier runtime still
            # on its way when this one read etcd's cursor may land after that read.
            guards.append(Compare.mod_revision(cursor_key, "=", adopted.cursor_revision))
            if adopted.subscription_id:
                # The cursor of the subscription as adopted, not of one created since.
                guards.append(
                    Compare.create_revision(
                        subscriptions_prefix(self.cluster) + name, "=", adopted.subscription_id
                    )
                )
            try:
                result = await self.etcd.txn(
                    guards,
                    [Put.of(cursor_key, cursor)],
                    [Get.of(key), Get.of(cursor_key)],
                )
            except EtcdUnavailable as exc:
                log.info("replicating the cursor of %s: %s", name, exc)
                self._cursors.setdefault(name, cursor)  # the next round tries again
                continue
            if self._adopted.get(name) is not adopted:
                continue  # its runtime ended meanwhile
            if result.succeeded:
                adopted.cursor_revision = result.revision
            elif _still_ours(result, self.node_id, lease):
                # The coordinator key is still this node's under this lease, so what
                # failed is the cursor's revision: another runtime's write came between.
                self._overtaken.add(name)
                self._changed()

    # ------------------------------------------------------------------ admin

    async def create(self, name: str, config: bytes) -> bool:
        """Write a new subscription's config; False if one exists."""
        key = subscriptions_prefix(self.cluster) + name
        result = await self.etcd.txn(
            [Compare.version(key, "=", 0)], [Put.of(key, self.view.sealed(key, config))]
        )
        if result.succeeded:
            self.view.subscriptions[name] = config
            self._changed()
        return result.succeeded

    async def store(self, name: str, config: bytes) -> None:
        """The coordinator changed a subscription in place: its config in etcd follows."""
        key = subscriptions_prefix(self.cluster) + name
        coordinator = coordinators_prefix(self.cluster) + name
        await self.etcd.txn(
            [Compare.version(key, ">", 0), Compare.value(coordinator, "=", self.node_id)],
            [Put.of(key, self.view.sealed(key, config))],
        )

    async def delete(self, name: str) -> bool:
        """Delete a subscription's config, coordinator and cursor; False if none."""
        key = subscriptions_prefix(self.cluster) + name
        result = await self.etcd.txn(
            [Compare.version(key, ">", 0)],
            [
                Delete.of(key),
                Delete.of(coordinators_prefix(self.cluster) + name),
                Delete.of(cursors_prefix(self.cluster) + name),
            ],
        )
        if result.succeeded:
            self.view.subscriptions.pop(name, None)
            self._changed()
        return result.succeeded
