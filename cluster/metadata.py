"""This node's mirror of the cluster's state in etcd (Kafka's metadata cache): every key
under ``/herald/<cluster>/`` that the node acts on, read in full once and then followed
by a watch.

etcd holds the truth; the mirror only *reads* it. What it keeps:

- topic configs, each topic's id (its key's create revision: a name deleted and created
  again is a new topic, PROTOCOL §7) and the auto-created mark; a config that does not
  parse is remembered as unreadable, never as deleted (its local copy stays);
- per partition its :class:`VersionedState` (cluster/state.py);
- what each node's incarnation found on its disk (cluster/log_ends.py);
- subscription configs (unsealed with the cluster's keys, cluster/trust.py), each one's
  id (create revision), and who coordinates each (cluster/coordination.py).

Every change it applies calls ``changed`` (the node then reconciles). The watch never
ends on its own: on a compacted revision, or on any error but etcd being away, it reads
the whole state afresh and follows on from there.

A watch event at or below the revision of the latest full read changes nothing: that
read already holds its effect. The node reads the state afresh when its lease is new
(cluster/node.py) while the watch goes on from where etcd last answered it, so the watch
can replay what that read already saw. Applied, a replayed delete of a topic that was
created again since would have removed the new topic, and its records with it (issue
25: a nemesis run lost 20 records acknowledged at ``acks=all`` that way).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cluster.coordination import Coordinator, coordinators_prefix, subscriptions_prefix
from cluster.etcd import EtcdClient, EtcdUnavailable, KeyValue, WatchCompacted
from cluster.etcd_watch import EventType
from cluster.log_ends import LogEnds, log_ends_prefix
from cluster.state import InvalidState, VersionedState
from cluster.topics import (
    auto_created_from_json,
    cluster_prefix,
    config_from_json,
    partitions_prefix,
    topics_prefix,
)
from cluster.trust import SEALED, ClusterKeys, SealError
from storage.config import TopicConfig

log = logging.getLogger("herald.cluster")

Ref = tuple[str, int]  # (topic, partition)
_RETRY_S = 0.5  # after etcd did not answer a read or the watch


class MetadataView:
    def __init__(
        self,
        etcd: EtcdClient,
        cluster: str,
        *,
        keys: ClusterKeys | None,
        changed: Callable[[], None],
    ) -> None:
        self.etcd = etcd
        self.cluster = cluster
        self._keys = keys
        self._changed = changed
        self.topics: dict[str, TopicConfig] = {}  # from etcd
        self.topic_ids: dict[str, int] = {}  # from etcd: each topic key's create revision
        self.unreadable_topics: set[str] = set()  # keys in etcd that do not parse
        # docs/protocol.md "Auto-created topics": the mark the creating node wrote in etcd.
        self.auto_created_topics: set[str] = set()
        self.states: dict[Ref, VersionedState] = {}  # from etcd
        self.loaded = False
        self.log_ends: dict[str, LogEnds] = {}  # node -> what its incarnation found on disk
        # Subscriptions (cluster/coordination.py): configs, and who coordinates each.
        self.subscriptions: dict[str, bytes] = {}
        self.subscription_ids: dict[str, int] = {}  # each config key's create revision
        self.coordinators: dict[str, Coordinator] = {}
        self.read_at = 0  # the revision of the latest full read
        self._reading = asyncio.Lock()  # one full read at a time
        # The changes the watch applies while a full read is on its way (see load()).
        self._applied_meanwhile: list[tuple[KeyValue, bool]] | None = None

    async def load(self) -> int:
        """Read the whole state afresh; the revision it was read at.

        The watch goes on meanwhile (a node reads afresh when its lease is new), and may
        apply a change newer than the read before the read's answer arrives: that change
        is applied again on top of the read, or the read would erase it for good (the
        watch does not deliver it twice). A node that lost another's log-ends report this
        way after an etcd outage waited for it forever, and no one led its partitions
        again.
        """
        async with self._reading:
            applied_meanwhile: list[tuple[KeyValue, bool]] = []
            self._applied_meanwhile = applied_meanwhile
            try:
                result = await self.etcd.range(cluster_prefix(self.cluster), prefix=True)
            finally:
                self._applied_meanwhile = None
            self._replace(result.kvs, result.revision)
            for kv, deleted in applied_meanwhile:
                if kv.mod_revision > result.revision:
                    self.apply(kv, deleted=deleted)
            return result.revision

    def _replace(self, kvs: tuple[KeyValue, ...], revision: int) -> None:
        topics: dict[str, TopicConfig] = {}
        states: dict[Ref, VersionedState] = {}
        self.subscriptions, self.coordinators = {}, {}
        self.subscription_ids, self.topic_ids = {}, {}
        self.unreadable_topics = set()
        self.auto_created_topics = set()
        self.log_ends = {}
        for kv in kvs:
            self._read_kv(kv.key.decode(errors="replace"), kv, topics, states)
        self.topics, self.states, self.loaded = topics, states, True
        self.read_at = max(self.read_at, revision)

    def apply(self, kv: KeyValue, *, deleted: bool = False) -> None:
        """One change etcd reported (a watch event; for a delete, ``kv.mod_revision`` is
        the deletion's). Nothing, if the latest full read already saw it."""
        if kv.mod_revision <= self.read_at:
            return
        if self._applied_meanwhile is not None:
            self._applied_meanwhile.append((kv, deleted))
        self._read_kv(kv.key.decode(errors="replace"), kv, self.topics, self.states, deleted)

    def _read_kv(
        self,
        key: str,
        kv: KeyValue,
        topics: dict[str, TopicConfig],
        states: dict[Ref, VersionedState],
        deleted: bool = False,
    ) -> None:
        if key.startswith(log_ends_prefix(self.cluster)):
            node = key[len(log_ends_prefix(self.cluster)) :]
            reported = None if deleted else LogEnds.from_json(node, kv.value)
            if reported is None:
                self.log_ends.pop(node, None)
            else:
                self.log_ends[node] = reported
        elif key.startswith(topics_prefix(self.cluster)):
            self._read_topic(key, kv, topics, states, deleted)
        elif key.startswith(subscriptions_prefix(self.cluster)):
            name = key[len(subscriptions_prefix(self.cluster)) :]
            if deleted:
                self.subscriptions.pop(name, None)
                self.subscription_ids.pop(name, None)
            elif (unsealed := self.unsealed(key, kv.value)) is not None:
                self.subscriptions[name] = unsealed
                self.subscription_ids[name] = kv.create_revision
        elif key.startswith(coordinators_prefix(self.cluster)):
            name = key[len(coordinators_prefix(self.cluster)) :]
            if deleted:
                self.coordinators.pop(name, None)
            else:
                current = self.coordinators.get(name)
                if current is None or kv.mod_revision >= current.mod_revision:
                    self.coordinators[name] = Coordinator(
                        kv.value.decode(errors="replace"), kv.lease, kv.mod_revision
                    )
        elif key.startswith(partitions_prefix(self.cluster)):
            self._read_partition(key, kv, states, deleted)

    def _read_topic(
        self,
        key: str,
        kv: KeyValue,
        topics: dict[str, TopicConfig],
        states: dict[Ref, VersionedState],
        deleted: bool,
    ) -> None:
        name = key[len(topics_prefix(self.cluster)) :]
        if deleted:
            topics.pop(name, None)
            self.topic_ids.pop(name, None)
            self.unreadable_topics.discard(name)
            self.auto_created_topics.discard(name)
            for ref in [r for r in states if r[0] == name]:
                del states[ref]
            return
        config = config_from_json(kv.value)
        if config is None:
            # Not a reason to delete anything: the topic keeps its local copy.
            log.error("etcd key %s is not a topic config", key)
            self.unreadable_topics.add(name)
        else:
            self.unreadable_topics.discard(name)
            topics[name] = config
            self.topic_ids[name] = kv.create_revision
            if auto_created_from_json(kv.value):
                self.auto_created_topics.add(name)
            else:
                self.auto_created_topics.discard(name)

    def _read_partition(
        self, key: str, kv: KeyValue, states: dict[Ref, VersionedState], deleted: bool
    ) -> None:
        rest = key[len(partitions_prefix(self.cluster)) :]
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
            if known is None or versioned.mod_revision >= known.mod_revision:
                states[ref] = versioned
        except InvalidState as exc:
            log.error("etcd key %s: %s", key, exc)

    async def follow(self, revision: int) -> None:
        """Apply every change from ``revision`` on, for as long as the node runs."""
        while True:
            try:
                async with self.etcd.watch(
                    cluster_prefix(self.cluster), prefix=True, start_revision=revision
                ) as watch:
                    async for event in watch:
                        self.apply(event.kv, deleted=event.type is EventType.DELETE)
                        revision = watch.next_revision
                        self._changed()
            except WatchCompacted:
                revision = await self._reload_when_possible()
            except EtcdUnavailable as exc:
                log.info("cluster watch interrupted: %s", exc)
                await asyncio.sleep(_RETRY_S)
            except Exception:
                # Never end silently: a node that stops following etcd would act on an
                # ever older view. Read it afresh and follow on.
                log.exception("cluster watch failed; reading the state afresh")
                await asyncio.sleep(_RETRY_S)
                revision = await self._reload_when_possible()

    async def _reload_when_possible(self) -> int:
        while True:
            try:
                revision = await self.load()
                self._changed()
                return revision + 1
            except EtcdUnavailable:
                await asyncio.sleep(_RETRY_S)

    def sealed(self, key: str, config: bytes) -> bytes:
        """A subscription's config as etcd keeps it: sealed when the cluster has keys (its
        push secrets and url; cluster/trust.py)."""
        return self._keys.seal(key, config) if self._keys is not None else config

    def unsealed(self, key: str, value: bytes) -> bytes | None:
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
