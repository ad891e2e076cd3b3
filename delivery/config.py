"""Subscription configuration (PROTOCOL §2 Subscription config, §4 push)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from msgspec import UNSET

from delivery.start import StartAt
from herald.protocol.errors import BadRequest, SubscriptionConflict, ValidationError
from herald.protocol.limits import (
    DEFAULT_BACKOFF_MS,
    DEFAULT_BREAKER_OPEN_MS,
    MAX_PREVIOUS_SECRETS,
)
from herald.protocol.subscriptions import (
    BackoffView,
    BatchView,
    BreakerView,
    PushConfigView,
    RetiredSecretView,
    Start,
    StartTimestamp,
    SubscriptionConfigView,
)


class DeliveryMode(enum.Enum):
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"  # a record counts as acked when it is sent


@dataclass(frozen=True, slots=True)
class Backoff:
    min_ms: int = DEFAULT_BACKOFF_MS[0]
    max_ms: int = DEFAULT_BACKOFF_MS[1]


@dataclass(frozen=True, slots=True)
class Breaker:
    failures: int = 5
    open_ms: int = DEFAULT_BREAKER_OPEN_MS[0]
    max_open_ms: int = DEFAULT_BREAKER_OPEN_MS[1]


@dataclass(frozen=True, slots=True)
class PushBatch:
    """PROTOCOL §8 `push.batch`: up to ``max_records`` records per request, sent once that
    many are ready or ``max_wait_ms`` after the first of them was."""

    max_records: int = 1
    max_wait_ms: int = 0

    @property
    def batched(self) -> bool:
        """With max_records > 1 every body is `{"messages":[M, …]}`, even of one record."""
        return self.max_records > 1


class PushPayload(enum.Enum):
    """PROTOCOL §8 `push.payload`: what a request's body is."""

    ENVELOPE = "envelope"  # the JSON of M (or of a batch of them)
    RAW = "raw"  # the record's value; the rest of M in `herald-*` headers


@dataclass(frozen=True, slots=True)
class PreviousSecret:
    """docs/protocol.md `push.previous_secrets`: a secret still signed with, next to the
    current one, until ``expires_at`` (wall clock ms) — for rotating secrets."""

    secret: str
    expires_at: int


@dataclass(frozen=True, slots=True)
class PushConfig:
    url: str
    secret: str  # "whsec_<base64>"; never shown by GET
    max_in_flight: int = 16
    timeout_ms: int = 10_000
    breaker: Breaker = field(default_factory=Breaker)
    previous_secrets: tuple[PreviousSecret, ...] = ()
    batch: PushBatch = field(default_factory=PushBatch)
    payload: PushPayload = PushPayload.ENVELOPE

    def view(self) -> PushConfigView:
        """The push config as GET shows it: without the secrets."""
        return PushConfigView(
            url=self.url,
            max_in_flight=self.max_in_flight,
            timeout_ms=self.timeout_ms,
            breaker=BreakerView(
                self.breaker.failures, self.breaker.open_ms, self.breaker.max_open_ms
            ),
            batch=BatchView(self.batch.max_records, self.batch.max_wait_ms),
            payload=self.payload.value,
            # docs/protocol.md: shown only when given, without their secrets
            previous_secrets=[RetiredSecretView(p.expires_at) for p in self.previous_secrets]
            if self.previous_secrets
            else UNSET,
        )

    def public_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = msgspec.to_builtins(self.view())
        return shown

    def rotated(self, secret: str, previous_expires_at: int, now_ms: int) -> PushConfig:
        """docs/protocol.md "Rotating the secret": ``secret`` becomes the current secret and
        the current one is still signed with until ``previous_expires_at`` (not at all when
        that is not after ``now_ms``). Expired previous secrets are dropped first; of the rest
        at most MAX_PREVIOUS_SECRETS are kept, the most recently retired first. Rotating to
        the current secret changes nothing, so a retried request is harmless."""
        if secret == self.secret:
            return self
        kept = [p for p in self.previous_secrets if p.expires_at > now_ms and p.secret != secret]
        if previous_expires_at > now_ms:
            kept = [p for p in kept if p.secret != self.secret]
            kept.insert(0, PreviousSecret(self.secret, previous_expires_at))
        return replace(self, secret=secret, previous_secrets=tuple(kept[:MAX_PREVIOUS_SECRETS]))


@dataclass(frozen=True, slots=True)
class SubscriptionConfig:
    topic: str
    start: StartAt = field(default_factory=StartAt)
    delivery: DeliveryMode = DeliveryMode.AT_LEAST_ONCE
    ack_deadline_ms: int = 30_000
    max_in_flight: int = 1_000
    max_deliveries: int = 5  # 0: never dead-letter
    retry_backoff: Backoff = field(default_factory=Backoff)
    dead_letter_topic: str | None = None
    ordered_by_key: bool = False
    push: PushConfig | None = None
    filter: str | None = None  # PROTOCOL §8: checked by herald.protocol.filter's check_filter

    def view(self) -> SubscriptionConfigView:
        """The config as GET shows it (PROTOCOL §2): all fields, defaults filled, no secret."""
        shown = self.start.to_json()
        start: Start = StartTimestamp(shown["timestamp"]) if isinstance(shown, dict) else shown
        return SubscriptionConfigView(
            topic=self.topic,
            start=start,
            delivery=self.delivery.value,
            ack_deadline_ms=self.ack_deadline_ms,
            max_in_flight=self.max_in_flight,
            max_deliveries=self.max_deliveries,
            retry_backoff=BackoffView(self.retry_backoff.min_ms, self.retry_backoff.max_ms),
            dead_letter_topic=self.dead_letter_topic,
            ordered_by_key=self.ordered_by_key,
            push=self.push.view() if self.push else None,
            filter=self.filter,
        )

    def public_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = msgspec.to_builtins(self.view())
        return shown

    def to_storage(self) -> dict[str, Any]:
        """What meta.db keeps: the public view plus the push secret."""
        data = self.public_dict()
        if self.push is not None:
            data["push"]["secret"] = self.push.secret
            data["push"]["previous_secrets"] = [
                {"secret": p.secret, "expires_at": p.expires_at} for p in self.push.previous_secrets
            ]
        return data

    @classmethod
    def from_storage(cls, data: dict[str, Any]) -> SubscriptionConfig:
        push = data.get("push")
        return cls(
            topic=data["topic"],
            start=StartAt.from_json(data.get("start", "latest")),
            delivery=DeliveryMode(data["delivery"]),
            ack_deadline_ms=data["ack_deadline_ms"],
            max_in_flight=data["max_in_flight"],
            max_deliveries=data["max_deliveries"],
            retry_backoff=Backoff(**data["retry_backoff"]),
            dead_letter_topic=data["dead_letter_topic"],
            ordered_by_key=data["ordered_by_key"],
            filter=data.get("filter"),
            push=None
            if push is None
            else PushConfig(
                url=push["url"],
                secret=push["secret"],
                max_in_flight=push["max_in_flight"],
                timeout_ms=push["timeout_ms"],
                breaker=Breaker(**push["breaker"]),
                previous_secrets=tuple(
                    PreviousSecret(p["secret"], p["expires_at"])
                    for p in push.get("previous_secrets", ())
                ),
                # Configs stored before PROTOCOL §8 batches have neither: the defaults.
                batch=PushBatch(**push.get("batch", {})),
                payload=PushPayload(push.get("payload", PushPayload.ENVELOPE.value)),
            ),
        )


# PROTOCOL §8 "Change in place": what PATCH may change, and what it may only repeat.
PATCHABLE_FIELDS = (
    "ack_deadline_ms",
    "max_in_flight",
    "max_deliveries",
    "retry_backoff",
    "dead_letter_topic",
    "push",
    "filter",
)
FIXED_FIELDS = ("topic", "start", "delivery", "ordered_by_key")


@dataclass(frozen=True, slots=True)
class SubscriptionPatch:
    """A validated `PATCH /v1/subscriptions/{name}` (JSON Merge Patch, RFC 7396), applied
    to the current config under the engine's admin lock by ``apply``.

    ``fixed``: fields that may only be given with their current value (else 409);
    ``changes``: field -> new value, defaults already filled in for a null;
    ``backoff``: the members of a `retry_backoff` object (merged into the current one,
    a null member back to its default); ``push_keeps_secret``: a `push` object without
    `secret` keeps the old secret (and the previous secrets of a rotation)."""

    fixed: Mapping[str, Any] = field(default_factory=dict)
    changes: Mapping[str, Any] = field(default_factory=dict)
    backoff: Mapping[str, int | None] | None = None
    push_keeps_secret: bool = False

    def apply(self, current: SubscriptionConfig) -> SubscriptionConfig:
        for name, value in self.fixed.items():
            if getattr(current, name) != value:
                raise SubscriptionConflict(
                    f"{name} cannot be changed in place (it is {_shown(getattr(current, name))})"
                )
        changes = dict(self.changes)
        if self.backoff is not None:
            min_ms = self._merged("min_ms", current.retry_backoff.min_ms, Backoff().min_ms)
            max_ms = self._merged("max_ms", current.retry_backoff.max_ms, Backoff().max_ms)
            if min_ms > max_ms:
                raise ValidationError("retry_backoff.min_ms must not exceed retry_backoff.max_ms")
            changes["retry_backoff"] = Backoff(min_ms, max_ms)
        push = changes.get("push")
        if push is not None and self.push_keeps_secret:
            if current.push is None:
                raise BadRequest("push needs a secret: the subscription has none to keep")
            changes["push"] = replace(
                push,
                secret=current.push.secret,
                previous_secrets=push.previous_secrets or current.push.previous_secrets,
            )
        return replace(current, **changes)

    def _merged(self, member: str, current: int, default: int) -> int:
        """RFC 7396 on one retry_backoff member: absent keeps it, null is the default."""
        assert self.backoff is not None
        if member not in self.backoff:
            return current
        given = self.backoff[member]
        return default if given is None else given


def _shown(value: Any) -> str:
    if isinstance(value, StartAt):
        return repr(value.to_json())
    if isinstance(value, enum.Enum):
        return repr(value.value)
    return repr(value)
