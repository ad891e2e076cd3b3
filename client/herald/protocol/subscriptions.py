"""A subscription's config on the wire, declared once: as a client sends it to create
(`SubscriptionConfig`) or change (`SubscriptionPatch`) a subscription, which the server
validates with, and as a server shows it (`SubscriptionConfigView`: every field, defaults
filled, no secret), which the server builds from the config it runs (delivery/config.py
``public_dict``), within a subscription's answer (`Subscription`, `SubscriptionList`). /openapi.json publishes their schemas (server/schemas.py); a client
can build or decode them with ``msgspec``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import httpx
import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol import limits
from herald.protocol.errors import OutOfRange
from herald.protocol.names import NAME_PATTERN, Name
from herald.protocol.patterns import (
    PUSH_URL_PATTERN,
    SECRET_BYTES,
    SECRET_PATTERN,
    SECRET_PREFIX,
    base64_pattern,
)
from herald.protocol.records import Timestamp
from herald.protocol.stats import SubscriptionStatsView


def _within(allowed: limits.IntRange) -> Meta:
    return Meta(ge=allowed.low, le=allowed.high)


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
    stats: SubscriptionStatsView


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
# bad_request, a value out of range validation_error, with the field's path). Their
# ``__post_init__`` checks what a field's type cannot say, a secret's key length and the
# relations between fields (OutOfRange: validation_error); the server then checks names
# (invalid_name), the filter grammar and the push URL as the webhook client parses it.
# PROTOCOL §2: an optional field given as null is the same as the field left out.

_FIXED = "only with its current value (else 409 subscription_conflict)"

NameText = Annotated[str, Meta(extra_json_schema={"pattern": NAME_PATTERN})]
# Checked by check_secret; published: the pattern that says all it checks.
SecretText = Annotated[
    str,
    Meta(
        extra_json_schema={"pattern": SECRET_PATTERN},
        description=f"{SECRET_PREFIX} + strict base64 of {SECRET_BYTES[0]}..{SECRET_BYTES[1]} "
        "bytes",
    ),
]
# Enforced: the length; the rest by check_push_url. Published: a pattern of the URLs it takes.
PushUrl = Annotated[
    str, Meta(max_length=limits.MAX_URL_CHARS, extra_json_schema={"pattern": PUSH_URL_PATTERN})
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


def check_push_url(url: str) -> None:
    """An absolute http(s) URL the webhook client can POST to: the very parser that sends
    (httpx) reads it here, so a stored URL never fails at delivery time."""
    if any(c.isspace() for c in url):
        raise ValueError("url must not contain whitespace")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        raise ValueError("url is not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError("url must be an absolute http:// or https:// URL")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise OutOfRange(f"url port must be in 1..65535, not {parsed.port}")


_SECRET_TEXT = re.compile(f"{SECRET_PREFIX}{base64_pattern()}")


def check_secret(secret: str | None) -> None:
    """The prefix and canonical base64 (else bad_request), then a key of SECRET_BYTES
    (else validation_error): 4 characters of base64 are 3 bytes, less its padding."""
    if secret is None:
        return
    if _SECRET_TEXT.fullmatch(secret) is None:
        raise ValueError(f'secret must be "{SECRET_PREFIX}" followed by canonical base64')
    key = secret[len(SECRET_PREFIX) :]
    low, high = SECRET_BYTES
    if not low <= len(key) // 4 * 3 - key.count("=") <= high:
        raise OutOfRange(f"secret must decode to {low}..{high} bytes of key")


def check_ordered(
    low: int | None, high: int | None, defaults: tuple[int, int], names: tuple[str, str]
) -> None:
    """PROTOCOL §2: a lower bound never exceeds its upper one, a side left out taking its
    default (min_ms 2000000 alone is above max_ms's 60000)."""
    low = defaults[0] if low is None else low
    high = defaults[1] if high is None else high
    if low > high:
        raise OutOfRange(f"{names[0]} must not exceed {names[1]} ({low} > {high})")


class RetryBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """min_ms <= max_ms (else 400 validation_error)."""

    min_ms: BackoffMs | None = None
    max_ms: BackoffMs | None = None

    def __post_init__(self) -> None:
        check_ordered(self.min_ms, self.max_ms, limits.DEFAULT_BACKOFF_MS, ("min_ms", "max_ms"))


class Breaker(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """open_ms <= max_open_ms (else 400 validation_error)."""

    failures: Annotated[int, _within(limits.BREAKER_FAILURES)] | None = None
    open_ms: BreakerOpenMs | None = None
    max_open_ms: BreakerOpenMs | None = None

    def __post_init__(self) -> None:
        check_ordered(
            self.open_ms,
            self.max_open_ms,
            limits.DEFAULT_BREAKER_OPEN_MS,
            ("open_ms", "max_open_ms"),
        )


class PushBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """PROTOCOL §8: with max_records > 1 a request carries up to that many records as
    {"messages":[M, …]}, sent once max_records are ready or max_wait_ms after the first
    of them was."""

    max_records: Annotated[int, _within(limits.BATCH_MAX_RECORDS)] | None = None
    max_wait_ms: Annotated[int, _within(limits.BATCH_MAX_WAIT_MS)] | None = None


class PreviousSecret(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    secret: SecretText
    expires_at: Timestamp

    def __post_init__(self) -> None:
        check_secret(self.secret)


class PushOptions(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
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

    def __post_init__(self) -> None:
        # PROTOCOL §8: a raw body is one record's value.
        if self.payload == "raw" and self.batch is not None and (self.batch.max_records or 1) > 1:
            raise OutOfRange('payload "raw" needs batch.max_records 1')


class PushConfig(
    PushOptions, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """PROTOCOL §4 push: where and how records are POSTed."""

    url: PushUrl
    secret: SecretText

    def __post_init__(self) -> None:
        check_push_url(self.url)
        check_secret(self.secret)
        super().__post_init__()


class PushConfigPatch(
    PushOptions, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Replaces the push config whole; without secret (or with null) the old one is kept."""

    url: PushUrl
    secret: SecretText | None = None

    def __post_init__(self) -> None:
        check_push_url(self.url)
        check_secret(self.secret)
        super().__post_init__()


class SubscriptionConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
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


class RetryBackoffPatch(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Merged into the current one: a member left out is kept, a null one is its default."""

    min_ms: BackoffMs | UnsetType | None = UNSET
    max_ms: BackoffMs | UnsetType | None = UNSET


class SubscriptionPatch(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
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
