"""Requests to a subscription's admin actions besides its config (docs/protocol.md):
redriving its dead letters and rotating its push secret. Declared once: the server
converts bodies into them (server/validation.py ``from_model``) and /openapi.json
publishes their schemas (server/schemas.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from herald.protocol import limits
from herald.protocol.subscriptions import SecretText, check_secret

DEFAULT_PREVIOUS_TTL_MS = 86_400_000  # 24 h: how long a replaced secret is still signed with


# omit_defaults: as the SDK encodes it, a field not given is left out (not null).
class RedriveRequest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Optional: no body is all defaults."""

    rate: (
        Annotated[
            int,
            Meta(
                ge=limits.REDRIVE_RATE.low,
                le=limits.REDRIVE_RATE.high,
                description=f"records/s (default {limits.REDRIVE_DEFAULT_RATE})",
            ),
        ]
        | None
    ) = None
    max_records: (
        Annotated[
            int,
            Meta(
                ge=limits.REDRIVE_MAX_RECORDS.low,
                le=limits.REDRIVE_MAX_RECORDS.high,
                description=f"default {limits.REDRIVE_DEFAULT_MAX_RECORDS}",
            ),
        ]
        | None
    ) = None
    reason: (
        Annotated[
            str,
            Meta(
                max_length=limits.REDRIVE_MAX_REASON,
                description="only the dead letters whose herald-source-last-error is exactly "
                'this ("" also matches records without it)',
            ),
        ]
        | None
    ) = None


class SecretRotation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """docs/protocol.md "Rotating the secret"."""

    secret: SecretText
    previous_ttl_ms: (
        Annotated[
            int,
            Meta(
                ge=limits.PREVIOUS_TTL_MS.low,
                le=limits.PREVIOUS_TTL_MS.high,
                description="how long the replaced secret is still signed with; 0 drops it "
                f"at once (default {DEFAULT_PREVIOUS_TTL_MS})",
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_secret(self.secret)
