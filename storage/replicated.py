"""What a replicated partition asks of the cluster layer (PROTOCOL §7 "acks", "High
watermark").

storage never imports cluster: a :class:`storage.partition.Partition` switched to the
replicated mode with ``Partition.replicate(hooks)`` calls these hooks on every leader
append, and the cluster layer (its LeaderReplica for the partition) implements them.
In that mode the partition's visible end is the high watermark the cluster layer sets
with ``Partition.set_high_watermark``; what is written beyond it stays invisible to
reads, tails, waiters and append listeners.
"""

from __future__ import annotations

from typing import Protocol

from storage.record import Acks


class ReplicationHooks(Protocol):
    """The cluster layer's side of one replicated partition (for one epoch).

    ``epoch`` is the leader epoch stamped on every batch this node appends as leader.
    ``check_append`` runs on the loop before a batch is queued for the writer; it raises
    a HeraldError subclass (not_enough_replicas, not the leader, ...) to refuse it, and
    then nothing of the batch is appended. ``wait_commit`` is awaited once the local
    append resolved (written for acks 0/1, fsynced for acks=all) with the batch's end
    offset (exclusive): at acks=all it returns once the records are committed (fsynced
    by every ISR member) and raises if they cannot be; otherwise it returns at once.
    """

    @property
    def epoch(self) -> int: ...

    def check_append(self, acks: Acks) -> None: ...

    async def wait_commit(self, end_offset: int, acks: Acks) -> None: ...
