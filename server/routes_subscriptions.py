"""Subscription routes of PROTOCOL §2: create/inspect/delete and seek."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http import json_body, json_response, subscription_body
from server.publish import ensure_topic
from server.routing import method_route
from server.runtime import services
from server.validation import (
    check_name,
    parse_seek,
    parse_subscription_config,
)


async def put_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    config, given = parse_subscription_config(await json_body(request))
    state = services(request)
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
    engine = services(request).engine
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
    state = services(request)
    return json_response(subscription_body(state.engine, name, state.webhooks))


async def delete_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    state = services(request)
    async with state.admin_lock:
        await state.engine.delete_subscription(name)
    return Response(status_code=204)


async def seek(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    target = parse_seek(await json_body(request))
    state = services(request)
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
