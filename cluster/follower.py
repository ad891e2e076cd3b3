"""A follower's side of replicating one partition: a sans-I/O state machine.

On becoming a follower of epoch E (cluster/replication.py describes the protocol):

1. **Divergence check** (KIP-101, with KIP-279's fix): ask the leader
   ``end_offset_for_epoch(my latest epoch L)``. It answers (L', end): the largest epoch
   <= L it has, and where that epoch ends in its log. Truncate to
   ``min(end, my own end of epoch L')`` — exactly the records the leader does not have —
   and never to my high watermark (which may be behind, and truncating there then
   refetching can lose or fork records: KIP-101's two cases).
2. **Fetch** from my log end, carrying epoch E and my fsynced end; append the leader's
   batches byte for byte (``PartitionLog.append_batches`` checks their CRCs), adopt the
   leader's high watermark bounded by my own end.
3. **Errors**: ``fenced_leader_epoch`` / ``not_replica``: my view is stale, stop until
   etcd says who leads; ``unknown_leader_epoch``: the leader has not yet heard of E,
   retry after a pause; ``inconsistent_topic_id``: the leader's copy and mine are of
   different topics of the same name (one of us has not yet seen a delete and create
   again, KIP-516), retry after a pause and take nothing meanwhile; ``offset_out_of_range`` or batches that do not append (not
   contiguous, a stale epoch): back to step 1.

Methods take what the caller observed and return what to do; the caller does the I/O
(the fetch connection, the log).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from cluster.replication import FetchError

UNDEFINED = -1  # storage/epochs.py: no epoch <= the one asked about


class Phase(StrEnum):
    TRUNCATING = "truncating"  # waiting for the leader's answer to the epoch query
    FETCHING = "fetching"
    STOPPED = "stopped"  # fenced: wait for a new partition state from etcd


@dataclass(frozen=True, slots=True)
class EpochQuery:
    """Ask the leader ``end_offset_for_epoch(epoch)`` (the request carries
    ``leader_epoch`` too, fenced as fetches are)."""

    topic: str
    partition: int
    leader_epoch: int
    epoch: int
    topic_id: int = 0  # the asking copy's topic id (cluster/topic_ids.py; 0: none recorded)


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    error: FetchError | None
    epoch: int  # the largest epoch <= the one asked about (UNDEFINED: none)
    end_offset: int  # where it ends in the leader's log (UNDEFINED: none)
    log_start: int  # the leader's log start offset


@dataclass(frozen=True, slots=True)
class FetchRequest:
    topic: str
    partition: int
    epoch: int
    fetch_offset: int  # my log end: what I have written
    fsynced_offset: int  # the end of what I have fsynced
    max_bytes: int
    topic_id: int = 0  # the fetching copy's topic id (cluster/topic_ids.py; 0: none recorded)


@dataclass(frozen=True, slots=True)
class FetchResponse:
    error: FetchError | None
    batches: bytes  # the leader's stored batches from fetch_offset
    high_watermark: int
    log_start: int


class Action(StrEnum):
    TRUNCATE = "truncate"  # log.truncate_to(offset), then truncated(log.end_offset)
    APPEND = "append"  # log.append_batches(batches) if any, then appended(log.end_offset)
    QUERY = "query"  # send epoch_query() (again)
    RETRY = "retry"  # pause, then fetch again
    RESET = "reset"  # the leader's log starts past mine: start my log at offset
    STOP = "stop"  # fenced: wait for etcd


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    offset: int = 0
    batches: bytes = b""


class FollowerReplica:
    """One partition as a follower of ``leader`` at ``epoch`` sees it. ``latest_epoch``,
    ``log_start`` and ``log_end`` describe the local log; ``high_watermark`` what this
    node knew (bounded by its log end; it is not used to truncate)."""

    def __init__(
        self,
        node_id: str,
        *,
        topic: str,
        partition: int,
        leader: str,
        epoch: int,
        latest_epoch: int,
        log_start: int,
        log_end: int,
        high_watermark: int = 0,
        max_bytes: int = 1 << 20,
        topic_id: int = 0,
    ) -> None:
        if leader == node_id:
            raise ValueError("a node does not follow itself")
        self.node_id, self.topic, self.partition = node_id, topic, partition
        self.leader, self.epoch = leader, epoch
        self.latest_epoch = latest_epoch
        self.log_start, self.log_end = log_start, log_end
        self.high_watermark = min(high_watermark, log_end)
        self.max_bytes = max_bytes
        self.topic_id = topic_id  # which topic of this name the local copy is of
        self.phase = Phase.TRUNCATING
        self._leader_hw = 0  # from the response being applied

    # -- step 1: the divergence check --------------------------------------------------

    def epoch_query(self) -> EpochQuery:
        return EpochQuery(self.topic, self.partition, self.epoch, self.latest_epoch, self.topic_id)

    def on_epoch_answer(
        self, answer: EpochAnswer, own_end_for_epoch: Callable[[int], tuple[int, int]]
    ) -> Step:
        """The leader's answer; ``own_end_for_epoch`` is the local log's
        ``end_offset_for_epoch``. Returns TRUNCATE (possibly to the log end: nothing to
        drop), RESET, RETRY or STOP."""
        if self.phase is not Phase.TRUNCATING:
            raise RuntimeError(f"an epoch answer while {self.phase}")
        if answer.error is not None:
            return self._on_error(answer.error)
        if answer.epoch == UNDEFINED:
            # The leader knows no epoch as old as my latest: nothing of mine past its log
            # start can be trusted.
            target = min(self.log_end, answer.log_start)
        else:
            _, own_end = own_end_for_epoch(answer.epoch)
            target = min(answer.end_offset, self.log_start if own_end < 0 else own_end)
        if target < self.log_start or answer.log_start > target:
            return Step(Action.RESET, max(answer.log_start, target))
        return Step(Action.TRUNCATE, target)

    def truncated(self, log_end: int, latest_epoch: int) -> None:
        """The local log was cut (or found right): fetch from its end."""
        self.log_end, self.latest_epoch = log_end, latest_epoch
        self.high_watermark = min(self.high_watermark, log_end)
        self.phase = Phase.FETCHING

    def reset(self, log_start: int, latest_epoch: int) -> None:
        """The local log was emptied and starts at ``log_start`` now."""
        self.log_start = log_start
        self.truncated(log_start, latest_epoch)

    # -- step 2: fetching --------------------------------------------------------------

    def fetch_request(self, fsynced_offset: int) -> FetchRequest:
        if self.phase is not Phase.FETCHING:
            raise RuntimeError(f"a fetch while {self.phase}")
        return FetchRequest(
            self.topic,
            self.partition,
            self.epoch,
            self.log_end,
            min(fsynced_offset, self.log_end),
            self.max_bytes,
            self.topic_id,
        )

    def on_fetch_response(self, response: FetchResponse) -> Step:
        if self.phase is not Phase.FETCHING:
            raise RuntimeError(f"a fetch response while {self.phase}")
        if response.error is not None:
            return self._on_error(response.error)
        if response.log_start > self.log_end:
            # Retention at the leader removed what I would fetch next.
            self.phase = Phase.TRUNCATING
            return Step(Action.RESET, response.log_start)
        self._leader_hw = response.high_watermark
        return Step(Action.APPEND, self.log_end, response.batches)

    def appended(self, log_end: int, latest_epoch: int) -> None:
        """The batches of the last response are in the local log, which ends at
        ``log_end``: adopt the leader's high watermark, bounded by it."""
        if log_end < self.log_end:
            raise ValueError(f"an append does not shrink the log ({self.log_end} → {log_end})")
        self.log_end, self.latest_epoch = log_end, latest_epoch
        self.high_watermark = max(self.high_watermark, min(self._leader_hw, log_end))

    def append_failed(self) -> Step:
        """The batches did not append (not contiguous, a stale epoch, a bad CRC): check
        for divergence again."""
        self.phase = Phase.TRUNCATING
        return Step(Action.QUERY)

    def _on_error(self, error: FetchError) -> Step:
        if error in (FetchError.FENCED_LEADER_EPOCH, FetchError.NOT_REPLICA):
            self.phase = Phase.STOPPED
            return Step(Action.STOP)
        if error in (FetchError.UNKNOWN_LEADER_EPOCH, FetchError.INCONSISTENT_TOPIC_ID):
            return Step(Action.RETRY)
        self.phase = Phase.TRUNCATING  # offset_out_of_range
        return Step(Action.QUERY)
