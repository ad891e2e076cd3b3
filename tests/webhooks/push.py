"""What the webhook tests against a real server share: the push secret, a push
subscription made over HTTP, a publish, a subscription's stats, a topic read whole, and
receiver behaviours (tests/webhooks/receiver.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx

from tests.webhooks.receiver import Answer, Received

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"herald-old-secret-0123456789abc").decode()
NEVER_OPENS = {"failures": 1000}  # a breaker that stays closed however many fail


def push_subscription(
    url: str, name: str, topic: str, receiver_url: str, **fields: Any
) -> dict[str, Any]:
    push = {"url": receiver_url, "secret": SECRET, **fields.pop("push", {})}
    body = {"topic": topic, "start": "earliest", "push": push, **fields}
    response = httpx.put(f"{url}/v1/subscriptions/{name}", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def dead_lettering_subscription(
    url: str, name: str, topic: str, receiver_url: str, dead_letter_topic: str, **fields: Any
) -> dict[str, Any]:
    """A push subscription that dead-letters a record after its third failed delivery,
    retrying quickly (``retry_backoff`` in ``fields`` overrides 10-50 ms), its breaker
    never opening (``push`` in ``fields`` adds to that)."""
    fields = {"max_deliveries": 3, "retry_backoff": {"min_ms": 10, "max_ms": 50}, **fields}
    fields["push"] = {"breaker": NEVER_OPENS, **fields.get("push", {})}
    return push_subscription(
        url, name, topic, receiver_url, dead_letter_topic=dead_letter_topic, **fields
    )


def publish(url: str, topic: str, values: list[Any]) -> None:
    response = httpx.post(
        f"{url}/v1/topics/{topic}/messages", json={"messages": [{"value": v} for v in values]}
    )
    assert response.status_code == 200, response.text


def stats(url: str, name: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/subscriptions/{name}").json()["stats"])


def read_topic(url: str, topic: str) -> list[dict[str, Any]]:
    """Partition 0 of ``topic`` from offset 0 (no topic yet: nothing)."""
    response = httpx.get(f"{url}/v1/topics/{topic}/partitions/0/messages", params={"offset": 0})
    if response.status_code == 404:
        return []
    return list(response.json()["messages"])


def fail_first(k: int) -> Callable[[Received], Answer]:
    """A receiver that answers 500 to a record's first ``k`` attempts, then 200."""

    def behaviour(received: Received) -> Answer:
        assert received.message is not None
        return Answer(500 if received.message["attempt"] <= k else 200)

    return behaviour
