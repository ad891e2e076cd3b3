"""Webhook push routes (docs/protocol.md "Webhook push"): the attempt log of a push
subscription, rotating its secret, and the push members its stats carry."""

from __future__ import annotations

import dataclasses

import orjson
from starlette.requests import Request
from starlette.responses import Response

from delivery.config import PushConfig
from herald.protocol.names import check_name
from server.http import json_body, json_response, subscription_body
from server.runtime import services
from server.validation import parse_secret_rotation
from storage.writer import wall_clock_ms


async def get_attempts(request: Request) -> Response:
    """`GET /v1/subscriptions/{name}/attempts`: the last attempts, newest first (PROTOCOL
    §8), those kept on disk before a restart included; a subscription that is not (or
    not yet) pushed has none."""
    name = check_name(request.path_params["name"], "subscription")
    state = services(request)
    state.engine.get(name)  # SubscriptionNotFound -> 404 problem JSON
    dispatcher = state.webhooks.get(name)
    if dispatcher is None:
        return json_response({"subscription": name, "attempts": []})
    await dispatcher.history_read()  # a coordinator that just took it over reads it first
    attempts = [a.as_dict() for a in dispatcher.attempts.recent()]
    return json_response({"subscription": name, "attempts": attempts})


async def rotate_secret(request: Request) -> Response:
    """`POST /v1/subscriptions/{name}/push/rotate-secret` (docs/protocol.md, "Rotating the
    secret"): the new secret signs from the next request on, the replaced one alongside it
    for `previous_ttl_ms`. Cursor, in-flight records, attempts and stats are untouched."""
    name = check_name(request.path_params["name"], "subscription")
    rotation = parse_secret_rotation(await json_body(request))
    state = services(request)
    now_ms = wall_clock_ms()

    def rotated(push: PushConfig) -> PushConfig:
        return push.rotated(rotation.secret, now_ms + rotation.previous_ttl_ms, now_ms)

    current = state.engine.get(name)
    if state.cluster is not None and current.push is not None:
        # PROTOCOL §7: etcd holds the config: written first (a 503 there changes nothing).
        wanted = rotated(current.push)
        stored = dataclasses.replace(current, push=wanted)
        await state.cluster.store_subscription(name, orjson.dumps(stored.to_storage()))
        await state.webhooks.update_push(name, lambda _: wanted)
    else:
        await state.webhooks.update_push(name, rotated)
    return json_response(subscription_body(state.engine, name, state.webhooks))
