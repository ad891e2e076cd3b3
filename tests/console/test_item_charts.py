"""A topic's and a subscription's pages open with their charts drawn (issue 28): the
server keeps each one's samples of the last 15 minutes (GET /v1/stats/history, in
docs/protocol.md "Stats"), and what the charts cover matches the stats API."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from playwright.sync_api import expect
from websockets.sync.client import connect

from tests.console.conftest import screenshot
from tests.console.test_console import publish
from tests.console.test_navigation import subscribe
from tests.helpers import wait_until_sync

NONZERO = re.compile(r"^[1-9]")


def samples(url: str, **which: str) -> list[dict[str, int]]:
    response = httpx.get(f"{url}/v1/stats/history", params=which)
    assert response.status_code == 200, response.text
    found: list[dict[str, int]] = response.json()["samples"]
    return found


def consume_and_ack(url: str, subscription: str, count: int) -> None:
    """A consumer with ``count`` credits takes that many records, acks them and leaves."""
    ws_url = url.replace("http://", "ws://") + f"/v1/subscriptions/{subscription}/ws?credit={count}"
    with connect(ws_url) as consumer:
        assert json.loads(consumer.recv(timeout=15))["type"] == "ready"
        ids: list[str] = []
        while len(ids) < count:
            frame = json.loads(consumer.recv(timeout=15))
            if frame["type"] == "deliver":
                ids.extend(m["id"] for m in frame["messages"])
        consumer.send(json.dumps({"type": "ack", "ids": ids}))
        wait_until_sync(
            lambda: (
                httpx.get(f"{url}/v1/subscriptions/{subscription}").json()["stats"]["acked_total"]
                == count
            ),
            what="the acks counted",
        )


def test_topic_and_subscription_pages_open_with_the_charts_of_the_last_minutes(
    herald_url: str, page: Any
) -> None:
    assert httpx.put(f"{herald_url}/v1/topics/orders", json={}).status_code == 201
    subscribe(herald_url, "workers", "orders")
    # A first sample of each before anything flows: the charts then cover every record.
    wait_until_sync(
        lambda: bool(
            samples(herald_url, topic="orders") and samples(herald_url, subscription="workers")
        ),
        what="a first sample of the topic and the subscription",
    )
    publish(herald_url, "orders", [{"value": n} for n in range(40)])
    consume_and_ack(herald_url, "workers", 10)

    topic = httpx.get(f"{herald_url}/v1/topics/orders").json()
    stats = httpx.get(f"{herald_url}/v1/subscriptions/workers").json()["stats"]
    assert (topic["messages_total"], stats["delivered_total"], stats["acked_total"]) == (40, 10, 10)
    assert stats["backlog"] == 30
    wanted = {"delivered_total": 10, "acked_total": 10, "backlog": 30}

    def caught_up() -> bool:
        last = samples(herald_url, subscription="workers")[-1]
        return {k: last[k] for k in wanted} == wanted

    wait_until_sync(caught_up, what="a sample of the subscription after the acks")
    history = samples(herald_url, topic="orders")
    assert history[0]["published_records_total"] == 0
    assert history[-1]["published_records_total"] == topic["messages_total"]
    assert [s["now_ms"] for s in history] == sorted(s["now_ms"] for s in history)

    # Nothing flows after the pages open: only the server's history can draw these.
    page.goto(f"{herald_url}/console/#/topics/orders")
    published = page.locator("#chart-topic-published")
    expect(published).to_have_attribute("data-peak", NONZERO)
    expect(published).to_have_attribute("data-increase", "40")
    screenshot(page, "topic-charts")

    page.goto(f"{herald_url}/console/#/subscriptions/workers")
    for chart, increase in (("delivered", "10"), ("acked", "10")):
        canvas = page.locator(f"#chart-sub-{chart}")
        expect(canvas).to_have_attribute("data-peak", NONZERO)
        expect(canvas).to_have_attribute("data-increase", increase)
    backlog = page.locator("#chart-sub-backlog")
    expect(backlog).to_have_attribute("data-last", "30")
    expect(backlog).to_have_attribute("data-peak", re.compile(r"^(30|40)$"))
    expect(page.locator("#sub-backlog")).to_have_text("30")
    screenshot(page, "subscription-charts")
    assert page.console_errors == []


def test_a_history_names_one_topic_or_one_subscription(herald_url: str) -> None:
    for params in ({}, {"topic": "a", "subscription": "b"}):
        response = httpx.get(f"{herald_url}/v1/stats/history", params=params)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/problem+json"
    bad = httpx.get(f"{herald_url}/v1/stats/history", params={"topic": "no/such"})
    assert bad.status_code == 400, bad.text
    # A name this server holds no samples of: nothing to draw yet, not an error.
    assert samples(herald_url, subscription="never-made") == []
