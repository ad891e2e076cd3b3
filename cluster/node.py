"""This node's part in a cluster (PROTOCOL §7): it registers under a lease, follows the
cluster's state in etcd, and gives each local partition its role.

etcd holds the truth — topic configs, and per partition ``{replicas, leader, epoch,
isr}`` — and the node only *reacts* to it (Kafka's design with ZooKeeper; the nodes
never vote among themselves):

- a topic in etcd and not on disk is created locally (every node opens every topic;
  a partition it does not replicate stays empty, and its reads go to the leader); a
  topic on disk and not in etcd is deleted;
- a partition this node leads gets a :class:`LeaderRole` (cluster/leading.py), one it
  follows a :class:`FollowerRole` on the :class:`FetchSession` to its leader's node
  (cluster/following.py), one it does not replicate neither;
- every part a node holds in a partition's state — leader, ISR member — is held as one
  *incarnation* of it (cluster/state.py): a node that registered anew (a restart, a
  lapsed lease) leads nothing and counts in no ISR under an older incarnation's entry;
- a partition whose leader is not live as the incarnation etcd names (its lease lapsed,
  or it registered anew) is taken by a *current* ISR member with one transaction: the
  partition key unchanged since it looked, the old leader's incarnation gone, its own
  still registered; epoch + 1; members that are not current leave the ISR. The first
  current ISR member in replica order tries at once, the others after a pause if the
  partition is still leaderless (so one node does not lose a race to itself, and a node
  that cannot reach etcd does not block). With no current ISR member, the most
  up-to-date one takes it once all of them are back (cluster/log_ends.py).

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
from typing import Protocol

import orjson

from cluster.clock import lease_clock, lease_clock_ms
from cluster.compaction import COMPACT_EVERY_S, KEEP_S, Compactor
from cluster.coordination import (
    CLAIM_PAUSE_S,
    CURSOR_EVERY_S,
    Coordinator,
    coordinators_prefix,
    cursors_prefix,
    preferred_coordinator,
    subscriptions_prefix,
)
from cluster.errors import LeaderUnavailable
from cluster.etcd import (
    Compare,
    Delete,
    EtcdAccess,
    EtcdClient,
    EtcdUnavailable,
    Get,
    KeyValue,
    Put,
    WatchCompacted,
)
from cluster.etcd_watch import EventType
from cluster.fence import AskRenewals, Fence
from cluster.follower import EpochAnswer, FetchRequest, FetchResponse
from cluster.following import FetchSession, FollowerRole
from cluster.fresh_reads import FreshReads
from cluster.leading import Counters, LeaderRole
from cluster.log_ends import LogEnds, log_ends_prefix, most_up_to_date, snapshot
from cluster.membership import Member, Membership, node_key, nodes_prefix
from cluster.replication import FetchError
from cluster.state import (
    Change,
    InvalidState,
    PartitionState,
    VersionedState,
    compare_and_set_all,
    failover_guards,
    partition_key,
)
from cluster.topic_ids import LocalTopicIds
from cluster.topics import (
    Created,
    assign_replicas,
    auto_created_from_json,
    check_topic_room,
    cluster_prefix,
    config_from_json,
    create_topic,
    delete_topic,
    partitions_prefix,
    topic_key,
    topics_prefix,
)
from cluster.trust import SEALED, ClusterKeys, SealError
from cluster.wire import Request, encode_answer
from storage.config import TopicConfig
from storage.engine import Storage
from storage.topic import Topic

log = logging.getLogger("herald.cluster")

Ref = tuple[str, int]  # (topic, partition)
_RECONCILE_EVERY_S = 0.5  # besides every change etcd reports
_FAILOVER_PAUSE_MS = 1500  # before an ISR member other than the first live one tries
_WAIT_APPLIED_S = 5.0  # an admin call waits this long for its change to reach this node
_FENCE_EVERY_S = 0.1  # how often the fence looks once the lease may have lapsed
_TOPIC_CHECK_S = 0.5  # a read's or tail's check of its topic's id in etcd, at most
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


class SubscriptionHost(Protocol):
    """What runs subscriptions on this node (the delivery engine and its webhooks, via
    the server): the node tells it which ones to run, as etcd decides."""

    def running(self) -> set[str]: ...

    async def adopt(self, name: str, config: bytes, cursor: bytes | None) -> None: ...

    async def release(self, name: str) -> None: ...

    async def deleted(self, name: str) -> None: ...


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
        self._on_topic_deleted = on_topic_deleted
        self._peer_headers = peer_headers or {}
        # Whether a URL proved it is a node before the cluster token goes there, and the
        # peers' CA (cluster/trust.py): for the fetch sessions to leaders.
        self._peer_trusted = peer_trusted
        self._peer_verify = peer_verify
        self._keys = settings.keys
        self.etcd = EtcdClient(settings.endpoints, access=settings.etcd_access)
        # Reads and tails check their topic's id in etcd; those arriving together share
        # one read started after they arrived (cluster/fresh_reads.py).
        self._topic_reads: FreshReads[str, KeyValue | None] = FreshReads(
            lambda topic: self.etcd.get(topic_key(self.name, topic), within_s=_TOPIC_CHECK_S)
        )
        self.membership = Membership(
            self.etcd,
            cluster=settings.name,
            node_id=settings.node_id,
            advertise_url=settings.advertise_url,
            ttl_s=max(1, math.ceil(settings.node_ttl_ms / 1000)),
        )
        self.counters = Counters()
        # PROTOCOL §7 (stale reads): past its lease, this node serves from its own copy
        # only while etcd is down for every node (cluster/fence.py; the server asks the
        # other nodes). ``on_fenced`` closes this node's tails when it stops serving.
        self.fence = Fence(
            holds_lease=self.membership.holds_lease,
            failing_since=self.membership.failing_since,
            peers=self._peers_to_ask,
            ask=ask_renewals or _no_answers,
        )
        self._on_fenced = on_fenced
        self._etcd_failed_at: float | None = None  # a topic check etcd did not answer
        self.topics: dict[str, TopicConfig] = {}  # from etcd
        self.topic_ids: dict[str, int] = {}  # from etcd: each topic key's create revision
        self._unreadable_topics: set[str] = set()  # keys in etcd that do not parse
        # docs/protocol.md "Auto-created topics": the mark the creating node wrote in etcd.
        self.auto_created_topics: set[str] = set()
        self._local_ids = LocalTopicIds(storage.data_dir)  # which of them the disk holds
        self.states: dict[Ref, VersionedState] = {}  # from etcd
        self.loaded = False
        self.roles: dict[Ref, LeaderRole | FollowerRole] = {}
        self.sessions: dict[str, FetchSession] = {}
        self._leaderless_since: dict[Ref, float] = {}
        self._spread: dict[str, int] = {}
        self._last_urls: dict[str, str] = {}  # node id -> the URL it had when last live
        self._idle: set[Ref] = set()  # partitions this node does not replicate
        self._seen: set[Ref] = set()  # partitions given a role at least once
        self._lease_seen = 0  # the lease the roles were given under
        self.log_ends: dict[str, LogEnds] = {}  # node -> what its incarnation found on disk
        # Subscriptions (cluster/coordination.py): configs, who coordinates each, and the
        # cursors this node has to replicate.
        self.subscriptions: dict[str, bytes] = {}
        self.subscription_ids: dict[str, int] = {}  # each config key's create revision
        # running here -> (the subscription id it was adopted as, the lease it was adopted
        # under): a runtime lives only as long as both
        self._adopted: dict[str, tuple[int, int]] = {}
        self.coordinators: dict[str, Coordinator] = {}
        self._host: SubscriptionHost | None = None
        self._unclaimed_since: dict[str, float] = {}
        self._cursors: dict[str, bytes] = {}  # name -> latest cursor not yet in etcd
        self._cursor_wake = asyncio.Event()
        self._tails: dict[str, int] = {}  # topic -> tails open here (they need the data)
        self._observed: set[str] = set()
        self._dirty = asyncio.Event()
        self._applied = asyncio.Condition()  # notified after each reconcile pass
        self._tasks: list[asyncio.Task[None]] = []
        self._entered = False
        self.compactor = Compactor(
            self.etcd,
            is_compactor=self._compacts,
            probe_key=cluster_prefix(settings.name),
            every_s=min(COMPACT_EVERY_S, settings.etcd_history_s / 5),
            keep_s=settings.etcd_history_s,
        )

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        # etcd's token first, on a budget of its own: etcd checks a password with bcrypt,
        # which under load took most of the first call's 4 s (cluster/etcd_access.py).
        await self.etcd.authenticate(within_s=_AUTHENTICATE_WITHIN_S)
        await self.membership.__aenter__()
        self._entered = True
        await self._publish_log_ends()
        revision = await self._load()
        self._lease_seen = self.membership.lease_id
        await self._reconcile()
        self._tasks = [
            asyncio.create_task(self._watch(revision + 1), name="herald-cluster-watch"),
            asyncio.create_task(self._reconcile_loop(), name="herald-cluster-reconcile"),
            asyncio.create_task(self._tick_loop(), name="herald-cluster-tick"),
            asyncio.create_task(self.compactor.run(), name="herald-etcd-compaction"),
            asyncio.create_task(self._fence_loop(), name="herald-cluster-fence"),
        ]

    async def close(self) -> None:
        if self._host is not None:
            try:
                await self.flush_cursors()
            except Exception:
                log.exception("replicating the last cursors failed")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fence.close()
        for role in self.roles.values():
            if isinstance(role, LeaderRole):
                role.depose()
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)
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
        self.log_ends[self.node_id] = ends

    # ------------------------------------------------------------------ state from etcd

    async def _load(self) -> int:
        result = await self.etcd.range(cluster_prefix(self.name), prefix=True)
        topics: dict[str, TopicConfig] = {}
        states: dict[Ref, VersionedState] = {}
        self.subscriptions, self.coordinators = {}, {}
        self.subscription_ids, self.topic_ids = {}, {}
        self._unreadable_topics = set()
        self.auto_created_topics = set()
        self.log_ends = {}
        for kv in result.kvs:
            self._read_kv(kv.key.decode(errors="replace"), kv, topics, states)
        self.topics, self.states, self.loaded = topics, states, True
        return result.revision

    def _read_kv(
        self,
        key: str,
        kv: object,
        topics: dict[str, TopicConfig],
        states: dict[Ref, VersionedState],
        deleted: bool = False,
    ) -> None:
        assert isinstance(kv, KeyValue)
        if key.startswith(log_ends_prefix(self.name)):
            node = key[len(log_ends_prefix(self.name)) :]
            reported = None if deleted else LogEnds.from_json(node, kv.value)
            if reported is None:
                self.log_ends.pop(node, None)
            else:
                self.log_ends[node] = reported
        elif key.startswith(topics_prefix(self.name)):
            name = key[len(topics_prefix(self.name)) :]
            if deleted:
                topics.pop(name, None)
                self.topic_ids.pop(name, None)
                self._unreadable_topics.discard(name)
                self.auto_created_topics.discard(name)
                for ref in [r for r in states if r[0] == name]:
                    del states[ref]
                return
            config = config_from_json(kv.value)
            if config is None:
                # Not a reason to delete anything: the topic keeps its local copy.
                log.error("etcd key %s is not a topic config", key)
                self._unreadable_topics.add(name)
            else:
                self._unreadable_topics.discard(name)
                topics[name] = config
                self.topic_ids[name] = kv.create_revision
                if auto_created_from_json(kv.value):
                    self.auto_created_topics.add(name)
                else:
                    self.auto_created_topics.discard(name)
        elif key.startswith(subscriptions_prefix(self.name)):
            name = key[len(subscriptions_prefix(self.name)) :]
            if deleted:
                self.subscriptions.pop(name, None)
                self.subscription_ids.pop(name, None)
            elif (unsealed := self._unsealed(key, kv.value)) is not None:
                self.subscriptions[name] = unsealed
                self.subscription_ids[name] = kv.create_revision
        elif key.startswith(coordinators_prefix(self.name)):
            name = key[len(coordinators_prefix(self.name)) :]
            if deleted:
                self.coordinators.pop(name, None)
            else:
                current = self.coordinators.get(name)
                if current is None or kv.mod_revision >= current.mod_revision:
                    self.coordinators[name] = Coordinator(
                        kv.value.decode(errors="replace"), kv.lease, kv.mod_revision
                    )
        elif key.startswith(partitions_prefix(self.name)):
            rest = key[len(partitions_prefix(self.name)) :]
            name, _, number = rest.rpartition("/")
            if not number.isdigit():
                return
            ref = (name, int(number))
            if deleted:
                states.pop(ref, None)
                return
            try:
                versioned = VersionedState.from_kv(kv)
                known = states.get(ref)
                # A watch event older than a full read made meanwhile changes nothing.
                if known is None or versioned.mod_revision >= known.mod_revision:
                    states[ref] = versioned
            except InvalidState as exc:
                log.error("etcd key %s: %s", key, exc)

    async def _watch(self, revision: int) -> None:
        while True:
            try:
                async with self.etcd.watch(
                    cluster_prefix(self.name), prefix=True, start_revision=revision
                ) as watch:
                    async for event in watch:
                        key = event.kv.key.decode(errors="replace")
                        self._read_kv(
                            key, event.kv, self.topics, self.states, event.type is EventType.DELETE
                        )
                        revision = watch.next_revision
                        self._dirty.set()
            except WatchCompacted:
                revision = await self._reload_when_possible()
            except EtcdUnavailable as exc:
                log.info("cluster watch interrupted: %s", exc)
                await asyncio.sleep(0.5)
            except Exception:
                # Never end silently: a node that stops following etcd would act on an
                # ever older view. Read it afresh and follow on.
                log.exception("cluster watch failed; reading the state afresh")
                await asyncio.sleep(0.5)
                revision = await self._reload_when_possible()

    async def _reload_when_possible(self) -> int:
        while True:
            try:
                revision = await self._load()
                self._dirty.set()
                return revision + 1
            except EtcdUnavailable:
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ reconcile

    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), _RECONCILE_EVERY_S)
            self._dirty.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciling the cluster state failed")

    async def _tick_loop(self) -> None:
        interval = max(0.05, self.settings.replica_lag_ms / 4000)
        while True:
            await asyncio.sleep(interval)
            for role in list(self.roles.values()):
                if isinstance(role, LeaderRole):
                    try:
                        role.tick()
                    except Exception:
                        log.exception("ISR check of %s failed", role.key)

    async def _reconcile(self) -> None:
        lease = self.membership.lease_id
        if lease != self._lease_seen:
            # A new lease: the old one lapsed (a pause, a partition from etcd), and others
            # may have taken this node's partitions meanwhile. Roles held under the old
            # lease refuse writes already; the state is read afresh before any is given
            # again, so no role is granted from a view older than the lease.
            for ref in [r for r, role in self.roles.items() if isinstance(role, LeaderRole)]:
                await self._drop_role(ref)
            await self._publish_log_ends()
            await self._load()
            self._lease_seen = lease
        topics = dict(self.topics)
        for name, config in topics.items():
            local = self.storage.topic(name)
            wanted, held = self.topic_ids.get(name, 0), self._local_ids.get(name)
            if local is not None and wanted and held is not None and held != wanted:
                # Deleted and created again while this node looked away: its copy is of
                # another topic, and goes before anything reads it.
                log.warning("topic %s was created again (id %d, here %d)", name, wanted, held)
                await self._forget_topic(name)
                local = None
            auto_created = name in self.auto_created_topics
            if local is None:
                if wanted:
                    await self._local_ids.record(name, wanted)
                await self.storage.ensure_topic(name, config, auto_created=auto_created)
            elif held is None and wanted:
                await self._local_ids.record(name, wanted)  # a copy from before topic ids
            elif local.config.partitions != config.partitions:
                log.error(
                    "topic %s: %d partitions here, %d in etcd",
                    name,
                    len(local.partitions),
                    config.partitions,
                )
            if local is not None:
                local.auto_created = auto_created  # etcd's word, not this node's meta.db
        if self.loaded:
            for topic in self.storage.topics():
                if topic.name not in topics and topic.name not in self._unreadable_topics:
                    await self._forget_topic(topic.name)
        members = self.membership.members
        self._observed = self._observed_topics()
        takeovers: list[Change] = []
        for ref, versioned in list(self.states.items()):
            if ref[0] not in topics:
                continue
            local = self.storage.topic(ref[0])
            if local is None or ref[1] >= len(local.partitions):
                continue
            await self._assign_role(local, ref, versioned)
            change = self._takeover(ref, versioned, members)
            if change is not None:
                takeovers.append(change)
        for ref in [r for r in self.roles if r not in self.states or r[0] not in topics]:
            await self._drop_role(ref)
        self._idle = {r for r in self._idle if r[0] in topics}
        self._seen = {r for r in self._seen if r[0] in topics}
        if takeovers:
            await self._take_over(takeovers)
        await self._reconcile_subscriptions(members)
        async with self._applied:
            self._applied.notify_all()

    async def _forget_topic(self, name: str) -> None:
        """Drop this node's copy of a topic etcd no longer has (or has anew)."""
        await self._drop_roles(name)
        try:
            await self._on_topic_deleted(name)
        except Exception:
            log.exception("deleting topic %s here failed", name)
            return
        self._seen = {r for r in self._seen if r[0] != name}
        self._idle = {r for r in self._idle if r[0] != name}
        await self._local_ids.forget(name)

    async def _assign_role(self, topic: Topic, ref: Ref, versioned: VersionedState) -> None:
        state = versioned.state
        role = self.roles.get(ref)
        partition = topic.partitions[ref[1]]
        if ref not in self._seen:
            # A partition opened from disk shows nothing until its role says how far it
            # is committed: its tail may be records no other replica has (Kafka starts
            # from a checkpointed high watermark; this node learns it from its leader,
            # or as leader once its followers have fetched).
            self._seen.add(ref)
            partition.replicate(_NOT_A_REPLICA, high_watermark=0)
        if state.leader == self.node_id and not self._current(self.node_id, state):
            # An earlier incarnation of this node led it: this one may lack what that one
            # had (an empty or rolled-back disk, a lost unfsynced tail). Only an election
            # (epoch + 1, below) makes it leader again.
            if role is not None:
                await self._drop_role(ref)
            return
        follows = (
            self.node_id in state.replicas or ref[0] in self._observed
        ) and state.leader not in (None, self.node_id)
        if state.leader == self.node_id or follows:
            self._idle.discard(ref)
        if state.leader == self.node_id:
            if isinstance(role, LeaderRole) and role.epoch == state.epoch and not role.deposed:
                role.state = (
                    versioned if versioned.mod_revision > role.state.mod_revision else role.state
                )
                return
            await self._drop_role(ref)
            leader = LeaderRole(
                node_id=self.node_id,
                topic=topic,
                partition=partition,
                state=versioned,
                key=partition_key(self.name, *ref),
                etcd=self.etcd,
                holds_lease=self._lease_check(),
                lease=self.membership.lease_id,
                replica_lag_ms=self.settings.replica_lag_ms,
                counters=self.counters,
                live=lambda: self.membership.members.keys(),
                is_current=self.membership.is_current,
            )
            self.roles[ref] = leader
            self.counters.leader_changes += 1
            await leader.start()
        elif follows:
            # A follower (a replica), or an observer: a node that is not a replica but runs
            # a subscription of the topic or serves a tail of it copies the log the same
            # way, without counting in the ISR.
            assert state.leader is not None
            if (
                isinstance(role, FollowerRole)
                and role.epoch == state.epoch
                and role.leader == state.leader
                and not role.stopped
            ):
                return
            await self._drop_role(ref)
            follower = FollowerRole(
                node_id=self.node_id,
                topic=topic,
                partition=partition,
                leader=state.leader,
                epoch=state.epoch,
            )
            partition.replicate(follower)
            self.roles[ref] = follower
            session = self.sessions.get(state.leader)
            if session is None:
                session = self.sessions[state.leader] = FetchSession(
                    node_id=self.node_id,
                    leader=state.leader,
                    url_of=self.member_url,
                    headers=self._peer_headers,
                    incarnation=lambda: self.membership.incarnation,
                    trusted=self._peer_trusted,
                    verify=self._peer_verify,
                )
            session.add(follower)
        else:
            if role is not None:
                await self._drop_role(ref)
            if ref not in self._idle:
                self._idle.add(ref)
                partition.replicate(_NOT_A_REPLICA)

    async def _fenced_off(self) -> bool:
        """Past its lease, with etcd working for another node (cluster/fence.py)."""
        return not await self.fence.allows()

    def _peers_to_ask(self) -> tuple[dict[str, str], set[str]]:
        """Every other node known with a URL, and the live ones (which must answer)."""
        urls = {n: u for n, u in self.known_nodes().items() if n != self.node_id and u}
        return urls, set(self.membership.members) - {self.node_id}

    async def _fence_loop(self) -> None:
        """Stop what this node serves from its own copies the moment the fence says so
        (cut off alone, its lease still running; or its lease lapsed with no verdict) —
        from a timer, not from a reconcile pass that may be waiting on etcd: before
        another node can start a subscription's runtime (one coordinator at a time),
        this node's must have stopped."""
        serving = True
        while True:
            now = lease_clock_ms() / 1000
            until = self.membership.lease_valid_until() - now
            await asyncio.sleep(min(until, _FENCE_EVERY_S) if until > 0 else _FENCE_EVERY_S)
            failing = self.membership.failing_since()
            if failing is not None and lease_clock_ms() / 1000 - failing > _FENCE_EVERY_S:
                # Renewals go unanswered: keep the verdict fresh, for when the lease lapses.
                try:
                    await self.fence.refresh()
                except Exception:
                    log.exception("asking the other nodes for their renewals failed")
            now_serving = self.fence.serving()
            if serving and not now_serving:
                log.warning("fenced off: etcd works for another node, not for this one")
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
        host = self._host
        if host is None:
            return
        for name in sorted(host.running()):
            log.warning("subscription %s: stopped, this node may no longer coordinate it", name)
            self._adopted.pop(name, None)
            await host.release(name)
            self._cursors.pop(name, None)

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
        held = self._local_ids.get(topic) or self.topic_ids.get(topic)
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
        if failed is None or lease_clock_ms() / 1000 - failed > _TOPIC_CHECK_S:
            return None
        return failed

    def _compacts(self) -> bool:
        """One live node compacts etcd's history: the one with the smallest id."""
        live = self.membership.members
        return self.membership.holds_lease() and bool(live) and min(live) == self.node_id

    def _lease_check(self) -> Callable[[], bool]:
        """True while this node holds the lease it holds now (not a later one)."""
        lease = self.membership.lease_id
        membership = self.membership

        def holds() -> bool:
            return membership.lease_id == lease and membership.holds_lease()

        return holds

    async def _drop_role(self, ref: Ref) -> None:
        role = self.roles.pop(ref, None)
        if isinstance(role, LeaderRole):
            role.depose()
        elif isinstance(role, FollowerRole):
            session = self.sessions.get(role.leader)
            if session is not None:
                session.remove(ref)

    async def _drop_roles(self, topic: str) -> None:
        for ref in [r for r in self.roles if r[0] == topic]:
            await self._drop_role(ref)

    def _current(self, node: str | None, state: PartitionState) -> bool:
        """Whether ``node`` is live as the incarnation ``state`` records for it."""
        return node is not None and self.membership.is_current(node, state.incarnation_of(node))

    def _takeover(
        self, ref: Ref, versioned: VersionedState, members: Mapping[str, Member]
    ) -> Change | None:
        state = versioned.state
        if state.leader is not None and self._current(state.leader, state):
            self._leaderless_since.pop(ref, None)
            return None
        now = lease_clock_ms()
        since = self._leaderless_since.setdefault(ref, now)
        if self.node_id not in state.isr or not self.membership.holds_lease():
            return None
        me = self.membership.incarnation
        current = [
            r
            for r in state.replicas
            if r in state.isr and r != state.leader and self._current(r, state)
        ]
        if current:
            # Ordinary failover: a current ISR member has every committed record.
            if self.node_id not in current:
                return None
            if current[0] != self.node_id and now - since < _FAILOVER_PAUSE_MS:
                return None
            incarnations = {r: state.incarnation_of(r) for r in current}
            new = PartitionState(
                state.replicas, self.node_id, state.epoch + 1, tuple(current), incarnations
            )
            return Change(partition_key(self.name, *ref), versioned, new)
        # No ISR member is current: each restarted (or is away). The most up-to-date of
        # them takes it, once every one is back and has said what its disk holds.
        isr = [r for r in state.replicas if r in state.isr]
        reported = {
            r: ends
            for r in isr
            if (ends := self.log_ends.get(r)) is not None
            and self.membership.is_current(r, ends.incarnation)
        }
        if most_up_to_date(ref, isr, reported) != self.node_id:
            return None
        new = PartitionState(
            state.replicas, self.node_id, state.epoch + 1, (self.node_id,), {self.node_id: me}
        )
        return Change(partition_key(self.name, *ref), versioned, new)

    def _guards(self, old: PartitionState, new: PartitionState) -> list[Compare]:
        """A takeover's guards: the old leader's incarnation gone, this one registered, and
        for an election among restarted members, each of them still the incarnation whose
        log ends were compared."""
        guards = failover_guards(self.name, old, self.node_id, self.membership.incarnation)
        if any(self._current(r, old) for r in old.isr if r != old.leader):
            return guards  # an ordinary failover: a current ISR member takes it
        for member in old.isr:
            ends = self.log_ends.get(member)
            if (
                member not in (self.node_id, old.leader)
                and ends is not None
                and self.membership.is_current(member, ends.incarnation)
            ):
                guards.append(
                    Compare.create_revision(node_key(self.name, member), "=", ends.incarnation)
                )
        return guards

    async def _take_over(self, changes: list[Change]) -> None:
        # One transaction per set of guards (the old leader's node key is one of them).
        by_guards: dict[tuple[Compare, ...], list[Change]] = {}
        for change in changes:
            guards = tuple(self._guards(change.expected.state, change.new))
            by_guards.setdefault(guards, []).append(change)
        for guards, group in by_guards.items():
            old = group[0].expected.state.leader
            for first in range(0, len(group), 100):
                chunk = group[first : first + 100]
                try:
                    outcome = await compare_and_set_all(self.etcd, chunk, guards=guards)
                except EtcdUnavailable as exc:
                    log.info("taking over from %s: %s", old, exc)
                    return
                if outcome.succeeded:
                    log.warning(
                        "took over %d partition(s) from %s: %s",
                        len(chunk),
                        old,
                        ", ".join(
                            c.key.rsplit("/", 2)[-2] + "/" + c.key.rsplit("/", 1)[-1] for c in chunk
                        ),
                    )
                for key, current in outcome.current.items():
                    if current is not None:
                        ref = _ref_of(key, partitions_prefix(self.name))
                        if ref is not None:
                            self.states[ref] = current
        self._dirty.set()

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

    # ------------------------------------------------------------------ subscriptions

    def bind_subscriptions(self, host: SubscriptionHost) -> None:
        """From now on run here the subscriptions this node coordinates."""
        self._host = host
        self._tasks.append(asyncio.create_task(self._cursor_loop(), name="herald-cluster-cursors"))
        self._dirty.set()

    def _topic_of(self, name: str) -> str | None:
        try:
            config = orjson.loads(self.subscriptions[name])
        except (KeyError, orjson.JSONDecodeError):
            return None
        topic = config.get("topic") if isinstance(config, dict) else None
        return topic if isinstance(topic, str) else None

    def _start_of(self, name: str) -> object:
        try:
            config = orjson.loads(self.subscriptions[name])
        except (KeyError, orjson.JSONDecodeError):
            return None
        return config.get("start") if isinstance(config, dict) else None

    def _observed_topics(self) -> set[str]:
        topics = {t for t, n in self._tails.items() if n > 0}
        for name in self.subscriptions:
            if self.coordinates(name):
                topic = self._topic_of(name)
                if topic is not None:
                    topics.add(topic)
        return topics

    def caught_up(self, topic: str) -> bool:
        """Whether every partition of ``topic`` here holds what its leader had committed
        when this node started copying it (or this node leads it, settled)."""
        local = self.storage.topic(topic)
        if local is None:
            return False
        for partition in local.partitions:
            role = self.roles.get((topic, partition.partition))
            if isinstance(role, LeaderRole):
                if not (role.active and role.replica.high_watermark_settled):
                    return False
            elif not (isinstance(role, FollowerRole) and role.caught_up):
                return False
        return True

    def coordinates(self, name: str) -> bool:
        """Whether this node is the subscription's coordinator, under its current lease."""
        coordinator = self.coordinators.get(name)
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

    def coordinator_url(self, name: str) -> str | None:
        """The URL of the subscription's live coordinator (None: none right now)."""
        coordinator = self.coordinators.get(name)
        return self.member_url(coordinator.node) if coordinator is not None else None

    async def _reconcile_subscriptions(self, members: Mapping[str, Member]) -> None:
        host = self._host
        if host is None:
            return
        if await self._fenced_off():
            # PROTOCOL §7: this node lost its lease while another holds one, so another
            # may coordinate its subscriptions now: it stops delivering them (consumers
            # get 1012 and reconnect elsewhere) rather than run two coordinators.
            for name in sorted(host.running()):
                log.warning("subscription %s: lease lost while another node holds one", name)
                self._adopted.pop(name, None)
                await host.release(name)
                self._cursors.pop(name, None)
            return
        now = lease_clock()
        live = sorted(members)
        for name in list(self.subscriptions):
            coordinator = self.coordinators.get(name)
            if coordinator is not None and coordinator.node in members:
                self._unclaimed_since.pop(name, None)
                continue
            since = self._unclaimed_since.setdefault(name, now)
            preferred = preferred_coordinator(name, live)
            if self.membership.holds_lease() and (
                preferred == self.node_id or now - since > CLAIM_PAUSE_S
            ):
                await self._claim(name)
        lease = self.membership.lease_id
        for name in sorted(host.running()):
            adopted, wanted = self._adopted.get(name), self.subscription_ids.get(name)
            if adopted is not None and wanted is not None and adopted[0] != wanted:
                # Deleted and created again (PROTOCOL §7): the runtime of the old one, its
                # cursor and config included, ends here; the new one starts afresh.
                log.warning("subscription %s was created again: the old one ends here", name)
                self._adopted.pop(name, None)
                await host.deleted(name)
                self._cursors.pop(name, None)
            elif adopted is not None and adopted[1] != lease:
                # Adopted under a lease this node lost: another node may have run it since
                # and moved its cursor on. Even if this node claimed it again, it starts
                # again from etcd's cursor, never writing its older one back.
                log.info("subscription %s was adopted under a lost lease: adopting it anew", name)
                self._adopted.pop(name, None)
                await host.release(name)
                self._cursors.pop(name, None)  # after: a save under way may have added one
        running = host.running()
        for name in sorted(self.subscriptions):
            mine = self.coordinates(name)
            if mine and name not in running:
                topic = self._topic_of(name)
                try:
                    cursor = await self.etcd.get(cursors_prefix(self.name) + name)
                    if (
                        cursor is None
                        and topic is not None
                        and self._start_of(name) != "earliest"
                        and not self.caught_up(topic)
                    ):
                        # A new subscription starts at "latest" (or a time) as the
                        # leaders have it: wait until this node's copies hold that (the
                        # next pass, within half a second, looks again).
                        continue
                    self._adopted[name] = (self.subscription_ids.get(name, 0), lease)
                    await host.adopt(
                        name, self.subscriptions[name], cursor.value if cursor else None
                    )
                    log.info("coordinating subscription %s", name)
                except EtcdUnavailable as exc:
                    log.info("taking subscription %s: %s", name, exc)
                except Exception:
                    log.exception("running subscription %s here failed", name)
            elif not mine and name in running:
                log.info("subscription %s is coordinated elsewhere now", name)
                self._adopted.pop(name, None)
                await host.release(name)
                self._cursors.pop(name, None)  # after: a save under way may have added one
        for name in running - set(self.subscriptions):
            self._adopted.pop(name, None)
            await host.deleted(name)
            self._cursors.pop(name, None)

    async def _claim(self, name: str) -> None:
        key = coordinators_prefix(self.name) + name
        try:
            result = await self.etcd.txn(
                [
                    Compare.version(key, "=", 0),
                    Compare.version(node_key(self.name, self.node_id), ">", 0),
                    Compare.version(subscriptions_prefix(self.name) + name, ">", 0),
                ],
                [Put.of(key, self.node_id, lease=self.membership.lease_id)],
                [Get.of(key)],
            )
        except EtcdUnavailable as exc:
            log.info("claiming subscription %s: %s", name, exc)
            return
        if result.succeeded:
            self.coordinators[name] = Coordinator(
                self.node_id, self.membership.lease_id, result.revision
            )
            self._dirty.set()

    def cursor_saved(self, name: str, cursor: bytes) -> None:
        """The engine persisted ``name``'s cursor: replicate it (the latest wins)."""
        self._cursors[name] = cursor
        self._cursor_wake.set()

    async def _cursor_loop(self) -> None:
        while True:
            await self._cursor_wake.wait()
            self._cursor_wake.clear()
            await self.flush_cursors()
            await asyncio.sleep(CURSOR_EVERY_S)

    async def flush_cursors(self) -> None:
        """Write the pending cursors to etcd, each only while this node coordinates it."""
        pending, self._cursors = self._cursors, {}
        lease = self.membership.lease_id
        for name, cursor in pending.items():
            key = coordinators_prefix(self.name) + name
            guards = [Compare.value(key, "=", self.node_id), Compare.lease(key, "=", lease)]
            adopted = self._adopted.get(name)
            if adopted is not None and adopted[1] != lease:
                continue  # a runtime of a lost lease: its cursor is not etcd's to take
            if adopted is not None and adopted[0]:
                # The cursor of the subscription as adopted, not of one created since.
                guards.append(
                    Compare.create_revision(subscriptions_prefix(self.name) + name, "=", adopted[0])
                )
            try:
                await self.etcd.txn(guards, [Put.of(cursors_prefix(self.name) + name, cursor)])
            except EtcdUnavailable as exc:
                log.info("replicating the cursor of %s: %s", name, exc)
                self._cursors.setdefault(name, cursor)  # the next round tries again

    def _sealed(self, key: str, config: bytes) -> bytes:
        """A subscription's config as etcd keeps it: sealed when the cluster has keys (its
        push secrets and url; cluster/trust.py)."""
        return self._keys.seal(key, config) if self._keys is not None else config

    def _unsealed(self, key: str, value: bytes) -> bytes | None:
        if self._keys is None:
            if value.startswith(SEALED):
                log.error("etcd key %s is sealed and this node has no cluster secret", key)
                return None
            return value
        try:
            return self._keys.unseal(key, value)
        except SealError as exc:
            log.error("%s: is --cluster-secret-file the same on every node?", exc)
            return None

    async def create_subscription(self, name: str, config: bytes) -> bool:
        """Write a new subscription's config; False if one exists."""
        key = subscriptions_prefix(self.name) + name
        result = await self.etcd.txn(
            [Compare.version(key, "=", 0)], [Put.of(key, self._sealed(key, config))]
        )
        if result.succeeded:
            self.subscriptions[name] = config
            self._dirty.set()
        return result.succeeded

    async def store_subscription(self, name: str, config: bytes) -> None:
        """The coordinator changed a subscription in place: its config in etcd follows."""
        key = subscriptions_prefix(self.name) + name
        coordinator = coordinators_prefix(self.name) + name
        await self.etcd.txn(
            [Compare.version(key, ">", 0), Compare.value(coordinator, "=", self.node_id)],
            [Put.of(key, self._sealed(key, config))],
        )

    async def delete_subscription(self, name: str) -> bool:
        """Delete a subscription's config, coordinator and cursor; False if none."""
        key = subscriptions_prefix(self.name) + name
        result = await self.etcd.txn(
            [Compare.version(key, ">", 0)],
            [
                Delete.of(key),
                Delete.of(coordinators_prefix(self.name) + name),
                Delete.of(cursors_prefix(self.name) + name),
            ],
        )
        if result.succeeded:
            self.subscriptions.pop(name, None)
            self._dirty.set()
        return result.succeeded

    async def wait_coordinated(self, name: str) -> str | None:
        """Wait (bounded) until the subscription has a live coordinator; its URL."""
        await self.wait_applied(lambda: self.coordinator_url(name) is not None)
        return self.coordinator_url(name)

    def tail_opened(self, topic: str) -> None:
        self._tails[topic] = self._tails.get(topic, 0) + 1
        self._dirty.set()

    def tail_closed(self, topic: str) -> None:
        left = self._tails.get(topic, 0) - 1
        if left > 0:
            self._tails[topic] = left
        else:
            self._tails.pop(topic, None)
        self._dirty.set()

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
        if leader is None or not self._current(leader, versioned.state):
            return PartitionView(versioned.state, None)
        return PartitionView(versioned.state, self.member_url(leader))

    def leader_role(self, topic: str, partition: int) -> LeaderRole | None:
        role = self.roles.get((topic, partition))
        return role if isinstance(role, LeaderRole) and not role.deposed else None

    def leads(self, topic: str, partition: int) -> bool:
        role = self.leader_role(topic, partition)
        # Not a role given under a lease this node has lost since (it registered again):
        # another node may have led the partition meanwhile, and the next reconcile pass
        # drops it (the seed-12 nemesis run: reads just after a re-registration).
        return role is not None and role.active and role.lease == self.membership.lease_id

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
            for subscription in [s for s in self.subscriptions if self._topic_of(s) == name]:
                await self.delete_subscription(subscription)
        await self.wait_applied(lambda: self.storage.topic(name) is None)
        return deleted

    # ------------------------------------------------------------------ the leader's side

    async def serve_fetch(self, request: Request) -> bytes:
        """One fetch request of a follower node: answered when something is ready for one
        of its partitions, or after its long poll."""
        epochs = []
        for query in request.epochs:
            role = self.leader_role(query.topic, query.partition)
            if role is None:
                answer = EpochAnswer(
                    self._no_role_error(query.topic, query.partition, query.leader_epoch), -1, -1, 0
                )
            else:
                answer = role.answer_epoch(query)
            epochs.append((query, answer))
        noted: list[tuple[FetchRequest, LeaderRole | None, FetchError | None]] = []
        for entry in request.fetch:
            fetch = entry.request
            role = self.leader_role(fetch.topic, fetch.partition)
            if role is None:
                noted.append(
                    (fetch, None, self._no_role_error(fetch.topic, fetch.partition, fetch.epoch))
                )
            else:
                noted.append(
                    (fetch, role, role.note_fetch(request.node, fetch, request.incarnation))
                )
        if not epochs and request.max_wait_ms > 0 and all(e is None for _, _, e in noted):
            await self._long_poll(request)
        fetches = []
        for fetch, role, error in noted:
            if role is None:
                fetches.append((fetch, FetchResponse(error, b"", 0, 0)))
            else:
                fetches.append((fetch, await role.answer_fetch(fetch, error)))
        return encode_answer(epochs, fetches)

    def _no_role_error(self, topic: str, partition: int, epoch: int) -> FetchError:
        versioned = self.states.get((topic, partition))
        if versioned is not None and epoch > versioned.state.epoch:
            return FetchError.UNKNOWN_LEADER_EPOCH  # etcd has news this node has not seen
        if (
            versioned is not None
            and epoch == versioned.state.epoch
            and versioned.state.leader == self.node_id
        ):
            return FetchError.UNKNOWN_LEADER_EPOCH  # becoming leader right now
        return FetchError.FENCED_LEADER_EPOCH

    async def _long_poll(self, request: Request) -> None:
        waits = []
        for entry in request.fetch:
            role = self.leader_role(entry.request.topic, entry.request.partition)
            if role is None or role.ready(entry.request, entry.high_watermark):
                return
            waits.append(role.changed.wait())
        if not waits:
            return
        # The first partition with news answers the request (asyncio.wait's default waits
        # for all: every publish then took a whole long poll once a node followed two).
        await asyncio.wait(
            waits, timeout=request.max_wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED
        )

    # ------------------------------------------------------------------ reports

    def replication_report(self) -> list[dict[str, object]]:
        """The partitions this node leads, as their leader sees them."""
        return [
            role.report()
            for ref, role in sorted(self.roles.items())
            if isinstance(role, LeaderRole) and not role.deposed
        ]

    def partition_summary(self, topic: str, partition: int) -> dict[str, object]:
        """leader/epoch/replicas/isr of GET /v1/topics/{topic} (PROTOCOL §7)."""
        view = self.view(topic, partition)
        if view is None:
            return {"leader": None, "epoch": 0, "replicas": [], "isr": []}
        return {
            "leader": view.live_leader,
            "epoch": view.state.epoch,
            "replicas": list(view.state.replicas),
            "isr": list(view.state.isr),
        }

    def require_leader(self, topic: str, partition: int) -> PartitionView:
        view = self.view(topic, partition)
        if view is None or view.live_leader is None:
            raise LeaderUnavailable(f"partition {topic}/{partition} has no live leader")
        return view

    @property
    def nodes_prefix(self) -> str:
        return nodes_prefix(self.name)


async def _no_answers(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
    return {}  # no way to ask the other nodes: only a node alone serves past its lease


class _NotAReplica:
    """The hooks of a partition this node does not replicate: it takes no appends."""

    epoch = 0

    def check_append(self, acks: object) -> None:
        raise LeaderUnavailable("this node does not replicate the partition")

    async def wait_commit(self, end_offset: int, acks: object) -> None:
        raise LeaderUnavailable("this node does not replicate the partition")


_NOT_A_REPLICA = _NotAReplica()


def _ref_of(key: str, prefix: str) -> Ref | None:
    if not key.startswith(prefix):
        return None
    name, _, number = key[len(prefix) :].rpartition("/")
    return (name, int(number)) if number.isdigit() else None
