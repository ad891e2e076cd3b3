"""``POST /v1/tokens``: a backend mints a short-lived browser token (PROTOCOL §8).

The rights asked for must lie within the caller's own, pattern by pattern
(:func:`server.auth.pattern_within`); ``admin`` may mint any. A browser token
may mint too, never past its own expiry. The token is signed, not stored:
server/auth.py ``Credentials.mint_browser`` / ``verify_browser``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from herald.protocol.convert import from_model
from herald.protocol.errors import BadRequest, Forbidden, NotFound
from herald.protocol.tokens import TokenRequest
from server.access import AccessGuard
from server.auth import Principal, pattern_within
from server.http import json_body, json_response
from server.routing import Handler


def parse_mint(body: Any) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """``(ttl_ms, publish, subscribe)`` of a mint request, each list without repeats.
    PROTOCOL §2: a wrong JSON type, a missing or unknown field is ``bad_request``; a value
    out of range (ttl, a pattern's length, too many patterns) is ``validation_error``."""
    request = from_model(body, TokenRequest, "the token request")
    publish, subscribe = (
        tuple(dict.fromkeys(request.publish)),
        tuple(dict.fromkeys(request.subscribe)),
    )
    if not publish and not subscribe:
        raise BadRequest("a browser token needs at least one publish or subscribe pattern")
    return request.ttl_ms, publish, subscribe


def check_within(caller: Principal, role: str, requested: tuple[str, ...]) -> None:
    """Forbidden unless each requested pattern lies within one of the caller's for ``role``
    (a browser token's: and within its parent's as they are now, PROTOCOL §6)."""
    if caller.parent is not None:
        check_within(caller.parent, role, requested)
    if caller.is_admin:
        return
    held = caller.patterns(role)
    for pattern in requested:
        if not any(pattern_within(pattern, mine) for mine in held):
            mine_text = ", ".join(f"`{p}`" for p in held) or "no patterns"
            raise Forbidden(
                f"token {caller.token_id} may {role} on {mine_text}: `{pattern}` is not "
                "provably within them (see docs/browser.md, 'Which patterns fit')"
            )


def mint_route(guard: AccessGuard | None) -> Handler:
    """The handler of ``POST /v1/tokens``, signing with ``guard``'s credentials."""

    async def mint(request: Request) -> Response:
        if guard is None:
            raise NotFound("browser tokens need a credentials file (--auth-file)")
        if guard.credentials.signing is None:
            raise NotFound(
                "browser tokens need a [browser_tokens] signing key in the credentials file "
                "(`herald token signing-key >> auth.toml`)"
            )
        ttl, publish, subscribe = parse_mint(await json_body(request))
        caller: Principal = request.scope["state"]["principal"]
        check_within(caller, "publish", publish)
        check_within(caller, "subscribe", subscribe)
        expires_at = guard.clock() + ttl
        if caller.expires_at_ms is not None and expires_at > caller.expires_at_ms:
            raise Forbidden("a browser token cannot mint one that outlives it")
        token = guard.credentials.mint_browser(
            caller, publish=publish, subscribe=subscribe, expires_at_ms=expires_at
        )
        return json_response({"token": token, "expires_at": expires_at}, status=201)

    return mint
