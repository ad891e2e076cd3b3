"""Subscription routes of PROTOCOL §2: create/inspect/delete and seek."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from delivery.config import SubscriptionConfig
from server.http import existing_subscription, json_body, json_response, subscription_body
from server.publish import ensure_topic
from server.routing import method_route
from server.validation import (
    SeekTarget,
    check_name,
    parse_seek,
    parse_subscription_config,
    subscription_config_matches,
)
from storage.errors import PartitionNotFound, SubscriptionConflict


async def put_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    config, given = parse_subscription_config(await json_body(request))
    state = request.app.state
    engine = state.engine
    existing = existing_subscription(engine, name)
    if existing is not None:
        # Decided before any topic is auto-created: a refused PUT changes nothing.
        if not subscription_config_matches(existing, config, given):
            raise SubscriptionConflict(f"subscription {name!r} exists with a different config")
        return json_response(subscription_body(engine, name), 200)
    await ensure_topic(state, config.topic)
    async with state.admin_lock:
        existing = existing_subscription(engine, name)
        if existing is not None:  # created by a concurrent PUT while the topic was made
            if not subscription_config_matches(existing, config, given):
                raise SubscriptionConflict(f"subscription {name!r} exists with a different config")
            return json_response(subscription_body(engine, name), 200)
        # `given`: the engine compares the same fields if a racing PUT created it first.
        _, created = await engine.create_subscription(name, config, given)
        state.webhooks.ensure(name)  # PROTOCOL §4: a push subscription starts delivering
    return json_response(subscription_body(engine, name, state.webhooks), 201 if created else 200)


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
    target = parse_seek(await json_body(request))
    state = request.app.state
    engine = state.engine
    config: SubscriptionConfig = engine.get(name)
    if target.offsets is not None:
        topic = state.storage.topic(config.topic)
        partitions = len(topic.partitions) if topic is not None else 0
        for partition in target.offsets:
            if not 0 <= partition < partitions:
                raise PartitionNotFound(f"topic {config.topic!r} has no partition {partition}")
    await engine.seek(name, engine_seek_target(target))
    return json_response(subscription_body(engine, name, state.webhooks))


def engine_seek_target(target: SeekTarget) -> Any:
    """SeekTarget in the form DeliveryEngine.seek takes (docs/architecture.md)."""
    if target.to is not None:
        return target.to
    if target.timestamp is not None:
        return {"timestamp": target.timestamp}
    return target.offsets


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
