"""Subscription routes of PROTOCOL §2: create/inspect/delete and seek."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from delivery.config import SubscriptionConfig
from server.publish import ensure_topic
from server.routes_topics import ADMIN_BODY_LIMIT, json_response
from server.routing import method_route
from server.validation import (
    check_name,
    parse_json,
    parse_seek,
    parse_subscription_config,
    read_body,
)
from storage.errors import BadRequest


def subscription_body(engine: Any, name: str, webhooks: Any = None) -> dict[str, Any]:
    """The GET /v1/subscriptions/{name} body: config with defaults filled, and §5 stats
    (with the push members of docs/protocol.md for a push subscription)."""
    config: SubscriptionConfig = engine.get(name)
    stats = engine.stats(name)
    if webhooks is not None and (push := webhooks.stats(name)) is not None:
        stats.update(push)
    return {"name": name, "config": config.public_dict(), "stats": stats}


async def _json_body(request: Request) -> Any:
    raw = await read_body(request.stream(), request.headers.get("content-length"), ADMIN_BODY_LIMIT)
    if not raw.strip():
        raise BadRequest("a JSON body is required")
    return parse_json(raw)


async def put_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    config, given = parse_subscription_config(await _json_body(request))
    state = request.app.state
    engine = state.engine
    # Decided before any topic is auto-created: a refused PUT changes nothing (409 raised).
    if engine.existing(name, config, given) is not None:
        return json_response(subscription_body(engine, name), 200)
    await ensure_topic(state, config.topic)
    async with state.admin_lock:
        # The engine compares the same fields again if a concurrent PUT created it
        # while the topic was made.
        _, created = await engine.create_subscription(name, config, given)
        if not created:
            return json_response(subscription_body(engine, name), 200)
        state.webhooks.ensure(name)  # PROTOCOL §4: a push subscription starts delivering
    return json_response(subscription_body(engine, name, state.webhooks), 201)


async def list_subscriptions(request: Request) -> Response:
    engine = request.app.state.engine
    return json_response(
        {
            "subscriptions": [
                {"name": name, "config": engine.get(name).public_dict()}
                for name in sorted(engine.names())
            ]
        }
    )


async def get_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    state = request.app.state
    return json_response(subscription_body(state.engine, name, state.webhooks))


async def delete_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    state = request.app.state
    async with state.admin_lock:
        await state.engine.delete_subscription(name)
    return Response(status_code=204)


async def seek(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    target = parse_seek(await _json_body(request))
    state = request.app.state
    await state.engine.seek(name, target)
    return json_response(subscription_body(state.engine, name, state.webhooks))


routes = [
    method_route("/v1/subscriptions", GET=list_subscriptions),
    method_route(
        "/v1/subscriptions/{name}",
        GET=get_subscription,
        PUT=put_subscription,
        DELETE=delete_subscription,
    ),
    method_route("/v1/subscriptions/{name}/seek", POST=seek),
]
