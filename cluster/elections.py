"""Elections: who takes a partition whose leader is gone (PROTOCOL §7 failover; Kafka's
eligible leader replicas, KIP-966).

A partition whose leader is not live as the incarnation etcd names (its lease lapsed,
or it registered anew) is taken by a *current* ISR member with one transaction: the
partition key unchanged since it looked, the old leader's incarnation gone, its own
still registered; epoch + 1; members that are not current leave the ISR. The first
current ISR member in replica order tries at once, the others after a pause if the
partition is still leaderless (so one node does not lose a race to itself, and a node
that cannot reach etcd does not block). With no current ISR member, the most
up-to-date one takes it once all of them are back (cluster/log_ends.py); its guards
then also hold every compared member to the incarnation whose log end was compared.

The nodes never vote among themselves: etcd's compare-and-set decides, and the loser
reads the winner's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cluster.clock import lease_clock_ms
from cluster.etcd import Compare, EtcdClient, EtcdUnavailable
from cluster.log_ends import LogEnds, most_up_to_date
from cluster.membership import Membership, node_key
from cluster.state import (
    Change,
    PartitionState,
    VersionedState,
    compare_and_set_all,
    failover_guards,
    partition_key,
)
from cluster.topics import partitions_prefix

log = logging.getLogger("herald.cluster")

Ref = tuple[str, int]  # (topic, partition)
FAILOVER_PAUSE_MS = 1500  # before an ISR member other than the first live one tries
_PER_TXN = 100  # partitions taken over in one transaction, at most


def is_current(membership: Membership, node: str | None, state: PartitionState) -> bool:
    """Whether ``node`` is live as the incarnation ``state`` records for it."""
    return node is not None and membership.is_current(node, state.incarnation_of(node))


class Elections:
    def __init__(
        self,
        etcd: EtcdClient,
        cluster: str,
        node_id: str,
        membership: Membership,
        *,
        log_ends: Callable[[], Mapping[str, LogEnds]],
        states: Callable[[], dict[Ref, VersionedState]],
        changed: Callable[[], None],
    ) -> None:
        self.etcd = etcd
        self.cluster = cluster
        self.node_id = node_id
        self.membership = membership
        self._log_ends = log_ends  # the metadata view's, read when asked (a reload renews it)
        self._states = states
        self._changed = changed
        self._leaderless_since: dict[Ref, float] = {}

    def _current(self, node: str | None, state: PartitionState) -> bool:
        return is_current(self.membership, node, state)

    def takeover(self, ref: Ref, versioned: VersionedState) -> Change | None:
        """The change that makes this node the partition's leader, if it should try now."""
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
            if current[0] != self.node_id and now - since < FAILOVER_PAUSE_MS:
                return None
            incarnations = {r: state.incarnation_of(r) for r in current}
            new = PartitionState(
                state.replicas, self.node_id, state.epoch + 1, tuple(current), incarnations
            )
            return Change(partition_key(self.cluster, *ref), versioned, new)
        # No ISR member is current: each restarted (or is away). The most up-to-date of
        # them takes it, once every one is back and has said what its disk holds.
        isr = [r for r in state.replicas if r in state.isr]
        log_ends = self._log_ends()
        reported = {
            r: ends
            for r in isr
            if (ends := log_ends.get(r)) is not None
            and self.membership.is_current(r, ends.incarnation)
        }
        if most_up_to_date(ref, isr, reported) != self.node_id:
            return None
        new = PartitionState(
            state.replicas, self.node_id, state.epoch + 1, (self.node_id,), {self.node_id: me}
        )
        return Change(partition_key(self.cluster, *ref), versioned, new)

    def _guards(self, old: PartitionState, new: PartitionState) -> list[Compare]:
        """A takeover's guards: the old leader's incarnation gone, this one registered, and
        for an election among restarted members, each of them still the incarnation whose
        log ends were compared."""
        guards = failover_guards(self.cluster, old, self.node_id, self.membership.incarnation)
        if any(self._current(r, old) for r in old.isr if r != old.leader):
            return guards  # an ordinary failover: a current ISR member takes it
        log_ends = self._log_ends()
        for member in old.isr:
            ends = log_ends.get(member)
            if (
                member not in (self.node_id, old.leader)
                and ends is not None
                and self.membership.is_current(member, ends.incarnation)
            ):
                guards.append(
                    Compare.create_revision(node_key(self.cluster, member), "=", ends.incarnation)
                )
        return guards

    async def take_over(self, changes: list[Change]) -> None:
        # One transaction per set of guards (the old leader's node key is one of them).
        by_guards: dict[tuple[Compare, ...], list[Change]] = {}
        for change in changes:
            guards = tuple(self._guards(change.expected.state, change.new))
            by_guards.setdefault(guards, []).append(change)
        for guards, group in by_guards.items():
            old = group[0].expected.state.leader
            for first in range(0, len(group), _PER_TXN):
                chunk = group[first : first + _PER_TXN]
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
                states = self._states()
                for key, current in outcome.current.items():
                    if current is not None:
                        ref = _ref_of(key, partitions_prefix(self.cluster))
                        if ref is not None:
                            states[ref] = current
        self._changed()


def _ref_of(key: str, prefix: str) -> Ref | None:
    if not key.startswith(prefix):
        return None
    name, _, number = key[len(prefix) :].rpartition("/")
    return (name, int(number)) if number.isdigit() else None
