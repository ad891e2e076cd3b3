"""A partition this node leads: cluster/replication.py's LeaderReplica, driven.

The role is the partition's replication hooks (storage/replicated.py): every append is
checked before it is queued (this node must lead, hold its lease, and for acks=all have
min_insync_replicas in sync) and, at acks=all, answered once the commit point covers it.
It feeds the replica the partition's log end and fsynced end as they move, answers the
followers' fetches, moves the partition's visible end (the high watermark), and writes
ISR changes to etcd with compare-and-set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from cluster.clock import lease_clock_ms
from cluster.errors import LeaderUnavailable, NotEnoughReplicas
from cluster.etcd import Compare, EtcdClient, EtcdOutcomeUnknown, EtcdUnavailable
from cluster.follower import EpochAnswer, EpochQuery, FetchRequest, FetchResponse
from cluster.membership import node_key
from cluster.replication import FetchError, LeaderReplica, Progress
from cluster.state import (
    PartitionState,
    VersionedState,
    cluster_of,
    compare_and_set,
    read_partition,
)
from storage.partition import Partition
from storage.record import Acks
from storage.topic import Topic

log = logging.getLogger("herald.cluster")

RESIGN_RETRY_S = 1.0  # between attempts to hand over a partition whose log lost records


class Signal:
    """Wakes everyone waiting at the moment :meth:`fire` is called."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def fire(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)


@dataclass(slots=True)
class Counters:
    """Per-node replication metrics (PROTOCOL §7, /metrics)."""

    isr_shrinks: int = 0
    isr_expands: int = 0
    leader_changes: int = 0  # partitions this node took the lead of
    fenced_fetches: int = 0
    lease_refusals: int = 0  # appends refused because the lease could have expired
    forwarded_records: int = 0  # published here, appended by another node that leads
    notes: dict[str, int] = field(default_factory=dict)


class LeaderRole:
    """Leads ``partition`` of ``topic`` at ``state.state.epoch``; one object per epoch."""

    def __init__(
        self,
        *,
        node_id: str,
        topic: Topic,
        partition: Partition,
        state: VersionedState,
        key: str,
        etcd: EtcdClient,
        holds_lease: Callable[[], bool],
        replica_lag_ms: float,
        lease: int = 0,
        counters: Counters,
        live: Callable[[], Collection[str]] = tuple,
        is_current: Callable[[str, int], bool] | None = None,
        topic_id: int = 0,
    ) -> None:
        self.node_id = node_id
        self.topic = topic
        self.topic_id = topic_id  # which topic of this name this copy is of
        self.partition = partition
        self.state = state
        self.key = key
        self.epoch = state.state.epoch
        self._etcd = etcd
        self._holds_lease = holds_lease
        self.lease = lease  # this node's lease when it was given the role
        self._counters = counters
        self._live = live  # the node ids holding a lease now
        # Whether a node is live as a given incarnation (cluster/state.py); None: every
        # live node counts as the incarnation recorded for it (tests of the role alone).
        self._is_current = is_current
        self._fetched: dict[str, int] = {}  # follower -> the incarnation its fetches carry
        self.replica = LeaderReplica(
            node_id,
            epoch=self.epoch,
            replicas=state.state.replicas,
            isr=state.state.isr,
            min_insync_replicas=min(topic.config.min_insync_replicas, len(state.state.replicas)),
            replica_lag_ms=replica_lag_ms,
            clock=lease_clock_ms,
            log_end=partition.log_end_offset,
            high_watermark=partition.end_offset,
            fsynced_end=partition.fsynced_offset,
        )
        self.active = False  # True once the dedup index holds the replicated ids
        self.deposed = False
        self.changed = Signal()  # the log end or the high watermark moved
        self._commits: dict[int, list[asyncio.Future[None]]] = {}
        self._isr_write: asyncio.Task[None] | None = None
        self._resigning: asyncio.Task[None] | None = None
        self._resign_after = 0.0  # loop time: the next attempt to hand the lead over
        self._unlisten: Callable[[], None] | None = None

    # -- life ------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the partition: refuse appends until producer ids replicated here are in
        the dedup index (a retry after a failover is still a duplicate), then lead."""
        self.partition.replicate(self)
        await self.topic.rebuild_dedup(self.partition.partition)
        if self.deposed:
            return
        self._unlisten = self.partition.add_log_listener(self._on_log)
        self.active = True
        self._apply(self.replica.on_append(self.partition.log_end_offset))
        log.info(
            "leading %s/%d at epoch %d (log end %d, isr %s)",
            self.topic.name,
            self.partition.partition,
            self.epoch,
            self.partition.log_end_offset,
            ",".join(self.replica.isr),
        )

    def depose(self) -> None:
        """No longer the leader (etcd says another node is, or the topic is gone): every
        acks=all waiter is refused — its records may or may not survive, and a retry with
        the same ids is deduplicated by whoever leads next."""
        self.deposed = True
        self.active = False
        if self._unlisten is not None:
            self._unlisten()
        if self._isr_write is not None:
            self._isr_write.cancel()
        if self._resigning is not None:
            self._resigning.cancel()
        for waiters in self._commits.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(
                        LeaderUnavailable(
                            f"partition {self.topic.name}/{self.partition.partition} changed "
                            "leader before the records were committed"
                        )
                    )
        self._commits.clear()
        self.changed.fire()

    # -- the hooks Partition.append calls ---------------------------------------------

    def check_append(self, acks: Acks) -> None:
        if not self.active:
            raise LeaderUnavailable(
                f"partition {self.topic.name}/{self.partition.partition} is changing leader"
            )
        if not self._holds_lease():
            self._counters.lease_refusals += 1
            raise EtcdUnavailable("this node cannot renew its etcd lease: writes are refused")
        if acks is Acks.ALL and self.replica.check_append("all") is not None:
            raise NotEnoughReplicas(
                f"partition {self.topic.name}/{self.partition.partition} has "
                f"{len(self.replica.minimal_isr)} in-sync replica(s), fewer than "
                f"min_insync_replicas {self.replica.min_insync_replicas}"
            )

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:
        if self.deposed:
            # Deposed while the records were on their way to the local log: depose()
            # refused the waiters it found, and nothing would ever answer a later one.
            raise LeaderUnavailable(
                f"partition {self.topic.name}/{self.partition.partition} changed leader "
                "before the records were committed"
            )
        if acks is Acks.ALL:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._commits.setdefault(end_offset, []).append(future)
            self._apply(self.replica.on_append(self.partition.log_end_offset))
            self._apply(self.replica.wait_commit(end_offset))
            await future
        # PROTOCOL §7: nothing is acknowledged once the lease could have expired.
        if not self._holds_lease():
            self._counters.lease_refusals += 1
            raise EtcdUnavailable("this node cannot renew its etcd lease: writes are refused")
        if self.deposed:
            raise LeaderUnavailable(
                f"partition {self.topic.name}/{self.partition.partition} changed leader"
            )

    # -- progress ----------------------------------------------------------------------

    def _on_log(self, partition: Partition) -> None:
        self._apply(self.replica.on_append(partition.log_end_offset))
        self._apply(self.replica.on_flush(partition.fsynced_offset))
        self.changed.fire()

    def tick(self) -> None:
        if self.active:
            self._apply(self.replica.tick())
            live = self._live()
            gone = [
                name
                for name in self.replica.isr
                if name != self.node_id and not self._counts_as_recorded(name, live)
            ]
            if gone and live:
                self._apply(self.replica.followers_gone(gone))
            if self.partition.lost_offset is not None:
                self._resign_soon()

    def _resign_soon(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._resigning is None and now >= self._resign_after:
            self._resign_after = now + RESIGN_RETRY_S
            self._resigning = asyncio.create_task(self._resign())

    async def _resign(self) -> None:
        """This node's log lost records after a failed write-back (the kernel dropped the
        pages before their rewrite: PartitionLog.lost_offset), so it takes no appends
        until it has fetched them again, which only a follower does. The lead goes to
        the first live in-sync replica, as its election would after this node's death:
        epoch + 1, the key unchanged since this role read it, the successor still the
        incarnation etcd's ISR names (an ISR member holds every committed record)."""
        state = self.state.state
        name = f"{self.topic.name}/{self.partition.partition}"
        try:
            live = self._live()
            others = tuple(
                r
                for r in state.replicas
                if r in state.isr and r != self.node_id and self._counts_as_recorded(r, live)
            )
            if not others:
                log.warning(
                    "%s: this node's log lost records from offset %s (a failed write-back) "
                    "and no other in-sync replica is live to lead it: appends are refused "
                    "until one is, or this node restarts",
                    name,
                    self.partition.lost_offset,
                )
                return
            successor = others[0]
            new = PartitionState(
                state.replicas,
                successor,
                state.epoch + 1,
                others,
                {r: state.incarnation_of(r) for r in others},
            )
            guard = Compare.create_revision(
                node_key(cluster_of(self.key), successor), "=", state.incarnation_of(successor)
            )
            outcome = await compare_and_set(self._etcd, self.key, self.state, new, guards=[guard])
        except (EtcdUnavailable, EtcdOutcomeUnknown, ValueError) as exc:
            # Unknown outcome included: the next attempt reads etcd's state as it is.
            log.warning("%s: handing the lead over: %s (tried again)", name, exc)
            return
        finally:
            self._resigning = None
        if outcome.succeeded:
            log.warning(
                "%s: this node's log lost records from offset %s (a failed write-back): "
                "%s leads it now, at epoch %d; this node fetches them again as a follower",
                name,
                self.partition.lost_offset,
                successor,
                new.epoch,
            )

    def _counts_as_recorded(self, follower: str, live: Collection[str]) -> bool:
        """Whether ``follower`` is live as the incarnation etcd's ISR names for it: one
        that restarted since (KIP-903) leaves the ISR at once, whatever its log says."""
        if self._is_current is None:
            return follower in live
        return self._is_current(follower, self.state.state.incarnation_of(follower))

    def _apply(self, progress: Progress) -> None:
        if self.deposed:
            return
        if self.replica.high_watermark_settled:
            before = self.partition.end_offset
            self.partition.set_high_watermark(progress.high_watermark)
            if self.partition.end_offset != before:
                self.changed.fire()
        for end in progress.committed:
            for future in self._commits.pop(end, ()):
                if not future.done():
                    future.set_result(None)
        for end in progress.refused:
            for future in self._commits.pop(end, ()):
                if not future.done():
                    future.set_exception(
                        NotEnoughReplicas(
                            "the in-sync replicas fell below min_insync_replicas before "
                            "the records were committed"
                        )
                    )
        if progress.isr_change is not None and self._isr_write is None:
            self._isr_write = asyncio.create_task(self._write_isr(progress.isr_change.isr))

    async def _write_isr(self, isr: tuple[str, ...]) -> None:
        try:
            joining = {f: self._fetched[f] for f in isr if f in self._fetched}
            new = self.state.state.with_isr(isr, joining)
            outcome = await compare_and_set(self._etcd, self.key, self.state, new)
        except EtcdOutcomeUnknown as exc:
            # The write may have reached etcd (KIP-497): until etcd says which ISR it holds,
            # a proposed expansion keeps counting (the marks stay over the maximal ISR), or
            # the node etcd may name could take over without the records committed here.
            log.warning("ISR change of %s: outcome unknown (%s); reading it back", self.key, exc)
            await self._learn_isr(new)
            return
        except (EtcdUnavailable, ValueError) as exc:
            log.warning("ISR change of %s not written: %s", self.key, exc)
            self._isr_write = None
            self._apply(self.replica.isr_write_failed())
            return
        except asyncio.CancelledError:
            self._isr_write = None
            raise
        self._isr_write = None
        current = outcome.current
        if outcome.succeeded and current is not None:
            grew = len(isr) > len(self.state.state.isr)
            self.state = current
            if grew:
                self._counters.isr_expands += 1
            else:
                self._counters.isr_shrinks += 1
            log.info("ISR of %s now %s", self.key, ",".join(isr))
            self._apply(self.replica.isr_stored(isr))
        elif current is not None and self._still_mine(current):
            self.state = current
            self._apply(self.replica.isr_stored(current.state.isr))
        else:
            # Another leader (or the topic gone, or deleted and created again: the same
            # leader at the same epoch of another partition): etcd's watch deposes this
            # role shortly.
            self._apply(self.replica.isr_write_failed())

    async def _learn_isr(self, proposed: PartitionState) -> None:
        """After a write of unknown outcome, read the key until etcd answers (or this role
        ends), and go on from what it holds."""
        pause = 0.1
        while not self.deposed:
            try:
                current = await read_partition(self._etcd, self.key)
                break
            except EtcdUnavailable as exc:
                log.info("reading the ISR of %s back: %s", self.key, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
        else:
            self._isr_write = None
            return
        self._isr_write = None
        if current is not None and self._still_mine(current):
            if current.state.isr == proposed.isr and current.state != self.state.state:
                grew = len(proposed.isr) > len(self.state.state.isr)
                if grew:
                    self._counters.isr_expands += 1
                else:
                    self._counters.isr_shrinks += 1
            self.state = current
            self._apply(self.replica.isr_stored(current.state.isr))
        else:
            self._apply(self.replica.isr_write_failed())

    def _still_mine(self, current: VersionedState) -> bool:
        """Whether etcd's ``current`` state is of this role: this node leading at this
        epoch, under the key this role's state was read from. A topic deleted and created
        again while this role's view lagged has a key of the same name, led by the same
        node at the same epoch (0): adopting it, this role would write its ISR changes
        over another topic's partition."""
        return (
            current.state.leader == self.node_id
            and current.state.epoch == self.epoch
            and current.same_key(self.state)
        )

    # -- the followers ------------------------------------------------------------------

    def answer_epoch(self, query: EpochQuery) -> EpochAnswer:
        error = self._topic_error(query.topic_id) or self._epoch_error(query.leader_epoch)
        if error is not None:
            return EpochAnswer(error, -1, -1, self.partition.start_offset)
        epoch, end = self.partition.end_offset_for_epoch(query.epoch)
        return EpochAnswer(None, epoch, end, self.partition.start_offset)

    def _topic_error(self, topic_id: int) -> FetchError | None:
        """A copy of another topic of this name asks (it or this node has not yet seen
        a delete and create again): it gets nothing of this copy, and this copy nothing
        of it — no truncation, no record, no place in the ISR (KIP-516)."""
        if topic_id != self.topic_id:
            return FetchError.INCONSISTENT_TOPIC_ID
        return None

    def _epoch_error(self, epoch: int) -> FetchError | None:
        if epoch < self.epoch:
            return FetchError.FENCED_LEADER_EPOCH
        if epoch > self.epoch or not self.active:
            return FetchError.UNKNOWN_LEADER_EPOCH
        return None

    def ready(self, request: FetchRequest, known_high_watermark: int) -> bool:
        """Whether a fetch has something to answer now (else it long-polls)."""
        if not self.active or request.epoch != self.epoch:
            return True
        return (
            request.fetch_offset < self.partition.log_end_offset
            or self.replica.high_watermark > known_high_watermark
        )

    def _may_join(self, follower: str) -> bool:
        """Whether ``follower`` may join the ISR: only as a live node, of the incarnation
        the ISR would record for it (KIP-841: a fenced broker is not eligible). A node cut
        off from etcd goes on fetching; each of its fetches readmitted it, and the next
        tick dropped it again as not live — an ISR write to etcd every half second for as
        long as the cut lasted (nemesis seed 1001). Without a view of the live nodes,
        as in tick, nobody is held out."""
        if follower in self.replica.isr:
            return True
        live = self._live()
        if not live:
            return True
        incarnation = self._fetched.get(follower) or self.state.state.incarnation_of(follower)
        if self._is_current is None or not incarnation:
            return follower in live
        return self._is_current(follower, incarnation)

    def note_fetch(
        self, follower: str, request: FetchRequest, incarnation: int = 0
    ) -> FetchError | None:
        """What a fetch says of its follower (written and fsynced ends), noted before the
        fetch long-polls: its report may commit records, which is news to answer now."""
        if not self.active:
            return FetchError.UNKNOWN_LEADER_EPOCH
        if (error := self._topic_error(request.topic_id)) is not None:
            return error
        if follower not in self.replica.followers:
            # An observer (a node running a subscription or a tail of the topic without
            # being a replica): fenced like a follower, never counted in the ISR.
            error = self._epoch_error(request.epoch)
            if error is None and not 0 <= request.fetch_offset <= self.partition.log_end_offset:
                error = FetchError.OFFSET_OUT_OF_RANGE
            return error
        if incarnation:
            self._fetched[follower] = incarnation
            recorded = self.state.state.incarnation_of(follower)
            if follower in self.replica.isr and recorded and recorded != incarnation:
                # A new incarnation of an ISR member: whatever it had may be gone.
                self._apply(self.replica.followers_gone([follower]))
        decision = self.replica.on_fetch(
            follower,
            request.epoch,
            request.fetch_offset,
            request.fsynced_offset,
            may_join=self._may_join(follower),
        )
        self._apply(decision.progress)
        if decision.error is FetchError.FENCED_LEADER_EPOCH:
            self._counters.fenced_fetches += 1
        return decision.error

    async def answer_fetch(self, request: FetchRequest, error: FetchError | None) -> FetchResponse:
        """The stored batches from the fetch offset, and the high watermark."""
        start = self.partition.start_offset
        if error is not None:
            return FetchResponse(error, b"", self.replica.high_watermark, start)
        batches = b""
        end = self.partition.log_end_offset
        if start <= request.fetch_offset < end:
            batches = await self.partition.read_batches(
                request.fetch_offset, request.max_bytes, end
            )
        return FetchResponse(None, batches, self.replica.high_watermark, start)

    def report(self) -> dict[str, object]:
        """This partition as GET /v1/cluster shows it (the leader's view)."""
        return {
            "topic": self.topic.name,
            "partition": self.partition.partition,
            "leader": self.node_id,
            "epoch": self.epoch,
            "replicas": list(self.replica.replicas),
            "isr": list(self.replica.isr),
            "start_offset": self.partition.start_offset,
            "high_watermark": self.partition.end_offset,
            "log_end": self.partition.log_end_offset,
            "bytes": self.partition.size_bytes,
            "lag": self.replica.follower_lag(),
        }
