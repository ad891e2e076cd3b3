"""PROTOCOL §2 `POST /v1/subscriptions/{name}/seek`: where to move a subscription, in
exactly one of three forms. A tagged union needs a tag the wire does not have, so the
model takes any of the three (each absent or null) and the server checks that exactly
one is given (else bad_request); the published schema says so (``ONE_FORM``).
Declared once: the server converts a body into it (server/validation.py parse_seek) and
/openapi.json publishes its schema (server/schemas.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from herald.protocol import limits

FORMS = ("to", "timestamp", "offsets")
PARTITION_KEY_PATTERN = "^-?[0-9]+$"  # a partition number as an object's key
SeekTo = Literal["earliest", "latest"]

# Exactly one form, not null; the other two absent or null.
ONE_FORM: dict[str, Any] = {
    "oneOf": [
        {"required": [form], "properties": {form: {"not": {"type": "null"}}}} for form in FORMS
    ]
}


# omit_defaults: as the SDK encodes it, a field not given is left out (not null).
class Seek(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Exactly one of to, timestamp and offsets (else 400 bad_request)."""

    to: SeekTo | None = None
    timestamp: Annotated[int, Meta(ge=limits.TIMESTAMP.low, le=limits.TIMESTAMP.high)] | None = None
    offsets: (
        Annotated[
            dict[
                Annotated[str, Meta(pattern=PARTITION_KEY_PATTERN)],
                Annotated[int, Meta(ge=limits.OFFSET.low, le=limits.OFFSET.high)],
            ],
            Meta(
                description="partition number -> offset; a partition the topic does not "
                "have -> 404 partition_not_found; past the end means the end"
            ),
        ]
        | None
    ) = None

    def forms(self) -> list[str]:
        """The forms given (not null)."""
        return [form for form in FORMS if getattr(self, form) is not None]
