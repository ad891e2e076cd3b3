"""Webhook push end to end (PROTOCOL §4): a real Herald and real receivers on loopback."""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest

from tests.webhooks.receiver import Answer, Receiver, Received

SECRET = "whsec_" + base64.b64encode(b"herald-test-secret-0123456789ab").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"herald-old-secret-0123456789abc").decode()


def push_subscription(
    url: str, name: str, topic: str, receiver_url: str, **fields: Any
) -> dict[str, Any]:
    push = {"url": receiver_url, "secret": SECRET, **fields.pop("push", {})}
    body = {"topic": topic, "start": "earliest", "push": push, **fields}
    response = httpx.put(f"{url}/v1/subscriptions/{name}", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def publish(url: str, topic: str, values: list[Any]) -> None:
    response = httpx.post(
        f"{url}/v1/topics/{topic}/messages", json={"messages": [{"value": v} for v in values]}
    )
    assert response.status_code == 200, response.text


def stats(url: str, name: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/subscriptions/{name}").json()["stats"])


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def fail_first(k: int) -> Any:
    def behaviour(received: Received) -> Answer:
        assert received.message is not None
        return Answer(500 if received.message["attempt"] <= k else 200)

    return behaviour


def test_flaky_receiver_gets_every_record_with_growing_backoff(herald_url: str, unique: Any) -> None:
    topic, name = unique("t"), unique("s")
    with Receiver([SECRET], fail_first(3)) as receiver:
        push_subscription(
            herald_url,
            name,
            topic,
            receiver.url,
            retry_backoff={"min_ms": 50, "max_ms": 2000},
            push={"breaker": {"failures": 1000}},
        )
        publish(herald_url, topic, [{"n": i} for i in range(5)])
        receiver.wait_for(lambda: len(receiver.acked_ids()) == 5)
        received = receiver.snapshot()
    assert all(r.message is not None for r in received), "every request verifies"
    assert len(received) == 5 * 4
    for i in range(5):
        attempts = [r for r in received if r.message and r.message["offset"] == i]
        assert [r.message["attempt"] for r in attempts if r.message] == [1, 2, 3, 4]
        assert len({r.headers["webhook-id"] for r in attempts}) == 1  # same id on retries
        assert attempts[0].headers["webhook-id"] == f"{name}:0-{i}"
        gaps = [b.at - a.at for a, b in zip(attempts, attempts[1:], strict=False)]
        # d = min·2^(n-1) jittered to [0.8d, d]: 40..50, 80..100, 160..200 ms
        assert gaps[0] >= 0.035 and gaps[1] >= 0.075 and gaps[2] >= 0.155, gaps
        assert gaps[2] > gaps[0]
    wait_until(lambda: stats(herald_url, name)["acked_total"] == 5)
    s = stats(herald_url, name)
    assert s["backlog"] == 0 and s["redelivered_total"] == 15
    assert s["endpoint_state"] == "closed" and s["last_status"] == 200
    log = httpx.get(f"{herald_url}/v1/subscriptions/{name}/attempts").json()["attempts"]
    assert len(log) == 20 and {a["status"] for a in log} == {500, 200}
    assert {"time", "id", "attempt", "status", "latency_ms", "error"} <= set(log[0])
