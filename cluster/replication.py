"""The leader's side of replicating one partition: a sans-I/O state machine.

The protocol the servers speak (PROTOCOL §7, Kafka's replication):

- **One long-lived fetch connection per leader node.** A follower node opens one
  connection to each node that leads partitions it replicates and sends, over it, fetch
  requests naming many partitions; the leader answers each request once it has
  something for one of them (or after ``max_wait_ms``: a long poll, so an idle cluster
  costs one request per ``max_wait_ms`` per pair of nodes, and a new record reaches the
  followers one round trip after it is written). The connection's first message names
  the follower node (its ``--node-id``); the leader answers requests in order.
- **Fetch request**, per partition: ``topic``, ``partition``, ``epoch`` (the leader epoch
  the follower believes current), ``fetch_offset`` (its log end: what it has *written*),
  ``fsynced_offset`` (the end of what it has *fsynced*), ``max_bytes``.
- **Fetch response**, per partition: ``error`` (:class:`FetchError`, or none),
  ``batches`` (the leader's stored batches from ``fetch_offset``, byte for byte, so the
  follower checks the leader's CRC end to end with ``append_batches``),
  ``high_watermark`` and ``log_start`` (the leader's).
- **Epochs fence everything**: a fetch carrying an older epoch than the leader's is
  refused ``fenced_leader_epoch`` (the follower is behind etcd and re-reads the
  partition state), a newer one ``unknown_leader_epoch`` (the leader is behind: the
  follower retries shortly). A follower that starts following epoch E first asks
  ``end_offset_for_epoch(its latest epoch)`` and truncates there (KIP-101/KIP-279, see
  cluster/follower.py), then fetches.
- **The leader** (this module) learns from each fetch what the follower has written and
  fsynced. The ISR is the leader and the followers that caught up with the leader's log
  end within ``replica_lag_ms`` (Kafka's rule), caught up meaning fsynced (a follower
  that writes but cannot fsync leaves it). The *high watermark* (what readers may
  see) is the smallest written end over the ISR; the *commit point* (what ``acks=all``
  answers) is the smallest fsynced end over the ISR. Neither ever goes down.
- **acks=all**: the server calls :meth:`LeaderReplica.check_append` *before* it appends
  (``not_enough_replicas`` when the ISR is below ``min_insync_replicas``: nothing is
  appended), appends, then :meth:`LeaderReplica.wait_commit` for the batch's end offset;
  every later event returns, in :class:`Progress`, the ends that became committed (answer
  200) or were refused because the ISR fell below the minimum (answer 503).
- **ISR changes** are decided here and returned as :class:`IsrChange`; the caller writes
  them to etcd with compare-and-set (cluster/state.py) and reports what etcd holds with
  :meth:`LeaderReplica.isr_stored`. Until then the high watermark and commit point are
  computed over the larger of the two ISRs (Kafka's "maximal ISR", KIP-497): a shrink
  takes effect once it is stored, an expansion as soon as it is proposed, so nothing is
  ever counted committed by an ISR that etcd does not hold.

Time is a clock passed in (milliseconds, monotonic); nothing here blocks or does I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

Clock = Callable[[], float]  # monotonic milliseconds

UNKNOWN = -1  # a follower's offsets before its first fetch of this epoch


class FetchError(StrEnum):
    FENCED_LEADER_EPOCH = "fenced_leader_epoch"  # the follower's epoch is older
    UNKNOWN_LEADER_EPOCH = "unknown_leader_epoch"  # the follower's epoch is newer
    NOT_REPLICA = "not_replica"  # the fetching node does not replicate this partition
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"  # past the leader's log end
    # The leader's copy and the follower's are of different topics of one name (KIP-516).
    INCONSISTENT_TOPIC_ID = "inconsistent_topic_id"


class AppendRefusal(StrEnum):
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"


@dataclass(frozen=True, slots=True)
class IsrChange:
    """An ISR the leader wants etcd to hold (same leader, same epoch)."""

    epoch: int
    isr: tuple[str, ...]
    expands: bool  # True: a follower joins; False: followers leave


@dataclass(frozen=True, slots=True)
class Progress:
    """What changed: the marks, acks=all waiters answered, an ISR change to write."""

    high_watermark: int
    commit_point: int
    committed: tuple[int, ...] = ()  # waited-for end offsets now committed: answer 200
    refused: tuple[int, ...] = ()  # waited-for end offsets refused: not_enough_replicas
    isr_change: IsrChange | None = None


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """The answer to a fetch: an error (nothing else holds), or read the leader's batches
    from the fetch offset and send them with ``progress.high_watermark``."""

    error: FetchError | None
    progress: Progress


@dataclass(slots=True)
class FollowerState:
    written: int = UNKNOWN  # the offset of its last fetch: what it has written
    fsynced: int = UNKNOWN  # the end of what it reports fsynced (<= written)
    last_caught_up_ms: float = float("-inf")  # when it last had the leader's log end
    last_fetch_ms: float = float("-inf")
    last_fetch_leader_end: int = UNKNOWN  # the leader's log end at its last fetch


@dataclass(slots=True)
class _Waiters:
    ends: list[int] = field(default_factory=list)  # sorted end offsets

    def add(self, end: int) -> None:
        bisect.insort(self.ends, end)

    def pop_through(self, commit_point: int) -> tuple[int, ...]:
        cut = bisect.bisect_right(self.ends, commit_point)
        done, self.ends = tuple(self.ends[:cut]), self.ends[cut:]
        return done

    def pop_all(self) -> tuple[int, ...]:
        done, self.ends = tuple(self.ends), []
        return done


class LeaderReplica:
    """One partition as its leader sees it, for one epoch (a new epoch: a new object).

    ``log_end`` and ``fsynced_end`` are the leader's own log end and fsynced end;
    ``high_watermark`` what the node knew when it became leader (it only goes up).
    """

    def __init__(
        self,
        node_id: str,
        *,
        epoch: int,
        replicas: Iterable[str],
        isr: Iterable[str],
        min_insync_replicas: int,
        replica_lag_ms: float,
        clock: Clock,
        log_end: int,
        high_watermark: int = 0,
        fsynced_end: int | None = None,
    ) -> None:
        self.node_id = node_id
        self.epoch = epoch
        self.replicas = tuple(replicas)
        if node_id not in self.replicas:
            raise ValueError(f"{node_id!r} leads a partition it does not replicate")
        if not 1 <= min_insync_replicas <= len(self.replicas):
            raise ValueError(f"min_insync_replicas must be in 1..{len(self.replicas)}")
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_ms = replica_lag_ms
        self._clock = clock
        self.log_end = log_end
        self.fsynced_end = log_end if fsynced_end is None else fsynced_end
        # At most the leader's end: a new leader's own records are all it can vouch for.
        self.high_watermark = min(high_watermark, log_end)
        self.commit_point = min(self.high_watermark, self.fsynced_end)
        self.epoch_start_offset = log_end  # the first offset this epoch writes
        # Whether the commit point has been established in this epoch (see _advance).
        self.commit_settled = False
        now = clock()
        self.followers: dict[str, FollowerState] = {}
        for replica in self.replicas:
            if replica != node_id:
                # ISR members get a full replica_lag_ms to show up (Kafka does the same).
                caught_up = now if replica in set(isr) else float("-inf")
                self.followers[replica] = FollowerState(last_caught_up_ms=caught_up)
        self.isr: tuple[str, ...] = self._ordered({node_id, *isr} & set(self.replicas))
        self.pending: IsrChange | None = None
        self._waiters = _Waiters()

    # -- the ISR views -----------------------------------------------------------------

    def _ordered(self, members: Iterable[str]) -> tuple[str, ...]:
        wanted = set(members)
        return tuple(r for r in self.replicas if r in wanted)

    @property
    def maximal_isr(self) -> tuple[str, ...]:
        """The ISR the marks are computed over: etcd's, plus a proposed expansion."""
        if self.pending is None:
            return self.isr
        return self._ordered({*self.isr, *self.pending.isr})

    @property
    def minimal_isr(self) -> tuple[str, ...]:
        """The ISR acks=all counts on: etcd's, minus a proposed shrink."""
        if self.pending is None:
            return self.isr
        return self._ordered(set(self.isr) & set(self.pending.isr))

    # -- publishing --------------------------------------------------------------------

    def check_append(self, acks: str) -> AppendRefusal | None:
        """Before appending (PROTOCOL §7): acks=all needs min_insync_replicas in the ISR,
        or the batch is refused and not appended at all."""
        if acks == "all" and len(self.minimal_isr) < self.min_insync_replicas:
            return AppendRefusal.NOT_ENOUGH_REPLICAS
        return None

    def on_append(self, log_end: int) -> Progress:
        """The leader wrote records: its log now ends at ``log_end``."""
        if log_end < self.log_end:
            raise ValueError(f"a leader's log does not shrink ({self.log_end} → {log_end})")
        self.log_end = log_end
        return self._advance()

    def on_flush(self, fsynced_end: int) -> Progress:
        """The leader fsynced its log up to ``fsynced_end``."""
        self.fsynced_end = max(self.fsynced_end, min(fsynced_end, self.log_end))
        return self._advance()

    def wait_commit(self, end: int) -> Progress:
        """acks=all for records ending (exclusive) at ``end``: answered in this Progress if
        already committed (or refused), else in a later one."""
        if end > self.log_end:
            raise ValueError(f"waiting for offset {end} past the log end {self.log_end}")
        self._waiters.add(end)
        return self._advance()

    # -- followers ---------------------------------------------------------------------

    def on_fetch(
        self,
        follower: str,
        epoch: int,
        fetch_offset: int,
        fsynced_offset: int,
        *,
        may_join: bool = True,
    ) -> FetchDecision:
        """A follower's fetch: it has written up to ``fetch_offset`` and fsynced up to
        ``fsynced_offset``. Refused (and nothing noted) under another epoch. With
        ``may_join`` false (its node is not live in etcd: Kafka's KIP-841 keeps a fenced
        broker out of the ISR) it is noted but never joins the ISR."""
        error = self._check_fetch(follower, epoch, fetch_offset)
        if error is not None:
            return FetchDecision(error, self._progress())
        now = self._clock()
        state = self.followers[follower]
        state.written = fetch_offset
        state.fsynced = min(max(fsynced_offset, 0), fetch_offset)
        # Kafka's ReplicaState.updateFetchState: caught up now if it has the log end; or
        # as of its previous fetch if it has what the leader had then. "Has" means has
        # fsynced: acks=all waits for every ISR member's fsync, so a follower that
        # writes but cannot fsync (a failing disk) falls behind and leaves the ISR
        # instead of holding every acks=all publish (issue 25 item 9).
        if state.fsynced >= self.log_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now)
        elif state.fsynced >= state.last_fetch_leader_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.last_fetch_leader_end, state.last_fetch_ms = self.log_end, now
        change = self._maybe_expand(follower) if may_join else None
        return FetchDecision(None, self._advance(change))

    def _check_fetch(self, follower: str, epoch: int, fetch_offset: int) -> FetchError | None:
        if epoch < self.epoch:
            return FetchError.FENCED_LEADER_EPOCH
        if epoch > self.epoch:
            return FetchError.UNKNOWN_LEADER_EPOCH
        if follower not in self.followers:
            return FetchError.NOT_REPLICA
        if not 0 <= fetch_offset <= self.log_end:
            return FetchError.OFFSET_OUT_OF_RANGE
        return None

    def _maybe_expand(self, follower: str) -> IsrChange | None:
        """Kafka's rule: a follower rejoins once it has the high watermark and something
        of this epoch (so it truncated against this leader) — fsynced, or a follower
        that cannot fsync would rejoin at once and hold acks=all again. And it must be
        in sync by :meth:`tick`'s own test: under load the high watermark trails the log
        end, and a follower admitted at the high watermark without having caught up
        with the log end within ``replica_lag_ms`` would be dropped by the next tick.
        (Whether its node is live is the caller's to say: ``may_join``.)"""
        if self.pending is not None or follower in self.isr:
            return None
        state = self.followers[follower]
        if (
            state.fsynced >= self.high_watermark
            and state.fsynced >= self.epoch_start_offset
            and not self._out_of_sync(state, self._clock())
        ):
            self.pending = IsrChange(self.epoch, self._ordered({*self.isr, follower}), True)
            return self.pending
        return None

    def tick(self) -> Progress:
        """Called periodically (every replica_lag_ms / 2, say): followers of the ISR that
        have not caught up with the log end for longer than replica_lag_ms leave it."""
        change: IsrChange | None = None
        if self.pending is None:
            now = self._clock()
            out = {
                name
                for name in self.isr
                if name != self.node_id and self._out_of_sync(self.followers[name], now)
            }
            if out:
                self.pending = IsrChange(self.epoch, self._ordered(set(self.isr) - out), False)
                change = self.pending
        return self._advance(change)

    def followers_gone(self, gone: Iterable[str]) -> Progress:
        """Followers whose node left the cluster (its lease lapsed, its key is gone) leave
        the ISR now rather than ``replica_lag_ms`` later — Kafka's controller does the same
        when a broker dies. Without it, a dead follower of an idle partition (nothing to
        fall behind on) would stay in the ISR and stall the next acks=all."""
        change: IsrChange | None = None
        if self.pending is None:
            out = {name for name in gone if name in self.isr and name != self.node_id}
            if out:
                self.pending = IsrChange(self.epoch, self._ordered(set(self.isr) - out), False)
                change = self.pending
        return self._advance(change)

    def _out_of_sync(self, state: FollowerState, now: float) -> bool:
        return state.fsynced < self.log_end and now - state.last_caught_up_ms > self.replica_lag_ms

    def isr_stored(self, isr: Iterable[str]) -> Progress:
        """etcd now holds ``isr`` for this leader and epoch (the proposed change was written,
        or a compare-and-set found this one there instead)."""
        members = set(isr)
        if self.node_id not in members:
            raise ValueError(f"an ISR without its leader {self.node_id!r}: {sorted(members)}")
        self.isr = self._ordered(members & set(self.replicas))
        self.pending = None
        return self._advance()

    def isr_write_failed(self) -> Progress:
        """The proposed change could not be written (etcd unreachable): forget it; the next
        tick or fetch proposes again if it still holds."""
        self.pending = None
        return self._advance()

    # -- the marks ---------------------------------------------------------------------

    def _advance(self, change: IsrChange | None = None) -> Progress:
        written, fsynced = self.log_end, self.fsynced_end
        for name in self.maximal_isr:
            if name != self.node_id:
                state = self.followers[name]
                written, fsynced = min(written, state.written), min(fsynced, state.fsynced)
        if written > self.high_watermark:
            self.high_watermark = written
        fsynced = min(fsynced, self.high_watermark)
        if fsynced > self.commit_point:
            self.commit_point = fsynced
        # Raft's rule (Kafka's leader epoch start offset): the commit point a new leader
        # inherited is only what it was told; it is established once this epoch's ISR
        # reported fsyncing up to the epoch's start. Until then no waiter is answered
        # from it — only a duplicate id can wait for an offset below that start.
        if fsynced >= self.epoch_start_offset:
            self.commit_settled = True
        committed = self._waiters.pop_through(self.commit_point) if self.commit_settled else ()
        refused: tuple[int, ...] = ()
        if len(self.minimal_isr) < self.min_insync_replicas:
            refused = self._waiters.pop_all()
        return Progress(self.high_watermark, self.commit_point, committed, refused, change)

    @property
    def high_watermark_settled(self) -> bool:
        """Whether the high watermark covers everything earlier leaders had committed.

        A new leader knows only the mark its last fetch response carried, which may be
        behind what the old leader acknowledged (acks=all answered 200). Everything
        committed is below this epoch's start offset (the new leader has it all, being
        from the ISR), so once the mark reaches that offset it is complete; until then
        reads and tails beyond the mark wait (Kafka, KAFKA-2334: OFFSET_NOT_AVAILABLE),
        or a read sent after a 200 could miss its records (PROTOCOL §7)."""
        return self.high_watermark >= self.epoch_start_offset

    def _progress(self) -> Progress:
        return Progress(self.high_watermark, self.commit_point)

    def follower_lag(self) -> dict[str, int | None]:
        """Records each follower is behind the leader's log end (metrics, console); None
        for a follower that has not fetched from this leader yet (its position unknown)."""
        return {
            name: None if state.written == UNKNOWN else self.log_end - state.written
            for name, state in self.followers.items()
        }
