"""Subscription routes of PROTOCOL §2 and §8: create/inspect/change/delete, seek, and
pull with its ack and nack."""

from __future__ import annotations

import asyncio

import orjson
from starlette.requests import Request
from starlette.responses import Response

from cluster.errors import LeaderUnavailable
from delivery.config import SubscriptionConfig
from herald.protocol.errors import SubscriptionNotFound
from herald.protocol.names import check_name
from server.http import is_admin, json_body, json_response, subscription_body
from server.limits import client_address
from server.publish import ensure_topic
from server.runtime import Services, services
from server.validation import (
    parse_ack,
    parse_nack,
    parse_pull,
    parse_seek,
    parse_subscription_config,
    parse_subscription_patch,
)
from subscribers.frames import is_message_id
from subscribers.wire import deliveries_json, json_array


async def put_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    config, given = parse_subscription_config(await json_body(request))
    state = services(request)
    if config.push is not None:  # PROTOCOL §6: webhooks do not reach inside
        await state.webhooks.destinations.check_url(config.push.url)
    engine = state.engine
    if state.cluster is not None and engine.existing(name, config, given) is None:
        return await _create_in_cluster(request, state, name, config)
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


async def _create_in_cluster(
    request: Request, state: Services, name: str, config: SubscriptionConfig
) -> Response:
    """PROTOCOL §7: the config goes to etcd; the subscription's coordinator (this node or
    another) starts it, and answers for it. A name taken meanwhile is the existing
    subscription's: its coordinator compares the configs (200 or 409)."""
    cluster, peers = state.cluster, state.peers
    assert cluster is not None and peers is not None
    await ensure_topic(state, config.topic)
    created = await cluster.create_subscription(name, orjson.dumps(config.to_storage()))
    url = await cluster.wait_coordinated(name)
    if cluster.coordinates(name):
        if not await cluster.wait_applied(lambda: name in state.engine.names()):
            raise LeaderUnavailable(f"subscription {name!r} is starting; try again")
        if not created:
            state.engine.existing(name, config)  # 409 when it differs
        return json_response(
            subscription_body(state.engine, name, state.webhooks), 201 if created else 200
        )
    if url is None:
        raise LeaderUnavailable(f"subscription {name!r} has no coordinator yet; try again")
    headers = {k: v for k, v in request.headers.items()}
    method, body = ("GET", b"") if created else ("PUT", await request.body())
    for _ in range(_STARTING_TRIES):
        answer = await peers.forward(
            url, method, request.url.path, b"", body, headers, client_address(request.scope)
        )
        if answer.status_code != 503:
            break
        await asyncio.sleep(0.5)  # its coordinator is starting it: bounded, then the 503
    status = 201 if created and answer.status_code == 200 else answer.status_code
    return Response(
        answer.content, status_code=status, media_type=answer.headers.get("content-type")
    )


_STARTING_TRIES = 20


async def list_subscriptions(request: Request) -> Response:
    state = services(request)
    if state.cluster is not None:  # etcd's list: every node answers the same
        configs = {
            name: SubscriptionConfig.from_storage(orjson.loads(data))
            for name, data in state.cluster.subscriptions.items()
        }
        return json_response(
            {
                "subscriptions": [
                    {"name": name, "config": configs[name].public_dict()}
                    for name in sorted(configs)
                ]
            }
        )
    engine = state.engine
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
    admin = is_admin(request.scope)
    return json_response(subscription_body(state.engine, name, state.webhooks, admin=admin))


async def patch_subscription(request: Request) -> Response:
    """PROTOCOL §8 change in place: applied at once, cursor and in-flight records kept."""
    name = check_name(request.path_params["name"], "subscription")
    patch = parse_subscription_patch(await json_body(request))
    state = services(request)
    push = patch.changes.get("push")
    if push is not None:  # PROTOCOL §6: webhooks do not reach inside
        await state.webhooks.destinations.check_url(push.url)
    async with state.admin_lock:
        if state.cluster is not None:
            # PROTOCOL §7: etcd first (a 503 there changes nothing), then applied here.
            current = state.engine.get(name)
            wanted = patch.apply(current)
            if wanted != current:
                await state.cluster.store_subscription(name, orjson.dumps(wanted.to_storage()))
            old, new = await state.engine.update_subscription(name, lambda _: wanted)
        else:
            old, new = await state.engine.update_subscription(name, patch.apply)
        # push given starts pushing; push: null stops it (WebSocket and pull drain it).
        await state.webhooks.reconfigured(name, old, new)
    return json_response(subscription_body(state.engine, name, state.webhooks))


async def delete_subscription(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    state = services(request)
    if state.cluster is not None:
        # etcd first; the coordinator then closes its consumers with 4410 (PROTOCOL §3).
        if not await state.cluster.delete_subscription(name):
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")
        await state.cluster.wait_applied(lambda: name not in state.engine.names())
        return Response(status_code=204)
    async with state.admin_lock:
        await state.engine.delete_subscription(name)
    return Response(status_code=204)


async def seek(request: Request) -> Response:
    name = check_name(request.path_params["name"], "subscription")
    target = parse_seek(await json_body(request))
    state = services(request)
    await state.engine.seek(name, target)
    return json_response(subscription_body(state.engine, name, state.webhooks))


async def pull(request: Request) -> Response:
    """PROTOCOL §8: records from the subscription's own cursor, as any consumer gets them;
    a long-poll (`wait_ms`) ends as soon as records come, and at once on SIGTERM."""
    name = check_name(request.path_params["name"], "subscription")
    wanted = parse_pull(await json_body(request, optional=True))
    state = services(request)
    engine = state.engine
    topic = engine.get(name).topic
    deliveries = await engine.pull(name, wanted.max_messages, wanted.wait_ms / 1000, state.stopping)
    messages = json_array(deliveries_json(topic, deliveries, name))
    return Response(b'{"messages":' + messages + b"}", media_type="application/json")


async def ack(request: Request) -> Response:
    """PROTOCOL §8: `{"ok": [...], "unknown": [...]}`, for any in-flight record."""
    name = check_name(request.path_params["name"], "subscription")
    ids = parse_ack(await json_body(request))
    ok, unknown = services(request).engine.ack_in(name, ids)
    # Not a message id at all: certainly not in flight, listed after the well-formed ones.
    unknown = [
        *(i for i in unknown if is_message_id(i)),
        *(i for i in unknown if not is_message_id(i)),
    ]
    return json_response({"ok": ok, "unknown": unknown})


async def nack(request: Request) -> Response:
    """PROTOCOL §8: redeliver after delay_ms or the backoff; unknown ids are ignored."""
    name = check_name(request.path_params["name"], "subscription")
    wanted = parse_nack(await json_body(request))
    ids = [i for i in wanted.ids if is_message_id(i)]
    services(request).engine.nack_in(name, ids, wanted.delay_ms, wanted.reason)
    return Response(status_code=204)
