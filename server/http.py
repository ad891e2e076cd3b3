"""Request bodies and JSON responses: the one way every route reads and answers.

Every body goes through ``read_body`` (capped while it streams) and
``parse_json_body`` (one empty-body rule); every JSON answer through
``json_response``; the bodies the API shares between routes (a topic, a
subscription) are built here so route modules never import each other.
Problems (errors) are server/errors.py's.

The empty-body rule (docs/protocol.md "Requests"): a body of zero bytes or only
whitespace is *no body*. A route whose body is optional (``PUT /v1/topics/{t}``,
``POST …/redrive``) then uses its defaults, as for ``{}``; every other route
answers 400 ``bad_request``. A body that is JSON ``null`` is a body: refused with
``bad_request`` wherever an object is expected, like any other wrong JSON type.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from herald.protocol.errors import BadRequest, PayloadTooLarge
from herald.protocol.snapshot import StatsSnapshot, SubscriptionSnapshot
from storage.topic import Topic

if TYPE_CHECKING:
    from subscribers.webhook import WebhookDispatchers

JSON = "application/json"

# Small admin bodies never need the full publish allowance.
ADMIN_BODY_LIMIT = 1024 * 1024

# ---------------------------------------------------------------- reading


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it would exceed ``limit``.

    Checks the declared length first and counts while streaming, so a client
    that lies about (or omits) Content-Length still never makes us hold more
    than ``limit`` bytes.
    """
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if declared > limit:
            raise PayloadTooLarge(f"the request body is over max_request_bytes ({limit})")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over max_request_bytes ({limit})")
        if chunk:
            parts.append(chunk)
    return b"".join(parts)


async def body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """A plain ASGI request's body as Starlette's ``Request.stream()`` gives it (for the
    layers that answer without the router: publish, forwarding to a coordinator)."""
    while True:
        message = await receive()
        if message["type"] == "http.request":
            yield message.get("body", b"")
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("the request body is not valid JSON") from None


def parse_json_body(raw: bytes, *, optional: bool = False) -> Any:
    """The parsed body; an empty one is ``{}`` when ``optional``, else bad_request."""
    if not raw.strip():
        if optional:
            return {}
        raise BadRequest("a JSON body is required")
    return parse_json(raw)


async def json_body(
    request: Request, *, optional: bool = False, limit: int = ADMIN_BODY_LIMIT
) -> Any:
    """Read and parse a request's JSON body (see the module's empty-body rule)."""
    raw = await read_body(request.stream(), request.headers.get("content-length"), limit)
    return parse_json_body(raw, optional=optional)


def parse_json_exact(raw: bytes) -> Any | None:
    """The body with every integer exact (the standard library's parser), or None when it
    nests deeper than the standard library can read (such a body is refused anyway, for
    its depth). Only called on a body orjson already accepted as valid JSON."""

    def exact_int(text: str) -> int:
        # 25 digits or more is outside 64 bits whatever they are: ±2**64 says so without
        # converting thousands of digits (which Python refuses past 4300).
        if len(text) < 25:
            return int(text)
        return -(2**64) if text.startswith("-") else 2**64

    try:
        return json.loads(raw.decode("utf-8"), parse_int=exact_int)
    except RecursionError:
        return None


# ---------------------------------------------------------------- answering


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


encode_model = msgspec.json.Encoder().encode


def model_response(body: msgspec.Struct, status: int = 200) -> Response:
    """An answer declared as a protocol model (herald/protocol/), encoded as it is."""
    return Response(encode_model(body), status_code=status, media_type=JSON)


def topic_body(topic: Topic) -> dict[str, Any]:
    """The GET /v1/topics/{topic} body (PROTOCOL §2)."""
    return {
        "name": topic.name,
        "config": topic.config.to_dict(),
        "partitions": [
            {
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "bytes": p.size_bytes,
            }
            for p in topic.partitions
        ],
        "messages_total": topic.messages_total,
        "bytes_total": topic.bytes_total,
        # docs/protocol.md extension: created by a publish or a subscription (a typo?)
        "auto_created": topic.auto_created,
    }


def push_stats(webhooks: WebhookDispatchers, name: str) -> dict[str, Any]:
    """endpoint_state, last_status, last_error… of a push subscription; {} for others."""
    return webhooks.stats(name) or {}


def subscription_body(
    engine: Any, name: str, webhooks: Any = None, *, admin: bool = True
) -> dict[str, Any]:
    """The GET /v1/subscriptions/{name} body: config with defaults filled, and §5 stats
    (with the push members of docs/protocol.md for a push subscription). Shown to a
    non-admin (PROTOCOL §6), a push url has no user info and no query."""
    config = engine.get(name)
    stats = engine.stats(name)
    if webhooks is not None and (push := webhooks.stats(name)) is not None:
        stats.update(push)
    shown = config.public_dict()
    if not admin and isinstance(shown.get("push"), dict):
        shown["push"] = {**shown["push"], "url": without_secrets(shown["push"]["url"])}
    return {"name": name, "config": shown, "stats": stats}


def is_admin(scope: Any) -> bool:
    """Whether the caller may see everything (an open server: everyone may)."""
    principal = scope.get("state", {}).get("principal")
    return principal is None or bool(principal.is_admin)


def shown_to_non_admin(snapshot: StatsSnapshot) -> StatsSnapshot:
    """A stats snapshot whose push urls have no user info or query (PROTOCOL §6)."""
    shown = [_push_url_shown(s) for s in snapshot.subscriptions]
    return msgspec.structs.replace(snapshot, subscriptions=shown)


def _push_url_shown(subscription: SubscriptionSnapshot) -> SubscriptionSnapshot:
    push = subscription.config.push
    if push is None:
        return subscription
    shown = msgspec.structs.replace(push, url=without_secrets(push.url))
    config = msgspec.structs.replace(subscription.config, push=shown)
    return msgspec.structs.replace(subscription, config=config)


def without_secrets(url: str) -> str:
    """``url`` without user info, query or fragment (where credentials hide)."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
