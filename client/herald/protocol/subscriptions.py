"""A subscription's config on the wire, declared once: as a client sends it to create
(`SubscriptionConfig`) or change (`SubscriptionPatch`) a subscription, which the server
validates with, and as a server shows it (`SubscriptionConfigView`: every field, defaults
filled, no secret), which the server builds from the config it runs (delivery/config.py
``public_dict``), within a subscription's answer (`Subscription`, `SubscriptionList`). /openapi.json publishes their schemas (server/schemas.py); a client
can build or decode them with ``msgspec``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.names import NAME_PATTERN, Name
from herald.protocol.patterns import PUSH_URL_PATTERN, SECRET_BYTES, SECRET_PATTERN, SECRET_PREFIX
from herald.protocol.stats import SubscriptionStats


def _within(allowed: limits.IntRange) -> Meta:
    return Meta(ge=allowed.low, le=allowed.high)


Timestamp = Annotated[int, _within(limits.TIMESTAMP)]
BackoffMs = Annotated[int, _within(limits.BACKOFF_MS)]
BreakerOpenMs = Annotated[int, _within(limits.BREAKER_OPEN_MS)]
DeliveryName = Literal["at_least_once", "at_most_once"]
PayloadName = Literal["envelope", "raw"]


class StartTimestamp(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
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


class Subscription(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/subscriptions/{name}` and the answers that change a subscription."""

    name: Name
    config: SubscriptionConfigView
    stats: SubscriptionStats


class SubscriptionSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: Name
    config: SubscriptionConfigView


class SubscriptionList(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/subscriptions`."""

    subscriptions: list[SubscriptionSummary]


# ---------------------------------------------------------------- requests
#
# What a client sends to create (PUT) or change (PATCH) a subscription. The server
# converts a body into these (server/validation.py: a type or shape error is
# bad_request, a value out of range validation_error, with the field's path), then checks
# what a type cannot say: names (invalid_name), the filter grammar, the push URL as the
# webhook client parses it, a secret's key length, and the relations between fields.
# PROTOCOL §2: an optional field given as null is the same as the field left out.

_FIXED = "only with its current value (else 409 subscription_conflict)"

NameText = Annotated[str, Meta(extra_json_schema={"pattern": NAME_PATTERN})]
SecretText = Annotated[
    str,
    Meta(
        extra_json_schema={"pattern": SECRET_PATTERN},
        description=f"{SECRET_PREFIX} + strict base64 of {SECRET_BYTES[0]}..{SECRET_BYTES[1]} "
        "bytes",
    ),
]
PushUrl = Annotated[
    str,
    Meta(extra_json_schema={"pattern": PUSH_URL_PATTERN, "maxLength": limits.MAX_URL_CHARS}),
]
FilterText = Annotated[
    str,
    Meta(
        extra_json_schema={"maxLength": limits.MAX_FILTER_CHARS},
        description='PROTOCOL §8: key = "v", key != "v", hasPrefix(key, "p"), '
        'headers.NAME = / != "v", hasPrefix(headers.NAME, "p"), headers:NAME, joined '
        "with AND, OR, NOT and parentheses (malformed -> bad_request with the position)",
    ),
]
Payload = Annotated[
    PayloadName,
    Meta(
        description='PROTOCOL §8: "envelope" (the JSON of M) or "raw" (the record\'s value as '
        "the body, the rest of M in herald-* headers); raw needs batch.max_records 1 (else "
        "400 validation_error)"
    ),
]


class RetryBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """min_ms <= max_ms (else 400 validation_error)."""

    min_ms: BackoffMs | None = None
    max_ms: BackoffMs | None = None


class Breaker(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """open_ms <= max_open_ms (else 400 validation_error)."""

    failures: Annotated[int, _within(limits.BREAKER_FAILURES)] | None = None
    open_ms: BreakerOpenMs | None = None
    max_open_ms: BreakerOpenMs | None = None


class PushBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """PROTOCOL §8: with max_records > 1 a request carries up to that many records as
    {"messages":[M, …]}, sent once max_records are ready or max_wait_ms after the first
    of them was."""

    max_records: Annotated[int, _within(limits.BATCH_MAX_RECORDS)] | None = None
    max_wait_ms: Annotated[int, _within(limits.BATCH_MAX_WAIT_MS)] | None = None


class PreviousSecret(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    secret: SecretText
    expires_at: Timestamp


class PushOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a push config holds besides its URL and secret."""

    max_in_flight: Annotated[int, _within(limits.PUSH_MAX_IN_FLIGHT)] | None = None
    timeout_ms: Annotated[int, _within(limits.PUSH_TIMEOUT_MS)] | None = None
    breaker: Breaker | None = None
    batch: PushBatch | None = None
    payload: Payload | None = None
    previous_secrets: (
        Annotated[
            list[PreviousSecret],
            Meta(
                max_length=limits.MAX_PREVIOUS_SECRETS,
                description="docs/protocol.md: secrets still signed with until expires_at "
                "(rotation); GET shows only expires_at",
            ),
        ]
        | None
    ) = None


class PushConfig(PushOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PROTOCOL §4 push: where and how records are POSTed."""

    url: PushUrl
    secret: SecretText


class PushConfigPatch(PushOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replaces the push config whole; without secret (or with null) the old one is kept."""

    url: PushUrl
    secret: SecretText | None = None


class SubscriptionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/subscriptions/{name}`: a field left out (or null) takes its default."""

    topic: NameText
    start: Start | None = None
    delivery: DeliveryName | None = None
    ack_deadline_ms: Annotated[int, _within(limits.ACK_DEADLINE_MS)] | None = None
    max_in_flight: Annotated[int, _within(limits.MAX_IN_FLIGHT)] | None = None
    max_deliveries: Annotated[int, _within(limits.MAX_DELIVERIES)] | None = None
    retry_backoff: RetryBackoff | None = None
    dead_letter_topic: NameText | None = None
    ordered_by_key: bool | None = None
    push: PushConfig | None = None
    filter: FilterText | None = None


class RetryBackoffPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Merged into the current one: a member left out is kept, a null one is its default."""

    min_ms: BackoffMs | UnsetType | None = UNSET
    max_ms: BackoffMs | UnsetType | None = UNSET


class SubscriptionPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PROTOCOL §8 change in place (JSON Merge Patch): a field left out is unchanged; null
    sets it back to its default (push: null stops pushing); records in flight keep their
    deadline. topic, start, delivery and ordered_by_key may be given only with their
    current value (else 409 subscription_conflict)."""

    topic: Annotated[NameText, Meta(description=_FIXED)] | None = None
    start: Annotated[Start, Meta(description=_FIXED)] | None = None
    delivery: Annotated[DeliveryName, Meta(description=_FIXED)] | None = None
    ordered_by_key: Annotated[bool, Meta(description=_FIXED)] | None = None
    ack_deadline_ms: Annotated[int, _within(limits.ACK_DEADLINE_MS)] | UnsetType | None = UNSET
    max_in_flight: Annotated[int, _within(limits.MAX_IN_FLIGHT)] | UnsetType | None = UNSET
    max_deliveries: Annotated[int, _within(limits.MAX_DELIVERIES)] | UnsetType | None = UNSET
    retry_backoff: RetryBackoffPatch | UnsetType | None = UNSET
    dead_letter_topic: NameText | UnsetType | None = UNSET
    push: PushConfigPatch | UnsetType | None = UNSET
    filter: FilterText | UnsetType | None = UNSET
