"""Replicas of one partition on real directories, in one process, driven through the
replication state machines (cluster/replication.py, cluster/follower.py). The "network"
is a method call: a follower's fetch is answered by the leader node's ``serve_fetch``.
The partition state that etcd would hold is a PartitionState changed only through
``check_transition``, as compare-and-set does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster.follower import (
    Action,
    EpochAnswer,
    EpochQuery,
    FetchRequest,
    FetchResponse,
    FollowerReplica,
    Phase,
)
from cluster.replication import AppendRefusal, FetchError, LeaderReplica, Progress
from cluster.state import PartitionState, check_transition
from storage.epochs import StaleEpoch
from storage.errors import CorruptLog
from storage.partition_log import LogConfig, PartitionLog
from storage.record import NewRecord

SMALL = LogConfig(segment_bytes=4000, index_interval_bytes=500)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms


@dataclass
class Node:
    name: str
    log: PartitionLog
    live: bool = True
    fetching: bool = True  # False: a follower that stopped fetching (but is alive)
    role: LeaderReplica | FollowerReplica | None = None
    fsynced: int = 0

    @property
    def high_watermark(self) -> int:
        return self.role.high_watermark if self.role is not None else 0


@dataclass
class Cluster:
    directory: Path
    names: tuple[str, ...]
    min_insync: int
    replica_lag_ms: float
    clock: FakeClock = field(default_factory=FakeClock)
    max_bytes: int = 1500
    nodes: dict[str, Node] = field(default_factory=dict)
    state: PartitionState | None = None
    acked: list[tuple[int, bytes]] = field(default_factory=list)
    refused: list[tuple[int, bytes]] = field(default_factory=list)
    _waiting: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    _now_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        for name in self.names:
            self.nodes[name] = Node(name, PartitionLog(self.directory / name, 0, SMALL))

    def close(self) -> None:
        for node in self.nodes.values():
            node.log.close()

    # -- the "etcd" --------------------------------------------------------------------

    def elect(self, leader: str, *, settle: bool = True) -> None:
        """``leader`` takes the partition at the next epoch (first: epoch 0 → 1); with
        ``settle``, every live follower then runs its divergence check."""
        if self.state is None:
            self.state = PartitionState(self.names, leader, 1, self.names)
        else:
            # The failover transaction drops dead members from the ISR (Kafka's controller
            # does the same), or the marks would wait replica_lag_ms for them.
            isr = tuple(n for n in self.state.isr if self.nodes[n].live or n == leader)
            new = PartitionState(self.state.replicas, leader, self.state.epoch + 1, isr)
            check_transition(self.state, new)
            self.state = new
        for node in self.nodes.values():
            if node.live:
                self._assume_role(node)
        if settle:
            for name in self.names:
                self.step(name)

    def _assume_role(self, node: Node) -> None:
        assert self.state is not None and self.state.leader is not None
        known_hw = node.high_watermark
        if node.name == self.state.leader:
            node.role = LeaderReplica(
                node.name,
                epoch=self.state.epoch,
                replicas=self.state.replicas,
                isr=self.state.isr,
                min_insync_replicas=self.min_insync,
                replica_lag_ms=self.replica_lag_ms,
                clock=self.clock,
                log_end=node.log.end_offset,
                high_watermark=known_hw,
                fsynced_end=node.fsynced,
            )
        else:
            node.role = FollowerReplica(
                node.name,
                topic="t",
                partition=0,
                leader=self.state.leader,
                epoch=self.state.epoch,
                latest_epoch=node.log.epochs.latest_epoch,
                log_start=node.log.start_offset,
                log_end=node.log.end_offset,
                high_watermark=known_hw,
                max_bytes=self.max_bytes,
            )

    def crash(self, name: str) -> None:
        """The node stops; its log stays on disk as it is (it was written, maybe not
        fsynced: these tests do not cut the page cache)."""
        node = self.nodes[name]
        node.live, node.role = False, None
        node.log.close()

    def restart(self, name: str) -> None:
        node = self.nodes[name]
        node.log = PartitionLog(self.directory / name, 0, SMALL)
        node.live, node.fsynced = True, node.log.end_offset
        self._assume_role(node)

    @property
    def leader(self) -> Node:
        assert self.state is not None and self.state.leader is not None
        return self.nodes[self.state.leader]

    def _leader_role(self) -> LeaderReplica:
        role = self.leader.role
        assert isinstance(role, LeaderReplica)
        return role

    # -- the leader's side -------------------------------------------------------------

    def publish(self, values: list[bytes], acks: str = "all") -> AppendRefusal | int:
        """Append at the leader (after check_append); returns the first offset, or the
        refusal (nothing appended). acks=all records are acked once committed."""
        role, node = self._leader_role(), self.leader
        refusal = role.check_append(acks)
        if refusal is not None:
            return refusal
        self._now_ms = max(self._now_ms + 1, node.log.last_timestamp or 0)
        records = [NewRecord(v, producer_id=v.decode()) for v in values]
        first = node.log.append(records, self._now_ms, leader_epoch=role.epoch)
        end = node.log.end_offset
        self._handle(role.on_append(end))
        node.log.flush()
        node.fsynced = end
        self._handle(role.on_flush(end))
        if acks == "all":
            self._waiting[end] = [(first + i, v) for i, v in enumerate(values)]
            self._handle(role.wait_commit(end))
        return first

    def _handle(self, progress: Progress) -> None:
        for end in progress.committed:
            self.acked += self._waiting.pop(end)
        for end in progress.refused:
            self.refused += self._waiting.pop(end)
        change = progress.isr_change
        if change is not None:
            assert self.state is not None
            new = self.state.with_isr(change.isr)
            check_transition(self.state, new)
            self.state = new
            self._handle(self._leader_role().isr_stored(new.isr))

    def tick(self) -> None:
        self._handle(self._leader_role().tick())

    def serve_epoch_query(self, query: EpochQuery) -> EpochAnswer:
        role, log = self._leader_role(), self.leader.log
        if query.leader_epoch != role.epoch:
            error = (
                FetchError.FENCED_LEADER_EPOCH
                if query.leader_epoch < role.epoch
                else FetchError.UNKNOWN_LEADER_EPOCH
            )
            return EpochAnswer(error, -1, -1, log.start_offset)
        epoch, end = log.end_offset_for_epoch(query.epoch)
        return EpochAnswer(None, epoch, end, log.start_offset)

    def serve_fetch(self, follower: str, request: FetchRequest) -> FetchResponse:
        role, log = self._leader_role(), self.leader.log
        decision = role.on_fetch(
            follower, request.epoch, request.fetch_offset, request.fsynced_offset
        )
        self._handle(decision.progress)
        if decision.error is not None:
            return FetchResponse(decision.error, b"", role.high_watermark, log.start_offset)
        batches = log.read_batches(request.fetch_offset, request.max_bytes)
        return FetchResponse(None, batches, role.high_watermark, log.start_offset)

    # -- the followers' side -----------------------------------------------------------

    def step(self, name: str) -> Action | None:
        """One request of follower ``name`` to the leader, and what it did with the answer."""
        node = self.nodes[name]
        role = node.role
        if not (node.live and node.fetching and isinstance(role, FollowerReplica)):
            return None
        if role.phase is Phase.TRUNCATING:
            answer = self.serve_epoch_query(role.epoch_query())
            step = role.on_epoch_answer(answer, node.log.end_offset_for_epoch)
            if step.action is Action.TRUNCATE:
                node.log.truncate_to(step.offset)
                node.fsynced = min(node.fsynced, node.log.end_offset)
                role.truncated(node.log.end_offset, node.log.epochs.latest_epoch)
            elif step.action is Action.RESET:
                raise AssertionError("storage has no hook to restart a log at an offset")
            return step.action
        if role.phase is Phase.STOPPED:
            return Action.STOP
        step = role.on_fetch_response(self.serve_fetch(name, role.fetch_request(node.fsynced)))
        if step.action is Action.APPEND:
            if step.batches:
                try:
                    node.log.append_batches(step.batches)
                except (ValueError, StaleEpoch, CorruptLog):
                    return role.append_failed().action
                node.log.flush()
                node.fsynced = node.log.end_offset
            role.appended(node.log.end_offset, node.log.epochs.latest_epoch)
        return step.action

    def round(self) -> None:
        """Every live, fetching follower sends one request."""
        for name in self.names:
            self.step(name)

    def replicate(self, rounds_limit: int = 200) -> int:
        """Rounds until every fetching follower has the leader's log and the marks are at
        its end (bounded). Returns the rounds it took."""
        for rounds in range(1, rounds_limit + 1):
            self.round()
            leader = self._leader_role()
            followers = [
                n
                for n in self.nodes.values()
                if n.live and n.fetching and isinstance(n.role, FollowerReplica)
            ]
            if (
                all(
                    n.log.end_offset == leader.log_end
                    and n.high_watermark == leader.log_end
                    and leader.followers[n.name].written == leader.log_end
                    and leader.pending is None
                    for n in followers
                )
                and leader.high_watermark == leader.log_end
            ):
                return rounds
        raise AssertionError(f"replication did not converge in {rounds_limit} rounds")
