"""What the sans-I/O delivery core hands out: deliveries, dead letters, read requests.

Frozen, slotted records; the async engine (delivery/engine.py) acts on them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from delivery.redelivery import RedeliveryRef
from storage.record import Record


@dataclass(frozen=True, slots=True)
class Delivery:
    """One send of a record to a consumer; ``attempt`` is 1 on the first send
    and counts every send (PROTOCOL §3 `deliver`)."""

    record: Record
    attempt: int


class DeadLetterReason(enum.Enum):
    MAX_DELIVERIES = "max_deliveries"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Decision: publish ``record`` to the dead-letter topic (or drop and count it
    when the subscription has none), then report back with ``dead_letter_done``."""

    record: Record
    deliveries: int
    reason: DeadLetterReason = DeadLetterReason.MAX_DELIVERIES
    epoch: int = 0  # the partition's seek epoch: a seek since makes the outcome moot
    last_error: str = ""  # what went wrong last (PROTOCOL §8 herald-source-last-error)


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """First deliveries: read up to ``max_records`` from ``offset`` of ``partition``
    and hand the result to ``SubscriptionCore.feed``."""

    partition: int
    offset: int
    max_records: int
    epoch: int


@dataclass(frozen=True, slots=True)
class RefetchRequest:
    """Redeliveries: re-read the records of ``refs`` (one partition, ascending offsets)
    from the log — every one of them — and hand them to ``SubscriptionCore.feed_refetch``."""

    partition: int
    refs: tuple[RedeliveryRef, ...]
    epoch: int

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(ref.offset for ref in self.refs)


class PauseReason(enum.Enum):
    """Why nothing is being sent right now (shown by the console)."""

    NONE = "none"
    NO_CREDIT = "no_credit"
    MAX_IN_FLIGHT = "max_in_flight"
    BACKOFF = "backoff"
    DELAYED = "delayed"  # PROTOCOL §8: what is left waits for its deliver_at
