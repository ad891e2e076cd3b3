"""The push policy of one webhook endpoint (PROTOCOL §4, §8), as a sans-I/O state machine.

Events in: records the core sent (``received``), the answer to a POST (``answered``), the
clock (``poll``). Actions out: POST a request of one record or a batch, extend ack
deadlines, grant credit, ack or nack. subscribers/webhook.py carries the actions out with
httpx and the DeliveryEngine; no sockets, no asyncio here, time passed in (STYLE 10).

What it decides:
- how many requests may be out: the endpoint's adaptive concurrency
  (delivery/endpoint_credit.py, AIMD up to `push.max_in_flight`), 1 probe while the breaker
  (delivery/breaker.py) is half open, none while it is open or a Retry-After pause runs.
  PROTOCOL §8: `push.max_in_flight` counts requests, and a batch is one;
- batches (PROTOCOL §8 `push.batch`): a request takes up to `max_records` ready records,
  and leaves once that many are ready or `max_wait_ms` after the first of them was;
- the body's form: the JSON of M, `{"messages":[M, …]}` when `max_records` > 1, or the
  raw value (`push.payload` "raw");
- credit: the core may send what leaves room for the requests allowed at once, each
  `max_records` long, no more, so records wait in the log — not in memory — and spend no
  attempts while the endpoint cannot take them;
- deadlines: a POST may take `push.timeout_ms`, so its records' deadlines are pushed past
  that; a record received but held back (breaker, Retry-After, a batch filling up) has its
  deadline extended before it runs out, so holding it spends no attempt;
- an answer: 2xx acks every record of the request; anything else nacks every one of them
  (each spends its attempt, as a failed single delivery), after the Retry-After of a
  429/503 (capped by `retry_backoff.max_ms`), else after the subscription's backoff;
- retries: records that failed together come back together (the core gives a nacked
  group one backoff) and leave again as one request of their own, in offset order, ahead
  of first tries and without waiting for a batch to fill (PROTOCOL §8, settled 2026-11-26).
"""

from __future__ import annotations

import email.utils
import enum
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from delivery.breaker import CircuitBreaker
from delivery.config import PushConfig, PushPayload, SubscriptionConfig
from delivery.endpoint_credit import EndpointCredit
from delivery.events import Delivery

DEADLINE_SLACK_MS = 1_000  # a POST's record stays in flight this long past timeout_ms
# A held record's deadline is extended once a third of it has passed: two thirds of the
# deadline are left as slack for a loop that looks late.
HOLD_REFRESH_PARTS = 3
TIMER_SLACK_S = 0.001  # wake a hair after the breaker reopens, not a hair before
# Failed groups remembered per request that may be out at once (the records of a group
# that never comes back — dead-lettered, sought past — are forgotten oldest first).
FAILED_GROUPS_PER_REQUEST = 4


# ---------------------------------------------------------------- actions


class BodyForm(enum.Enum):
    """What a request's body is (PROTOCOL §4, §8)."""

    ENVELOPE = "envelope"  # one record: the JSON of M
    BATCH = "batch"  # `{"messages":[M, …]}`: push.batch.max_records > 1
    RAW = "raw"  # one record's value, the rest of M in `herald-*` headers


@dataclass(frozen=True, slots=True)
class Post:
    """POST these records now in one request; answer with ``PushPolicy.answered``."""

    deliveries: tuple[Delivery, ...]
    form: BodyForm = BodyForm.ENVELOPE

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.record.id for d in self.deliveries)


@dataclass(frozen=True, slots=True)
class Extend:
    """Push the ack deadline of these record ids to now + ``ms`` (DeliveryEngine.extend)."""

    ids: tuple[str, ...]
    ms: int


@dataclass(frozen=True, slots=True)
class Grant:
    """Give the core ``n`` more credit for this endpoint."""

    n: int


@dataclass(frozen=True, slots=True)
class Ack:
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Nack:
    ids: tuple[str, ...]
    delay_ms: int | None  # None: the subscription's backoff
    reason: str | None = None  # PROTOCOL §8: the dead letter's herald-source-last-error


Action = Post | Extend | Grant | Ack | Nack


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back for one POST: an HTTP status, or a transport error and no status."""

    status: int | None
    latency_s: float
    transport_error: str | None = None  # "timeout", "connect failed: …"
    retry_after: str | None = None  # the raw `Retry-After` header
    wall_ms: int = 0  # when the POST was sent (an HTTP-date Retry-After is relative to it)

    @property
    def error(self) -> str | None:
        """None for a 2xx; else what went wrong, as the attempt log and stats show it."""
        if self.transport_error is not None:
            return self.transport_error
        if self.status is None:
            return "no answer"
        return None if 200 <= self.status < 300 else f"HTTP {self.status}"

    @property
    def failure(self) -> str:
        """A failed POST as a dead letter says it (PROTOCOL §8): "http 500", "timeout",
        "connection refused", …"""
        if self.transport_error is not None:
            return self.transport_error
        return "no answer" if self.status is None else f"http {self.status}"


# ---------------------------------------------------------------- the policy


class PushPolicy:
    """Push state of one endpoint. Not thread-safe; owned by the dispatcher's loop."""

    def __init__(self, config: SubscriptionConfig) -> None:
        assert config.push is not None
        self.config = config
        self.breaker = CircuitBreaker(config.push.breaker)
        self.concurrency = EndpointCredit(config.push.max_in_flight)
        # Received, not POSTed yet, with when each was received (a batch's wait starts at
        # its first record's).
        self._ready: deque[tuple[Delivery, float]] = deque()
        # Records of a failed request, back for their retry: one request per group.
        self._retries: deque[tuple[Delivery, ...]] = deque()
        self._failed_group: dict[str, int] = {}  # record id -> its failed request's number
        self._group_numbers = itertools.count()
        self._held_since: dict[str, float] = {}  # ready record id -> last deadline extension
        self.posting = 0  # requests out, not answered yet
        self.posting_records = 0  # the records of those requests
        self._not_before = 0.0  # a Retry-After of a 429/503 pauses the whole endpoint
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.requests_total = 0
        self.failures_total = 0

    def use_config(self, config: SubscriptionConfig) -> None:
        """New secrets (rotation), or a new batch size or payload (PROTOCOL §8 change in
        place): the breaker, concurrency and records waiting keep their state; the next
        request is formed by the new config."""
        self.config = config

    # ------------------------------------------------------------------ events

    def received(self, deliveries: Iterable[Delivery], now: float) -> None:
        """The core sent these (it spent their credit); they wait for a POST slot."""
        groups: dict[int, list[Delivery]] = {}
        for delivery in deliveries:
            record_id = delivery.record.id
            self._held_since[record_id] = now
            group = self._failed_group.pop(record_id, None)
            if group is None:
                self._ready.append((delivery, now))
            else:
                groups.setdefault(group, []).append(delivery)
        for members in groups.values():
            members.sort(key=lambda d: (d.record.partition, d.record.offset))
            self._retries.append(tuple(members))

    def poll(self, now: float, credit: int) -> list[Action]:
        """What to do now. ``credit``: what the core may still send this endpoint."""
        config = self.config
        push = self._push
        limit = self._limit(now)
        actions: list[Action] = []
        post_ms = push.timeout_ms + DEADLINE_SLACK_MS
        form = body_form(push)
        while (self._retries or (self._ready and self._batch_due(now))) and self.posting < limit:
            if self._retries:  # older than any first try, and due at once
                taken = self._retries.popleft()
                if len(taken) > push.batch.max_records:  # a PATCH made batches smaller
                    self._retries.appendleft(taken[push.batch.max_records :])
                    taken = taken[: push.batch.max_records]
            else:
                count = min(push.batch.max_records, len(self._ready))
                taken = tuple(self._ready.popleft()[0] for _ in range(count))
            count = len(taken)
            ids = tuple(d.record.id for d in taken)
            for record_id in ids:
                self._held_since.pop(record_id, None)  # a redelivered copy may share its id
            if post_ms > config.ack_deadline_ms:
                # The POST may take timeout_ms: the core must not redeliver meanwhile.
                actions.append(Extend(ids, post_ms))
            actions.append(Post(taken, form))
            self.posting += 1
            self.posting_records += count
        due = now - self._hold_refresh_s()
        stale = tuple(i for i, since in self._held_since.items() if since <= due)
        if stale:
            actions.append(Extend(stale, config.ack_deadline_ms))
            for record_id in stale:
                self._held_since[record_id] = now
        # Room for `limit` requests of max_records each (PROTOCOL §8: a batch is one).
        room = limit * push.batch.max_records
        want = room - self.posting_records - self.waiting - credit
        if want > 0:
            actions.append(Grant(want))
        return actions

    def answered(self, post: Post, answer: Answer, now: float) -> Ack | Nack:
        """A request came back: the verdict for every record it carried."""
        self.posting -= 1
        self.posting_records -= len(post.deliveries)
        self.requests_total += 1
        error = answer.error
        self.last_status, self.last_error = answer.status, error
        ids = post.ids
        if error is None:
            self.breaker.on_success()
            self.concurrency.on_success(answer.latency_s)
            return Ack(ids)
        self.failures_total += 1
        self._remember_failed_group(post)
        self.breaker.on_failure(now)
        self.concurrency.on_failure()
        delay_ms = None
        if answer.status in (429, 503):
            retry_after_ms = parse_retry_after(answer.retry_after, answer.wall_ms)
            if retry_after_ms is not None:
                # Honoured, capped by the backoff maximum (PROTOCOL §4).
                delay_ms = min(retry_after_ms, self.config.retry_backoff.max_ms)
                self._not_before = max(self._not_before, now + delay_ms / 1000)
        return Nack(ids, delay_ms, answer.failure)

    # ------------------------------------------------------------------ time

    def next_wakeup(self, now: float) -> float | None:
        """When ``poll`` may decide something new without any event: a Retry-After pause
        or an open breaker ending, a held record's deadline to extend, or a partial
        batch's `max_wait_ms` running out."""
        times: list[float] = []
        if self._not_before > now:
            times.append(self._not_before)
        if self._held_since:
            times.append(min(self._held_since.values()) + self._hold_refresh_s())
        reopens = self.breaker.reopens_at()
        if reopens is not None:
            times.append(reopens + TIMER_SLACK_S)
        if self._ready and not self._retries:
            # Only ahead of now: a batch already due waits for a free slot, and the answer
            # that frees one wakes the dispatcher.
            batch_due = self._ready[0][1] + self._push.batch.max_wait_ms / 1000
            if batch_due > now:
                times.append(batch_due)
        return min(times) if times else None

    # ------------------------------------------------------------------ observation

    @property
    def waiting(self) -> int:
        return len(self._ready) + sum(map(len, self._retries))

    def stats(self, now: float, credit: int) -> dict[str, Any]:
        """The push members of the subscription's stats (docs/protocol.md)."""
        self.breaker.allowed(now)  # an elapsed open period shows as half_open
        return {
            "endpoint_state": self.breaker.state.value,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "endpoint_concurrency": self.concurrency.limit,
            "endpoint_in_flight": self.posting,  # requests (a batch is one)
            "endpoint_in_flight_records": self.posting_records,
            "endpoint_waiting": self.waiting,  # received, held (breaker, Retry-After)
            "endpoint_credit": credit,
            "endpoint_requests_total": self.requests_total,
            "endpoint_failures_total": self.failures_total,
            "breaker_opened_total": self.breaker.opened_total,
        }

    # ------------------------------------------------------------------ internals

    @property
    def _push(self) -> PushConfig:
        push = self.config.push
        assert push is not None
        return push

    def _remember_failed_group(self, post: Post) -> None:
        """PROTOCOL §8: the records of a failed request are retried together."""
        if len(post.deliveries) < 2:
            return
        group = next(self._group_numbers)
        failed = self._failed_group
        for record_id in post.ids:
            failed[record_id] = group
        push = self._push
        bound = FAILED_GROUPS_PER_REQUEST * push.max_in_flight * push.batch.max_records
        while len(failed) > bound:
            del failed[next(iter(failed))]

    def _batch_due(self, now: float) -> bool:
        """PROTOCOL §8: a request leaves once max_records are ready, or max_wait_ms after
        its first record was (with max_records 1, at once)."""
        batch = self._push.batch
        if len(self._ready) >= batch.max_records:
            return True
        return now >= self._ready[0][1] + batch.max_wait_ms / 1000

    def _limit(self, now: float) -> int:
        """How many POSTs may be out at once right now."""
        if now < self._not_before:
            return 0
        allowed = self.breaker.allowed(now)
        limit = self.concurrency.limit
        return limit if allowed is None else min(allowed, limit)

    def _hold_refresh_s(self) -> float:
        return self.config.ack_deadline_ms / 1000 / HOLD_REFRESH_PARTS


def body_form(push: PushConfig) -> BodyForm:
    """The form of the next request's body (PROTOCOL §8; validation refuses "raw" with
    max_records > 1, so a batch is never raw)."""
    if push.batch.batched:
        return BodyForm.BATCH
    return BodyForm.RAW if push.payload is PushPayload.RAW else BodyForm.ENVELOPE


def parse_retry_after(value: str | None, now_ms: int) -> int | None:
    """RFC 9110 `Retry-After`: delay-seconds or an HTTP date; ms from now, or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, int(when.timestamp() * 1000) - now_ms)
