"""PROTOCOL §8 pull over HTTP: the requests to pull, ack and nack and their answers.
Declared once: the server converts bodies into them (server/validation.py ``from_model``), /openapi.json
publishes their schemas (server/schemas.py), and a client can build them."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from herald.protocol import limits
from herald.protocol.records import DeliveredRecord, NackDelayMs, NackReason

DEFAULT_PULL_MAX_MESSAGES = 100

MessageIds = Annotated[
    list[str], Meta(description="message ids; strings that are not in flight are unknown")
]


# omit_defaults: as the SDK encodes them, a field not given is left out (not null).


class PullRequest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Optional: no body is all defaults."""

    max_messages: (
        Annotated[
            int,
            Meta(
                ge=limits.PULL_MAX_MESSAGES.low,
                le=limits.PULL_MAX_MESSAGES.high,
                description=f"default {DEFAULT_PULL_MAX_MESSAGES}",
            ),
        ]
        | None
    ) = None
    wait_ms: (
        Annotated[
            int,
            Meta(
                ge=limits.WAIT_MS.low,
                le=limits.WAIT_MS.high,
                description="long-poll while nothing is there (default 0)",
            ),
        ]
        | None
    ) = None


class AckRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ids: MessageIds


class NackRequest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    ids: MessageIds
    delay_ms: NackDelayMs | None = None
    reason: NackReason | None = None


class PullResponse(msgspec.Struct, frozen=True):
    messages: list[DeliveredRecord]


class AckResponse(msgspec.Struct, frozen=True):
    """The answer to an ack or a nack."""

    ok: MessageIds
    unknown: MessageIds
