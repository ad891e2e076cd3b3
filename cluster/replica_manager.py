"""The replicas this node holds (Kafka's ReplicaManager): its local copy of every topic
etcd has, and each partition's role in it.

- a topic in etcd and not on disk is created locally (every node opens every topic; a
  partition it does not replicate stays empty, and its reads go to the leader); a topic
  on disk and not in etcd is deleted; a copy whose topic id (cluster/topic_ids.py) is
  not etcd's is of a topic deleted and created again meanwhile, and goes before
  anything reads it;
- a partition this node leads gets a :class:`LeaderRole` (cluster/leading.py), one it
  follows a :class:`FollowerRole` on the :class:`FetchSession` to its leader's node
  (cluster/following.py), one it does not replicate neither;
- every role is held as one *incarnation* of this node (cluster/state.py): a partition
  an earlier incarnation led is led again only through an election (cluster/elections.py);
- a node that is not a replica but runs a subscription of the topic or serves a tail of
  it *observes* the partition: it copies the log as a follower does, without counting
  in the ISR.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection

from cluster.elections import is_current
from cluster.errors import LeaderUnavailable
from cluster.etcd import EtcdClient
from cluster.following import FetchSession, FollowerRole
from cluster.leading import Counters, LeaderRole
from cluster.membership import Membership
from cluster.metadata import MetadataView
from cluster.state import VersionedState, partition_key
from cluster.topic_ids import LocalTopicIds
from storage.config import TopicConfig
from storage.engine import Storage
from storage.topic import Topic

log = logging.getLogger("herald.cluster")

Ref = tuple[str, int]  # (topic, partition)


class ReplicaManager:
    def __init__(
        self,
        storage: Storage,
        *,
        node_id: str,
        cluster: str,
        etcd: EtcdClient,
        membership: Membership,
        replica_lag_ms: int,
        on_topic_deleted: Callable[[str], Awaitable[None]],
        url_of: Callable[[str], str | None],
        peer_headers: dict[str, str],
        peer_trusted: Callable[[str], Awaitable[bool]] | None,
        peer_verify: ssl.SSLContext | bool,
    ) -> None:
        self.storage = storage
        self.node_id = node_id
        self.cluster = cluster
        self.etcd = etcd
        self.membership = membership
        self.replica_lag_ms = replica_lag_ms
        self._on_topic_deleted = on_topic_deleted
        self._url_of = url_of
        self._peer_headers = peer_headers
        # Whether a URL proved it is a node before the cluster token goes there, and the
        # peers' CA (cluster/trust.py): for the fetch sessions to leaders.
        self._peer_trusted = peer_trusted
        self._peer_verify = peer_verify
        self.counters = Counters()
        self._local_ids = LocalTopicIds(storage.data_dir)  # which topic ids the disk holds
        self.roles: dict[Ref, LeaderRole | FollowerRole] = {}
        self.sessions: dict[str, FetchSession] = {}
        self._idle: set[Ref] = set()  # partitions this node does not replicate
        self._seen: set[Ref] = set()  # partitions given a role at least once
        self._tails: dict[str, int] = {}  # topic -> tails open here (they need the data)

    # ------------------------------------------------------------------ local topics

    def local_id(self, topic: str) -> int | None:
        """The id of the topic this node's copy of ``topic`` is of (None: not recorded)."""
        return self._local_ids.get(topic)

    async def sync_topics(self, view: MetadataView) -> dict[str, TopicConfig]:
        """Make the local topics those of etcd; the topics it went by."""
        topics = dict(view.topics)
        for name, config in topics.items():
            local = self.storage.topic(name)
            wanted, held = view.topic_ids.get(name, 0), self._local_ids.get(name)
            if local is not None and wanted and held is not None and held != wanted:
                # Deleted and created again while this node looked away: its copy is of
                # another topic, and goes before anything reads it.
                log.warning("topic %s was created again (id %d, here %d)", name, wanted, held)
                await self.forget_topic(name)
                local = None
            auto_created = name in view.auto_created_topics
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
        if view.loaded:
            for topic in self.storage.topics():
                if topic.name not in topics and topic.name not in view.unreadable_topics:
                    await self.forget_topic(topic.name)
        return topics

    async def forget_topic(self, name: str) -> None:
        """Drop this node's copy of a topic etcd no longer has (or has anew)."""
        await self.drop_roles(name)
        try:
            await self._on_topic_deleted(name)
        except Exception as exc:
            if self.storage.topic(name) is not None:
                log.exception("deleting topic %s here failed (tried again next pass)", name)
                return
            # Gone all the same: a failing disk fails the close's fsync, and the storage
            # removes the files whatever the close raised (storage/engine.py).
            log.warning("topic %s deleted here, its close failing: %s", name, exc)
        self._seen = {r for r in self._seen if r[0] != name}
        self._idle = {r for r in self._idle if r[0] != name}
        await self._local_ids.forget(name)

    # ------------------------------------------------------------------ roles

    async def assign_role(
        self, topic: Topic, ref: Ref, versioned: VersionedState, observed: Collection[str]
    ) -> None:
        state = versioned.state
        role = self.roles.get(ref)
        partition = topic.partitions[ref[1]]
        topic_id = self._local_ids.get(ref[0]) or 0  # which topic this copy is of
        if ref not in self._seen:
            # A partition opened from disk shows nothing until its role says how far it
            # is committed: its tail may be records no other replica has (Kafka starts
            # from a checkpointed high watermark; this node learns it from its leader,
            # or as leader once its followers have fetched).
            self._seen.add(ref)
            partition.replicate(_NOT_A_REPLICA, high_watermark=0)
        if state.leader == self.node_id and not is_current(self.membership, self.node_id, state):
            # An earlier incarnation of this node led it: this one may lack what that one
            # had (an empty or rolled-back disk, a lost unfsynced tail). Only an election
            # (epoch + 1, cluster/elections.py) makes it leader again.
            if role is not None:
                await self.drop_role(ref)
            return
        led_elsewhere = state.leader not in (None, self.node_id)
        follows = (self.node_id in state.replicas or ref[0] in observed) and led_elsewhere
        if state.leader == self.node_id or follows:
            self._idle.discard(ref)
        if state.leader == self.node_id:
            if (
                isinstance(role, LeaderRole)
                and role.epoch == state.epoch
                and not role.deposed
                and role.topic_id == topic_id
            ):
                role.state = (
                    versioned if versioned.mod_revision > role.state.mod_revision else role.state
                )
                return
            await self.drop_role(ref)
            leader = LeaderRole(
                node_id=self.node_id,
                topic=topic,
                partition=partition,
                state=versioned,
                key=partition_key(self.cluster, *ref),
                etcd=self.etcd,
                holds_lease=self._lease_check(),
                lease=self.membership.lease_id,
                replica_lag_ms=self.replica_lag_ms,
                counters=self.counters,
                live=lambda: self.membership.members.keys(),
                is_current=self.membership.is_current,
                topic_id=topic_id,
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
                and role.replica.topic_id == topic_id
            ):
                return
            await self.drop_role(ref)
            follower = FollowerRole(
                node_id=self.node_id,
                topic=topic,
                partition=partition,
                leader=state.leader,
                epoch=state.epoch,
                topic_id=topic_id,
            )
            partition.replicate(follower)
            self.roles[ref] = follower
            self._session_to(state.leader).add(follower)
        else:
            if role is not None:
                await self.drop_role(ref)
            if ref not in self._idle:
                self._idle.add(ref)
                partition.replicate(_NOT_A_REPLICA)

    def _session_to(self, leader: str) -> FetchSession:
        """The one fetch session to ``leader``'s node, for every partition it leads."""
        session = self.sessions.get(leader)
        if session is None:
            session = self.sessions[leader] = FetchSession(
                node_id=self.node_id,
                leader=leader,
                url_of=self._url_of,
                headers=self._peer_headers,
                incarnation=lambda: self.membership.incarnation,
                trusted=self._peer_trusted,
                verify=self._peer_verify,
            )
        return session

    def _lease_check(self) -> Callable[[], bool]:
        """True while this node holds the lease it holds now (not a later one)."""
        lease = self.membership.lease_id
        membership = self.membership

        def holds() -> bool:
            return membership.lease_id == lease and membership.holds_lease()

        return holds

    async def drop_role(self, ref: Ref) -> None:
        role = self.roles.pop(ref, None)
        if isinstance(role, LeaderRole):
            role.depose()
        elif isinstance(role, FollowerRole):
            session = self.sessions.get(role.leader)
            if session is not None:
                session.remove(ref)

    async def drop_roles(self, topic: str) -> None:
        for ref in [r for r in self.roles if r[0] == topic]:
            await self.drop_role(ref)

    async def drop_leader_roles(self) -> None:
        for ref in [r for r, role in self.roles.items() if isinstance(role, LeaderRole)]:
            await self.drop_role(ref)

    async def drop_unknown(self, states: Collection[Ref], topics: Collection[str]) -> None:
        """Drop the roles of partitions etcd no longer has."""
        for ref in [r for r in self.roles if r not in states or r[0] not in topics]:
            await self.drop_role(ref)
        self._idle = {r for r in self._idle if r[0] in topics}
        self._seen = {r for r in self._seen if r[0] in topics}

    async def run_ticks(self) -> None:
        """The leaders' ISR checks, a few times per ``replica_lag_ms``."""
        interval = max(0.05, self.replica_lag_ms / 4000)
        while True:
            await asyncio.sleep(interval)
            for role in list(self.roles.values()):
                if isinstance(role, LeaderRole):
                    try:
                        role.tick()
                    except Exception:
                        log.exception("ISR check of %s failed", role.key)

    async def close(self) -> None:
        for role in self.roles.values():
            if isinstance(role, LeaderRole):
                role.depose()
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)

    # ------------------------------------------------------------------ tails

    def tail_opened(self, topic: str) -> None:
        self._tails[topic] = self._tails.get(topic, 0) + 1

    def tail_closed(self, topic: str) -> None:
        left = self._tails.get(topic, 0) - 1
        if left > 0:
            self._tails[topic] = left
        else:
            self._tails.pop(topic, None)

    def tailed_topics(self) -> set[str]:
        return {t for t, n in self._tails.items() if n > 0}

    # ------------------------------------------------------------------ queries

    def leader_role(self, topic: str, partition: int) -> LeaderRole | None:
        role = self.roles.get((topic, partition))
        return role if isinstance(role, LeaderRole) and not role.deposed else None

    def leads(self, topic: str, partition: int) -> bool:
        role = self.leader_role(topic, partition)
        # Not a role given under a lease this node has lost since (it registered again):
        # another node may have led the partition meanwhile, and the next reconcile pass
        # drops it (the seed-12 nemesis run: reads just after a re-registration).
        return role is not None and role.active and role.lease == self.membership.lease_id

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

    def replication_report(self) -> list[dict[str, object]]:
        """The partitions this node leads, as their leader sees them."""
        return [
            role.report()
            for ref, role in sorted(self.roles.items())
            if isinstance(role, LeaderRole) and not role.deposed
        ]


class _NotAReplica:
    """The hooks of a partition this node does not replicate: it takes no appends."""

    epoch = 0

    def check_append(self, acks: object) -> None:
        raise LeaderUnavailable("this node does not replicate the partition")

    async def wait_commit(self, end_offset: int, acks: object) -> None:
        raise LeaderUnavailable("this node does not replicate the partition")


_NOT_A_REPLICA = _NotAReplica()
