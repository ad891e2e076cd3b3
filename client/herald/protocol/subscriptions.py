"""A subscription's config as a server shows it (PROTOCOL §2 `GET /v1/subscriptions/{name}`:
every field, defaults filled, no secret): declared once, built by the server from the
config it runs (delivery/config.py ``public_dict``), published as the
SubscriptionConfigView schema of /openapi.json (server/schemas.py), and decodable by a
client with ``msgspec.convert``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.names import NAME_PATTERN


def _within(allowed: limits.IntRange) -> Meta:
    return Meta(ge=allowed.low, le=allowed.high)


Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
Timestamp = Annotated[int, _within(limits.TIMESTAMP)]
BackoffMs = Annotated[int, _within(limits.BACKOFF_MS)]
BreakerOpenMs = Annotated[int, _within(limits.BREAKER_OPEN_MS)]
DeliveryName = Literal["at_least_once", "at_most_once"]
PayloadName = Literal["envelope", "raw"]


class StartTimestamp(msgspec.Struct, frozen=True):
    """Start at the first record whose timestamp is at least this (ms since the epoch)."""

    timestamp: Timestamp


Start = Literal["earliest", "latest"] | StartTimestamp


class BackoffView(msgspec.Struct, frozen=True):
    min_ms: BackoffMs
    max_ms: BackoffMs


class BreakerView(msgspec.Struct, frozen=True):
    failures: Annotated[int, _within(limits.BREAKER_FAILURES)]
    open_ms: BreakerOpenMs
    max_open_ms: BreakerOpenMs


class BatchView(msgspec.Struct, frozen=True):
    max_records: Annotated[int, _within(limits.BATCH_MAX_RECORDS)]
    max_wait_ms: Annotated[int, _within(limits.BATCH_MAX_WAIT_MS)]


class RetiredSecretView(msgspec.Struct, frozen=True):
    """A previous secret still signed with until ``expires_at``; its key is never shown."""

    expires_at: Timestamp


class PushConfigView(msgspec.Struct, frozen=True, kw_only=True):
    """The push config without its secrets; ``previous_secrets`` only when there are any."""

    url: Annotated[str, Meta(max_length=limits.MAX_URL_CHARS)]
    max_in_flight: Annotated[int, _within(limits.PUSH_MAX_IN_FLIGHT)]
    timeout_ms: Annotated[int, _within(limits.PUSH_TIMEOUT_MS)]
    breaker: BreakerView
    batch: BatchView
    payload: PayloadName
    previous_secrets: list[RetiredSecretView] | UnsetType = UNSET


class SubscriptionConfigView(msgspec.Struct, frozen=True, kw_only=True):
    """Every field, defaults filled (PROTOCOL §2)."""

    topic: Name
    start: Start
    delivery: DeliveryName
    ack_deadline_ms: Annotated[int, _within(limits.ACK_DEADLINE_MS)]
    max_in_flight: Annotated[int, _within(limits.MAX_IN_FLIGHT)]
    max_deliveries: Annotated[int, _within(limits.MAX_DELIVERIES)]
    retry_backoff: BackoffView
    dead_letter_topic: Name | None
    ordered_by_key: bool
    push: PushConfigView | None
    filter: Annotated[str, Meta(max_length=limits.MAX_FILTER_CHARS)] | None
