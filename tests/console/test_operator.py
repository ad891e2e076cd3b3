"""The console as an operator uses it (issue 28): dialogs belong to their page, browse
opens where the records are, a subscription lists its consumers, a topic lists its
subscriptions and takes a publish, and auto-created topics are marked."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from playwright.sync_api import expect
from websockets.sync.client import connect

from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot
from tests.console.test_console import publish
from tests.console.test_navigation import subscribe
from tests.helpers import wait_until_sync


def backlog(url: str, name: str) -> int:
    response = httpx.get(f"{url}/v1/subscriptions/{name}")
    assert response.status_code == 200, response.text
    value: int = response.json()["stats"]["backlog"]
    return value


def test_a_seek_confirmation_does_not_survive_the_back_button(herald_url: str, page: Any) -> None:
    publish(herald_url, "orders", [{"value": n} for n in range(3)])
    subscribe(herald_url, "workers", "orders")
    seeks: list[str] = []
    page.on("request", lambda r: seeks.append(r.url) if r.url.endswith("/seek") else None)
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=workers]")
    expect(page).to_have_url(re.compile(r"#/subscriptions/workers$"))
    page.click("#seek-latest")
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    page.go_back()
    expect(page).to_have_url(re.compile(r"#/subscriptions$"))
    expect(dialog).to_be_hidden()
    # Its Seek button, pressed anyway (a script, as no person can reach it now), does nothing.
    page.evaluate("document.getElementById('confirm-ok').click()")
    page.click("tr[data-subscription=workers]")  # a round trip through the page's tasks
    expect(page.locator("#sub-backlog")).to_have_text("3")
    assert seeks == []
    assert backlog(herald_url, "workers") == 3
    assert page.console_errors == []


def test_browse_opens_on_a_partition_that_has_records(herald_url: str, page: Any) -> None:
    response = httpx.put(f"{herald_url}/v1/topics/sparse", json={"partitions": 3})
    assert response.status_code == 201, response.text
    publish(herald_url, "sparse", [{"value": {"where": "in-two"}, "partition": 2}])
    page.goto(f"{herald_url}/console/#/topics/sparse")
    expect(page.locator("#browse-messages")).to_contain_text("in-two")
    expect(page.locator("#browse-partition")).to_have_value("2")
    options = page.locator("#browse-partition option")
    expect(options.nth(0)).to_contain_text("empty")
    expect(options.nth(2)).not_to_contain_text("empty")
    screenshot(page, "browse-sparse")
    assert page.console_errors == []


def test_a_subscription_lists_its_consumers_and_a_topic_its_subscriptions(
    herald_url: str, page: Any
) -> None:
    publish(herald_url, "jobs", [{"value": n} for n in range(2)])
    subscribe(herald_url, "runners", "jobs")
    subscribe(herald_url, "auditors", "jobs")
    ws_url = herald_url.replace("http://", "ws://") + "/v1/subscriptions/runners/ws?credit=5"
    with connect(ws_url) as consumer:
        ready = json.loads(consumer.recv(timeout=15))
        assert ready["type"] == "ready", ready
        host, port = consumer.socket.getsockname()[:2]
        received = 0
        while received < 2:  # both records are in flight to it: 5 credits, 3 left
            frame = json.loads(consumer.recv(timeout=15))
            if frame["type"] == "deliver":
                received += len(frame["messages"])

        # From outside: GET /v1/stats says the same.
        stats = httpx.get(f"{herald_url}/v1/stats").json()
        runners = next(s for s in stats["subscriptions"] if s["name"] == "runners")
        [listed] = runners["consumers"]
        assert listed["id"] == ready["consumer"]
        assert listed["address"] == f"{host}:{port}"
        assert (listed["credit"], listed["in_flight"]) == (3, 2)
        assert isinstance(listed["connected_ms"], int)

        page.goto(f"{herald_url}/console/#/subscriptions/runners")
        consumer_id = ready["consumer"]
        row = page.locator(f"#sub-consumers tr[data-consumer='{consumer_id}']")
        expect(row.locator("td").nth(1)).to_have_text(f"{host}:{port}")
        expect(row.locator("td").nth(2)).to_have_text("3")
        expect(row.locator("td").nth(3)).to_have_text("2")
        screenshot(page, "subscription-consumers")
    expect(page.locator("#no-consumers")).to_have_text("No consumer is connected.")

    page.goto(f"{herald_url}/console/#/topics/jobs")
    subs = page.locator("#topic-subs tr[data-subscription]")
    expect(subs).to_have_count(2)
    expect(page.locator("#topic-subs tr[data-subscription=auditors] td").nth(1)).to_have_text("2")
    page.click("#topic-subs a[href='#/subscriptions/runners']")
    expect(page.locator("#sub-detail h2").first).to_have_text("runners")
    assert page.console_errors == []


def test_the_topic_page_publishes_a_record_and_shows_the_offset_or_the_problem(
    herald_url: str, page: Any
) -> None:
    publish(herald_url, "payments", [{"value": "first"}])
    page.goto(f"{herald_url}/console/#/topics/payments")
    page.fill("#publish-key", "cust-7")
    page.fill("#publish-headers", '{"source": "console"}')
    page.fill("#publish-value", '{"amount": 4711}')
    page.click("#publish-send")
    expect(page.locator("#publish-result")).to_have_text("Published to partition 0 at offset 1.")
    read = httpx.get(f"{herald_url}/v1/topics/payments/partitions/0/messages?offset=1").json()
    [record] = read["messages"]
    assert (record["key"], record["headers"], record["value"]) == (
        "cust-7",
        {"source": "console"},
        {"amount": 4711},
    )

    # The server's problem, in its own words: a header value that is not a string.
    page.fill("#publish-headers", '{"source": 7}')
    page.click("#publish-send")
    result = page.locator("#publish-result")
    expect(result).to_contain_text("bad_request")
    expect(result).to_contain_text("messages[0].headers")  # the field's path, as §2 says
    expect(result).to_have_class("error")
    # Not JSON at all never leaves the page.
    page.fill("#publish-headers", "")
    page.fill("#publish-value", "{oops")
    page.click("#publish-send")
    expect(result).to_contain_text("The value is not JSON")
    screenshot(page, "topic-publish")
    read = httpx.get(f"{herald_url}/v1/topics/payments/partitions/0/messages?offset=0").json()
    assert len(read["messages"]) == 2
    # Chromium logs the 400 it asked for; nothing else may go wrong.
    assert [e for e in page.console_errors if "status of 400" not in e] == []


def test_auto_created_topics_are_marked_and_the_mark_survives_a_restart(
    herald_server: HeraldProcess, page: Any
) -> None:
    url = herald_server.url
    assert httpx.put(f"{url}/v1/topics/orders", json={}).status_code == 201
    publish(url, "orders", [{"value": 1}])
    publish(url, "ordres", [{"value": 1}])  # a typo: auto-create makes the topic
    subscribe(url, "shipping", "shipments")  # so does a subscription naming a new topic

    def marks() -> dict[str, bool]:
        return {
            name: httpx.get(f"{url}/v1/topics/{name}").json()["auto_created"]
            for name in ("orders", "ordres", "shipments")
        }

    assert marks() == {"orders": False, "ordres": True, "shipments": True}
    herald_server.kill()  # no clean shutdown: the mark is on disk with the topic
    herald_server.restart()
    assert marks() == {"orders": False, "ordres": True, "shipments": True}

    page.goto(f"{url}/console/#/topics")
    expect(page.locator("tr[data-topic=ordres] .badge.auto")).to_have_text("auto-created")
    expect(page.locator("tr[data-topic=shipments] .badge.auto")).to_have_text("auto-created")
    expect(page.locator("tr[data-topic=orders]")).to_be_visible()
    expect(page.locator("tr[data-topic=orders] .badge.auto")).to_have_count(0)
    screenshot(page, "topics-auto-created")
    assert page.console_errors == []


def test_the_overview_opens_with_the_charts_of_the_last_minutes(herald_url: str, page: Any) -> None:
    def samples() -> list[dict[str, int]]:
        body = httpx.get(f"{herald_url}/v1/stats?history=1").json()
        found: list[dict[str, int]] = body["history"]["samples"]
        return found

    wait_until_sync(lambda: len(samples()) >= 1, what="a first sample of the counters")
    publish(herald_url, "history", [{"value": n} for n in range(50)])
    wait_until_sync(
        lambda: samples()[-1]["published_records_total"] == 50, what="a sample after the publish"
    )
    history = samples()
    assert history[0]["published_records_total"] == 0
    assert [s["now_ms"] for s in history] == sorted(s["now_ms"] for s in history)

    # Nothing is published after the page opens: only the server's history can draw a peak.
    page.goto(f"{herald_url}/console/#/overview")
    chart = page.locator("#chart-published")
    expect(chart).to_have_attribute("data-peak", re.compile(r"^[1-9]"))
    screenshot(page, "overview-history")
    assert page.console_errors == []
