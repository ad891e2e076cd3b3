"""This node's part in a cluster (PROTOCOL §7): it registers under a lease, follows the
cluster's state in etcd, and gives each local partition its role.

etcd holds the truth — topic configs, and per partition ``{replicas, leader, epoch,
isr}`` — and the node only *reacts* to it (Kafka's design with ZooKeeper; the nodes
never vote among themselves). :class:`ClusterNode` is the composition the server uses;
each concept is its own module, split along Kafka's lines:

- :class:`MetadataView` (cluster/metadata.py) — the mirror of etcd, read in full and then
  followed by a watch;
- :class:`ReplicaManager` (cluster/replica_manager.py) — the local copy of every topic
  and each partition's role in it (leader, follower, observer, none), each held as one
  *incarnation* of this node;
- :class:`Elections` (cluster/elections.py) — taking over a partition whose leader is
  gone, by the eligible-leader rules (epoch + 1, a current ISR member, or the most
  up-to-date of the ISR once every member is back);
- :class:`SubscriptionCoordinator` (cluster/subscription_coordinator.py) — claiming,
  running and releasing subscriptions, and replicating their cursors;
- :class:`FetchServer` (cluster/fetch_serving.py) — the leader's side of the followers'
  fetches;
- :class:`ServingGuard` (cluster/serving_guard.py) — whether this node may serve from
  its own copies (the fence, topic ids), stopping what it serves once it may not;
- the :class:`Compactor` (cluster/compaction.py) of etcd's history.

Every change etcd reports marks the state dirty; one *reconcile pass* (here) then walks
the parts in order — a new lease first (roles of the old one dropped, the state read
afresh), then the local topics, each partition's role and any takeover, then the
subscriptions — and wakes whoever waits for a change to apply. The parts' loops run
under one :class:`TaskGroup` (cluster/task_group.py).

The node starts in :meth:`start` (registration, the first full read of the state, the
roles) before the server serves, and stops in :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from cluster.compaction import COMPACT_EVERY_S, KEEP_S, Compactor
from cluster.coordination import Coordinator
from cluster.elections import Elections, is_current
from cluster.errors import LeaderUnavailable
from cluster.etcd import EtcdAccess, EtcdClient
from cluster.fence import AskRenewals, Fence
from cluster.fetch_serving import FetchServer
from cluster.following import FetchSession, FollowerRole
from cluster.leading import Counters, LeaderRole
from cluster.log_ends import log_ends_prefix, snapshot
from cluster.membership import Membership, nodes_prefix
from cluster.metadata import MetadataView
from cluster.replica_manager import ReplicaManager
from cluster.serving_guard import ServingGuard
from cluster.state import Change, PartitionState, VersionedState
from cluster.subscription_coordinator import SubscriptionCoordinator, SubscriptionHost
from cluster.task_group import TaskGroup
from cluster.topics import (
    Created,
    assign_replicas,
    check_topic_room,
    cluster_prefix,
    config_from_json,
    create_topic,
    delete_topic,
    topic_key,
)
from cluster.trust import ClusterKeys
from cluster.wire import Request
from storage.config import TopicConfig
from storage.engine import Storage

log = logging.getLogger("herald.cluster")

Ref = tuple[str, int]  # (topic, partition)
_RECONCILE_EVERY_S = 0.5  # besides every change etcd reports
_WAIT_APPLIED_S = 5.0  # an admin call waits this long for its change to reach this node
_SLOW_PASS_S = 10.0  # a reconcile pass this long is logged, with where it waits, each time
_AUTHENTICATE_WITHIN_S = 30.0  # at a start, etcd's answer to this node's user


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    endpoints: list[str]
    name: str
    node_id: str
    advertise_url: str
    node_ttl_ms: int
    replica_lag_ms: int
    etcd_history_s: float = KEEP_S
    etcd_access: EtcdAccess = field(default_factory=EtcdAccess)  # etcd's TLS and user
    # The key set all nodes share (cluster/trust.py): subscription configs are sealed in
    # etcd with it. None: written in clear.
    keys: ClusterKeys | None = None


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition as this node knows it from etcd."""

    state: PartitionState
    leader_url: str | None  # the leader's URL while it is a live member, else None

    @property
    def live_leader(self) -> str | None:
        return self.state.leader if self.leader_url is not None else None


class ClusterNode:
    def __init__(
        self,
        storage: Storage,
        settings: ClusterSettings,
        *,
        on_topic_deleted: Callable[[str], Awaitable[None]],
        peer_headers: dict[str, str] | None = None,
        ask_renewals: AskRenewals | None = None,
        on_fenced: Callable[[], None] | None = None,
        peer_trusted: Callable[[str], Awaitable[bool]] | None = None,
        peer_verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.node_id = settings.node_id
        self.name = settings.name
        self.etcd = EtcdClient(settings.endpoints, access=settings.etcd_access)
        self.membership = Membership(
            self.etcd,
            cluster=settings.name,
            node_id=settings.node_id,
            advertise_url=settings.advertise_url,
            ttl_s=max(1, math.ceil(settings.node_ttl_ms / 1000)),
        )
        # PROTOCOL §7 (stale reads): past its lease, this node serves from its own copy
        # only while etcd is down for every node (cluster/fence.py; the server asks the
        # other nodes).
        self.fence = Fence(
            holds_lease=self.membership.holds_lease,
            failing_since=self.membership.failing_since,
            peers=self._peers_to_ask,
            ask=ask_renewals or _no_answers,
        )
        self._dirty = asyncio.Event()
        self._applied = asyncio.Condition()  # notified after each reconcile pass
        self.metadata = MetadataView(
            self.etcd, self.name, keys=settings.keys, changed=self._dirty.set
        )
        self.replicas = ReplicaManager(
            storage,
            node_id=self.node_id,
            cluster=self.name,
            etcd=self.etcd,
            membership=self.membership,
            replica_lag_ms=settings.replica_lag_ms,
            on_topic_deleted=on_topic_deleted,
            url_of=self.member_url,
            peer_headers=peer_headers or {},
            peer_trusted=peer_trusted,
            peer_verify=peer_verify,
        )
        self.elections = Elections(
            self.etcd,
            self.name,
            self.node_id,
            self.membership,
            log_ends=lambda: self.metadata.log_ends,
            states=lambda: self.metadata.states,
            changed=self._dirty.set,
        )
        self.subscription_coordinator = SubscriptionCoordinator(
            self.etcd,
            self.name,
            self.node_id,
            self.membership,
            self.metadata,
            self.fence,
            caught_up=self.replicas.caught_up,
            changed=self._dirty.set,
        )
        self.fetch_server = FetchServer(
            self.node_id,
            leader_role=self.replicas.leader_role,
            states=lambda: self.metadata.states,
        )
        # ``on_fenced`` closes this node's tails when it stops serving.
        self.serving_guard = ServingGuard(
            self.etcd,
            self.name,
            self.membership,
            self.fence,
            topic_id=lambda t: self.replicas.local_id(t) or self.metadata.topic_ids.get(t),
            on_fenced=on_fenced,
            stop_subscriptions=self.subscription_coordinator.stop_all,
        )
        self.compactor = Compactor(
            self.etcd,
            is_compactor=self._compacts,
            probe_key=cluster_prefix(settings.name),
            every_s=min(COMPACT_EVERY_S, settings.etcd_history_s / 5),
            keep_s=settings.etcd_history_s,
        )
        self._spread: dict[str, int] = {}
        self._last_urls: dict[str, str] = {}  # node id -> the URL it had when last live
        self._lease_seen = 0  # the lease the roles were given under
        self.tasks = TaskGroup()
        self._entered = False

    # ------------------------------------------------------------------ the mirror's parts

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self.metadata.topics

    @property
    def states(self) -> dict[Ref, VersionedState]:
        return self.metadata.states

    @property
    def subscriptions(self) -> dict[str, bytes]:
        return self.metadata.subscriptions

    @property
    def coordinators(self) -> dict[str, Coordinator]:
        return self.metadata.coordinators

    @property
    def counters(self) -> Counters:
        return self.replicas.counters

    @property
    def roles(self) -> dict[Ref, LeaderRole | FollowerRole]:
        return self.replicas.roles

    @property
    def sessions(self) -> dict[str, FetchSession]:
        return self.replicas.sessions

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        # etcd's token first, on a budget of its own: etcd checks a password with bcrypt,
        # which under load took most of the first call's 4 s (cluster/etcd_access.py).
        await self.etcd.authenticate(within_s=_AUTHENTICATE_WITHIN_S)
        await self.membership.__aenter__()
        self._entered = True
        await self._publish_log_ends()
        revision = await self.metadata.load()
        self._lease_seen = self.membership.lease_id
        await self._reconcile()
        self.tasks.start(self.metadata.follow(revision + 1), "herald-cluster-watch")
        self.tasks.start(self._reconcile_loop(), "herald-cluster-reconcile")
        self.tasks.start(self.replicas.run_ticks(), "herald-cluster-tick")
        self.tasks.start(self.compactor.run(), "herald-etcd-compaction")
        self.tasks.start(self.serving_guard.run(), "herald-cluster-fence")

    async def close(self) -> None:
        if self.subscription_coordinator.host is not None:
            try:
                await self.flush_cursors()
            except Exception:
                log.exception("replicating the last cursors failed")
        await self.tasks.close()
        await self.fence.close()
        await self.replicas.close()
        if self._entered:
            try:
                await self.membership.__aexit__(None, None, None)
            except Exception as exc:  # etcd gone: the lease lapses on its own
                log.info("leaving the cluster: %s", exc)
        await self.etcd.aclose()

    async def _publish_log_ends(self) -> None:
        """What this incarnation's disk holds (cluster/log_ends.py), before any role."""
        ends = snapshot(
            self.node_id,
            self.membership.incarnation,
            (
                ((topic.name, p.partition), p.latest_epoch, p.log_end_offset)
                for topic in self.storage.topics()
                for p in topic.partitions
            ),
        )
        await self.etcd.put(
            log_ends_prefix(self.name) + self.node_id,
            ends.to_json(),
            lease=self.membership.lease_id,
        )
        self.metadata.log_ends[self.node_id] = ends

    # ------------------------------------------------------------------ reconcile

    async def _reconcile_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that
            # arrives as the event is set (gh-86296), and the loop then never ended —
            # close() (and test_lease_roles) waited for it forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RECONCILE_EVERY_S):
                    await self._dirty.wait()
            self._dirty.clear()
            slow = _SlowPass(asyncio.current_task())
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciling the cluster state failed")
            finally:
                slow.done()

    async def _reconcile(self) -> None:
        lease = self.membership.lease_id
        if lease != self._lease_seen:
            # A new lease: the old one lapsed (a pause, a partition from etcd), and others
            # may have taken this node's partitions meanwhile. Roles held under the old
            # lease refuse writes already; the state is read afresh before any is given
            # again, so no role is granted from a view older than the lease.
            await self.replicas.drop_leader_roles()
            await self._publish_log_ends()
            await self.metadata.load()
            self._lease_seen = lease
        topics = await self.replicas.sync_topics(self.metadata)
        members = self.membership.members
        observed = (
            self.replicas.tailed_topics() | self.subscription_coordinator.coordinated_topics()
        )
        takeovers: list[Change] = []
        for ref, versioned in list(self.states.items()):
            if ref[0] not in topics or not self._copy_is_current(ref[0]):
                continue
            local = self.storage.topic(ref[0])
            if local is None or ref[1] >= len(local.partitions):
                continue
            await self.replicas.assign_role(local, ref, versioned, observed)
            if not self._copy_is_current(ref[0]):
                continue
            change = self.elections.takeover(ref, versioned)
            if change is not None:
                takeovers.append(change)
        await self.replicas.drop_unknown(self.states, topics)
        if takeovers:
            await self.elections.take_over(takeovers)
        await self.subscription_coordinator.reconcile(members)
        async with self._applied:
            self._applied.notify_all()

    def _copy_is_current(self, topic: str) -> bool:
        """Whether this node's copy of ``topic`` is of the topic its view of etcd has now.
        The view moves on while a reconcile pass waits (a delete and create again
        arrives as a partition's new state before the topic's key): a state of the new
        topic is never given to, or taken over with, a copy of the old one."""
        held = self.replicas.local_id(topic)
        return held is not None and held == self.metadata.topic_ids.get(topic)

    async def wait_applied(self, predicate: Callable[[], bool]) -> bool:
        """Wait (bounded) until a reconcile pass made ``predicate`` true."""
        self._dirty.set()
        try:
            async with asyncio.timeout(_WAIT_APPLIED_S):
                async with self._applied:
                    await self._applied.wait_for(predicate)
            return True
        except TimeoutError:
            return False

    def _compacts(self) -> bool:
        """One live node compacts etcd's history: the one with the smallest id."""
        live = self.membership.members
        return self.membership.holds_lease() and bool(live) and min(live) == self.node_id

    def _peers_to_ask(self) -> tuple[dict[str, str], set[str]]:
        """Every other node known with a URL, and the live ones (which must answer)."""
        urls = {n: u for n, u in self.known_nodes().items() if n != self.node_id and u}
        return urls, set(self.membership.members) - {self.node_id}

    # ------------------------------------------------------------------ serving

    async def may_serve(self, topic: str) -> bool:
        """Whether this node may answer a read or open a tail of ``topic`` from its own
        copy (cluster/serving_guard.py)."""
        return await self.serving_guard.may_serve(topic)

    async def serve_fetch(self, request: Request) -> bytes:
        """One fetch request of a follower node (cluster/fetch_serving.py)."""
        return await self.fetch_server.serve(request)

    def tail_opened(self, topic: str) -> None:
        self.replicas.tail_opened(topic)
        self._dirty.set()

    def tail_closed(self, topic: str) -> None:
        self.replicas.tail_closed(topic)
        self._dirty.set()

    # ------------------------------------------------------------------ subscriptions

    def bind_subscriptions(self, host: SubscriptionHost) -> None:
        """From now on run here the subscriptions this node coordinates."""
        self.subscription_coordinator.host = host
        self.tasks.start(self.subscription_coordinator.run_cursors(), "herald-cluster-cursors")
        self._dirty.set()

    def cursor_saved(self, name: str, cursor: bytes) -> None:
        """The engine persisted ``name``'s cursor: replicate it (the latest wins)."""
        self.subscription_coordinator.cursor_saved(name, cursor)

    async def flush_cursors(self) -> None:
        await self.subscription_coordinator.flush_cursors()

    def coordinates(self, name: str) -> bool:
        """Whether this node is the subscription's coordinator, under its current lease."""
        return self.subscription_coordinator.coordinates(name)

    def coordinator_url(self, name: str) -> str | None:
        """The URL of the subscription's live coordinator (None: none right now)."""
        node = self.subscription_coordinator.coordinator(name)
        return self.member_url(node) if node is not None else None

    def caught_up(self, topic: str) -> bool:
        return self.replicas.caught_up(topic)

    async def create_subscription(self, name: str, config: bytes) -> bool:
        """Write a new subscription's config; False if one exists."""
        return await self.subscription_coordinator.create(name, config)

    async def store_subscription(self, name: str, config: bytes) -> None:
        """The coordinator changed a subscription in place: its config in etcd follows."""
        await self.subscription_coordinator.store(name, config)

    async def delete_subscription(self, name: str) -> bool:
        """Delete a subscription's config, coordinator and cursor; False if none."""
        return await self.subscription_coordinator.delete(name)

    async def wait_coordinated(self, name: str) -> str | None:
        """Wait (bounded) until the subscription has a live coordinator; its URL."""
        await self.wait_applied(lambda: self.coordinator_url(name) is not None)
        return self.coordinator_url(name)

    # ------------------------------------------------------------------ queries

    def known_nodes(self) -> dict[str, str | None]:
        """Every node this one knows of — the live members, and the replicas the
        partitions name — with the URL it last had (None: never seen live)."""
        members = self.membership.members
        for node, member in members.items():
            self._last_urls[node] = member.url
        nodes: dict[str, str | None] = {node: self._last_urls.get(node) for node in members}
        for versioned in self.states.values():
            for replica in versioned.state.replicas:
                nodes.setdefault(replica, self._last_urls.get(replica))
        return nodes

    def member_url(self, node_id: str) -> str | None:
        member = self.membership.members.get(node_id)
        return member.url if member is not None else None

    def live_nodes(self) -> list[str]:
        return sorted(self.membership.members)

    def view(self, topic: str, partition: int) -> PartitionView | None:
        versioned = self.states.get((topic, partition))
        if versioned is None:
            return None
        leader = versioned.state.leader
        if leader is None or not is_current(self.membership, leader, versioned.state):
            return PartitionView(versioned.state, None)
        return PartitionView(versioned.state, self.member_url(leader))

    def leader_role(self, topic: str, partition: int) -> LeaderRole | None:
        return self.replicas.leader_role(topic, partition)

    def leads(self, topic: str, partition: int) -> bool:
        return self.replicas.leads(topic, partition)

    def next_spread(self, topic: str, partitions: int) -> int:
        """The partition of the next keyless batch (round robin, as on a single node)."""
        spread = self._spread.get(topic, 0) % partitions
        self._spread[topic] = spread + 1
        return spread

    def leader_counts(self) -> dict[str, int]:
        members = self.membership.members
        counts = {node: 0 for node in members}
        for versioned in self.states.values():
            leader = versioned.state.leader
            if leader in counts:
                counts[leader] += 1
        return counts

    # ------------------------------------------------------------------ admin

    async def topic_config(self, name: str) -> TopicConfig | None:
        """The topic's config: this node's view of etcd's, or etcd's own when the view
        does not have it (just created or created again, on its way here)."""
        known = self.metadata.topics.get(name)
        if known is not None:
            return known
        kv = await self.etcd.get(topic_key(self.name, name))
        return config_from_json(kv.value) if kv is not None else None

    async def create_topic(
        self,
        name: str,
        config: TopicConfig,
        *,
        max_topics: int | None = None,
        auto_created: bool = False,
    ) -> Created:
        """Create the topic in etcd (or find it there). PROTOCOL §6: a new one when
        etcd holds ``max_topics`` already is LimitExceeded, nothing written (counted
        just before the write: creations racing on several nodes may pass it by as
        many as race)."""
        if max_topics is not None:
            await check_topic_room(self.etcd, self.name, name, max_topics)
        nodes = self.live_nodes()
        replicas = assign_replicas(
            name, config.partitions, config.replication_factor, nodes, self.leader_counts()
        )
        incarnations = {n: m.joined_revision for n, m in self.membership.members.items()}
        incarnations[self.node_id] = self.membership.incarnation
        created = await create_topic(
            self.etcd, self.name, name, config, replicas, incarnations, auto_created=auto_created
        )
        await self.wait_applied(
            lambda: (
                self.storage.topic(name) is not None
                and all((name, n) in self.states for n in range(created.config.partitions))
            )
        )
        return created

    async def delete_topic(self, name: str) -> bool:
        deleted = await delete_topic(self.etcd, self.name, name)
        if deleted:  # its subscriptions go with it, as on a single node (PROTOCOL §2)
            topic_of = self.subscription_coordinator.topic_of
            for subscription in [s for s in self.subscriptions if topic_of(s) == name]:
                await self.delete_subscription(subscription)
        await self.wait_applied(lambda: self.storage.topic(name) is None)
        return deleted

    # ------------------------------------------------------------------ reports

    def replication_report(self) -> list[dict[str, object]]:
        """The partitions this node leads, as their leader sees them."""
        return self.replicas.replication_report()

    def partition_summary(self, topic: str, partition: int) -> dict[str, object]:
        """leader/epoch/replicas/isr of GET /v1/topics/{topic} (PROTOCOL §7), and the
        leader's URL (docs/protocol.md "Publishing to the leader")."""
        view = self.view(topic, partition)
        if view is None:
            return {"leader": None, "epoch": 0, "replicas": [], "isr": [], "leader_url": None}
        return {
            "leader": view.live_leader,
            "epoch": view.state.epoch,
            "replicas": list(view.state.replicas),
            "isr": list(view.state.isr),
            "leader_url": view.leader_url,
        }

    def require_leader(self, topic: str, partition: int) -> PartitionView:
        view = self.view(topic, partition)
        if view is None or view.live_leader is None:
            raise LeaderUnavailable(f"partition {topic}/{partition} has no live leader")
        return view

    @property
    def nodes_prefix(self) -> str:
        return nodes_prefix(self.name)


class _SlowPass:
    """Logs a reconcile pass that has run for ``_SLOW_PASS_S``, and again each
    ``_SLOW_PASS_S`` after, with the stack it waits in: nothing else would show a pass
    that waits on something that never comes while the node's view of etcd moves on."""

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self._task = task
        self._started = asyncio.get_running_loop().time()
        self._timer = asyncio.get_running_loop().call_later(_SLOW_PASS_S, self._report)

    def _report(self) -> None:
        if self._task is None:
            return
        ran_s = asyncio.get_running_loop().time() - self._started
        where = "\n".join(_awaiting(self._task.get_coro()))
        log.warning("a reconcile pass has run for %.1f s; it waits in:\n%s", ran_s, where)
        self._timer = asyncio.get_running_loop().call_later(_SLOW_PASS_S, self._report)

    def done(self) -> None:
        self._timer.cancel()
        ran_s = asyncio.get_running_loop().time() - self._started
        if ran_s >= _SLOW_PASS_S:
            log.warning("a reconcile pass ended after %.1f s", ran_s)


def _awaiting(awaitable: object) -> list[str]:
    """The chain of coroutines a suspended task waits in, outermost first, down to what
    the innermost awaits (``Task.get_stack`` gives only the outermost frame)."""
    lines: list[str] = []
    for _ in range(100):
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        if frame is None:
            lines.append(f"  awaiting {awaitable!r}")
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "ag_await", None)
        if awaitable is None:
            break
    return lines


async def _no_answers(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
    return {}  # no way to ask the other nodes: only a node alone serves past its lease
