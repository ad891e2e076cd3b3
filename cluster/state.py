"""A partition's replication state in etcd, and its only way to change: compare-and-set.

PROTOCOL §7: each partition has ``replicas`` (node ids, the leader first when it was
assigned), a ``leader`` (``None`` while no live leader is known), an ``epoch`` and the
in-sync replicas ``isr``. It lives at ``/herald/<cluster>/partitions/<topic>/<n>`` as
JSON, and every change is a transaction that compares the key's mod revision with the
one the writer read (the conditional write Kafka made on ZooKeeper): of two nodes
acting on the same view, one wins and the other re-reads.

The epoch goes up by exactly 1 at each change of leader, and only then — checked here,
once, for every write.

**Incarnations** (PROTOCOL §7, "restarts are new incarnations"; Kafka's broker epochs,
KIP-380/903): ``incarnations`` names, for the leader and each ISR member, the
registration of its node under which it took that part — the create revision of its
node key (cluster/membership.py). A node that registered again since (a restart, however
quick, or a lease that lapsed) is a new incarnation: it may have lost its disk or an
unfsynced tail, so it neither leads nor counts in the ISR under its old entry. It leads
again only through an election (epoch + 1) and rejoins the ISR once it has caught up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from cluster.etcd import Compare, EtcdClient, Get, KeyValue, Put, RangeResult
from cluster.membership import node_key


class InvalidState(ValueError):
    """A partition state that breaks its own rules (or bytes in etcd that are not one)."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[str, ...]
    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    # node id -> the incarnation it holds its part under (leader and ISR members; a
    # missing entry is an unknown incarnation, never a current one)
    incarnations: Mapping[str, int] = field(default_factory=dict, compare=True, hash=False)

    def __post_init__(self) -> None:
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise InvalidState(f"replicas must be distinct node ids, not {self.replicas!r}")
        if len(set(self.isr)) != len(self.isr) or not set(self.isr) <= set(self.replicas):
            raise InvalidState(f"isr {self.isr!r} must be distinct replicas of {self.replicas!r}")
        if self.epoch < 0:
            raise InvalidState(f"epoch {self.epoch} is negative")
        if self.leader is not None and self.leader not in self.isr:
            raise InvalidState(f"leader {self.leader!r} is not in the isr {self.isr!r}")
        if not set(self.incarnations) <= set(self.replicas):
            raise InvalidState(
                f"incarnations of nodes that are not replicas: {self.incarnations!r}"
            )

    def incarnation_of(self, node: str) -> int:
        """The incarnation ``node`` holds its part under (0: unknown)."""
        return self.incarnations.get(node, 0)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "replicas": list(self.replicas),
                "leader": self.leader,
                "epoch": self.epoch,
                "isr": list(self.isr),
                "incarnations": {n: self.incarnations[n] for n in sorted(self.incarnations)},
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> PartitionState:
        try:
            raw: Any = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidState(f"not JSON: {data[:200]!r}") from exc
        if not isinstance(raw, dict):
            raise InvalidState(f"not an object: {data[:200]!r}")
        replicas, isr = raw.get("replicas"), raw.get("isr")
        leader, epoch = raw.get("leader"), raw.get("epoch")
        if not (isinstance(replicas, list) and isinstance(isr, list)):
            raise InvalidState(f"replicas and isr must be lists: {data[:200]!r}")
        if not (_names(replicas) and _names(isr)):
            raise InvalidState(f"replicas and isr must be lists of node ids: {data[:200]!r}")
        if not (leader is None or isinstance(leader, str)):
            raise InvalidState(f"leader must be a node id or null: {data[:200]!r}")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise InvalidState(f"epoch must be an integer: {data[:200]!r}")
        incarnations = raw.get("incarnations", {})
        if not isinstance(incarnations, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in incarnations.values()
        ):
            raise InvalidState(f"incarnations must map node ids to revisions: {data[:200]!r}")
        return cls(tuple(replicas), leader, epoch, tuple(isr), dict(incarnations))

    def led_by(self, leader: str | None) -> PartitionState:
        """The same partition under a new leader: the next epoch."""
        return PartitionState(self.replicas, leader, self.epoch + 1, self.isr, self.incarnations)

    def with_isr(
        self, isr: Sequence[str], incarnations: Mapping[str, int] | None = None
    ) -> PartitionState:
        """The ISR grown or shrunk, same leader, same epoch; ``incarnations`` gives those
        of members that join (the others keep theirs; those that leave lose theirs)."""
        known = {**self.incarnations, **(incarnations or {})}
        kept = {n: known[n] for n in isr if n in known}
        return PartitionState(self.replicas, self.leader, self.epoch, tuple(isr), kept)


def _names(values: list[Any]) -> bool:
    return all(isinstance(v, str) and v for v in values)


def check_transition(old: PartitionState, new: PartitionState) -> None:
    """PROTOCOL §7: the epoch goes up by exactly 1 at each change of leader — a new
    incarnation of the same node included — and only then."""
    if new.leader != old.leader and new.epoch != old.epoch + 1:
        raise InvalidState(f"a new leader needs epoch {old.epoch + 1}, not {new.epoch}")
    if new.leader == old.leader and new.epoch != old.epoch:
        # "Restarts are new incarnations": the same node elected again as a new
        # incarnation is a change of leader too (epoch + 1).
        again = new.leader is not None and new.incarnation_of(new.leader) != old.incarnation_of(
            old.leader or ""
        )
        if not (again and new.epoch == old.epoch + 1):
            raise InvalidState(
                f"the epoch changes only with the leader ({old.epoch} → {new.epoch})"
            )


def partition_key(cluster: str, topic: str, partition: int) -> str:
    return f"/herald/{cluster}/partitions/{topic}/{partition}"


def cluster_of(key: str) -> str:
    """The cluster name in a key made by partition_key."""
    return key.split("/", 3)[2]


@dataclass(frozen=True, slots=True)
class VersionedState:
    """A state as read from etcd, with the revision a compare-and-set must name, and the
    one its key was created at: a partition of a topic deleted and created again has a
    key of the same name, and is another partition (0: not known)."""

    state: PartitionState
    mod_revision: int
    create_revision: int = 0

    @classmethod
    def from_kv(cls, kv: KeyValue) -> VersionedState:
        return cls(PartitionState.from_json(kv.value), kv.mod_revision, kv.create_revision)

    def same_key(self, other: VersionedState) -> bool:
        """Whether ``other`` was read from the key this state was (not one created again)."""
        return self.create_revision == other.create_revision


@dataclass(frozen=True, slots=True)
class CasOutcome:
    succeeded: bool
    current: VersionedState | None  # what the key holds now (None: it does not exist)


async def read_partition(etcd: EtcdClient, key: str) -> VersionedState | None:
    kv = await etcd.get(key)
    return VersionedState.from_kv(kv) if kv is not None else None


async def create_partition(etcd: EtcdClient, key: str, state: PartitionState) -> CasOutcome:
    """Write the first state of a partition, unless someone already did."""
    return await _conditional_put(etcd, key, state, [Compare.version(key, "=", 0)], None)


async def compare_and_set(
    etcd: EtcdClient,
    key: str,
    expected: VersionedState,
    new: PartitionState,
    *,
    guards: Sequence[Compare] = (),
) -> CasOutcome:
    """Replace ``expected`` by ``new`` if the key is unchanged since it was read (and every
    extra guard holds); otherwise nothing changes and ``current`` is what is there now."""
    check_transition(expected.state, new)
    compares = [Compare.mod_revision(key, "=", expected.mod_revision), *guards]
    return await _conditional_put(etcd, key, new, compares, expected.create_revision)


MAX_TXN_OPS = 128  # etcd's default --max-txn-ops: compares, and ops per branch


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    expected: VersionedState
    new: PartitionState


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    succeeded: bool
    current: Mapping[str, VersionedState | None]  # each key's state now


async def compare_and_set_all(
    etcd: EtcdClient, changes: Sequence[Change], *, guards: Sequence[Compare] = ()
) -> BatchOutcome:
    """Every change, or none, in one transaction: a node taking over the partitions of a
    dead leader pays one etcd round trip, not one per partition (failover within
    node_ttl_ms + 2 s, PROTOCOL §7). On failure, ``current`` holds every key's state."""
    if not changes or len(changes) + len(guards) > MAX_TXN_OPS:
        raise ValueError(f"1 to {MAX_TXN_OPS - len(guards)} changes per transaction")
    for change in changes:
        check_transition(change.expected.state, change.new)
    result = await etcd.txn(
        [*(Compare.mod_revision(c.key, "=", c.expected.mod_revision) for c in changes), *guards],
        [Put.of(c.key, c.new.to_json()) for c in changes],
        [Get.of(c.key) for c in changes],
    )
    if result.succeeded:
        return BatchOutcome(
            True,
            {
                c.key: VersionedState(c.new, result.revision, c.expected.create_revision)
                for c in changes
            },
        )
    current: dict[str, VersionedState | None] = {}
    for change, found in zip(changes, result.results, strict=True):
        assert isinstance(found, RangeResult)
        current[change.key] = VersionedState.from_kv(found.kvs[0]) if found.kvs else None
    return BatchOutcome(False, current)


def failover_guards(
    cluster: str, old: PartitionState, successor: str, incarnation: int
) -> list[Compare]:
    """PROTOCOL §7 failover: the old leader's incarnation is gone (its node key deleted, or
    registered again by a new incarnation), and the successor is still the incarnation
    that decided to take over."""
    guards = [Compare.create_revision(node_key(cluster, successor), "=", incarnation)]
    if old.leader is not None:
        key = node_key(cluster, old.leader)
        known = old.incarnation_of(old.leader)
        # A missing key has create revision 0, so "!= known" also holds for a dead node.
        guards.append(
            Compare.create_revision(key, "!=", known) if known else Compare.version(key, "=", 0)
        )
    return guards


async def _conditional_put(
    etcd: EtcdClient,
    key: str,
    state: PartitionState,
    compares: Sequence[Compare],
    created_at: int | None,
) -> CasOutcome:
    """``created_at``: the key's create revision (None: this put creates the key)."""
    result = await etcd.txn(compares, [Put.of(key, state.to_json())], [Get.of(key)])
    if result.succeeded:
        written = VersionedState(
            state, result.revision, result.revision if created_at is None else created_at
        )
        return CasOutcome(True, written)
    (current,) = result.results
    assert isinstance(current, RangeResult)
    return CasOutcome(False, VersionedState.from_kv(current.kvs[0]) if current.kvs else None)
