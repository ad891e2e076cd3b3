"""Webhook push routes (docs/protocol.md "Webhook push"): the attempt log of a push
subscription, and the push members its stats carry."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.routes_topics import json_response
from server.routing import method_route
from server.validation import check_name


def push_stats(state: Any, name: str) -> dict[str, Any]:
    """endpoint_state, last_status, last_error… of a push subscription; {} for others."""
    webhooks = getattr(state, "webhooks", None)
    stats = None if webhooks is None else webhooks.stats(name)
    return stats or {}


async def get_attempts(request: Request) -> Response:
    """`GET /v1/subscriptions/{name}/attempts`: the last attempts, oldest first; a
    subscription that is not (or not yet) pushed has none."""
    name = check_name(request.path_params["name"], "subscription")
    state = request.app.state
    state.engine.get(name)  # SubscriptionNotFound -> 404 problem JSON
    dispatcher = state.webhooks.get(name)
    attempts = [] if dispatcher is None else [a.as_dict() for a in dispatcher.attempts.recent()]
    return json_response({"subscription": name, "attempts": attempts})


routes = [method_route("/v1/subscriptions/{name}/attempts", GET=get_attempts)]
