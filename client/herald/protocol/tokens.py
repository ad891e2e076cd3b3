"""PROTOCOL §8 `POST /v1/tokens`: what a backend asks for when it mints a browser token.
Declared once: the server converts a body into it (server/routes_tokens.py), and
/openapi.json publishes its schema (server/schemas.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from herald.protocol import limits

TopicPatterns = Annotated[
    list[Annotated[str, Meta(min_length=1, max_length=limits.MAX_TOKEN_PATTERN_CHARS)]],
    Meta(
        max_length=limits.MAX_TOKEN_PATTERNS,
        description="fnmatch topic patterns, each provably within one of the caller's",
    ),
]


class TokenRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A browser token's rights (at least one pattern, else 400 bad_request) and
    lifetime."""

    ttl_ms: Annotated[int, Meta(ge=limits.TOKEN_TTL_MS.low, le=limits.TOKEN_TTL_MS.high)]
    publish: TopicPatterns = msgspec.field(default_factory=list)
    subscribe: TopicPatterns = msgspec.field(default_factory=list)
