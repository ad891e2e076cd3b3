"""The console in a real browser against a real server: it loads cleanly, moves with
the traffic, shows records, and its seek and redrive buttons do what they say."""

from __future__ import annotations

import time
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot
from tests.helpers import wait_until_sync


# Waits go through locators, not wait_for_function: the console's Content-Security-Policy
# forbids the eval that a string predicate needs, and the tests keep that policy on.
def wait_for_text(page: Any, element_id: str, text: str) -> None:
    expect(page.locator(f"#{element_id}")).to_have_text(text)


def publish(url: str, topic: str, messages: list[dict[str, Any]]) -> None:
    response = httpx.post(f"{url}/v1/topics/{topic}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text


def test_console_loads_cleanly_and_its_counters_and_chart_move(herald_url: str, page: Any) -> None:
    page.goto(f"{herald_url}/console")
    page.wait_for_selector("#stat-published")
    wait_for_text(page, "live-text", "live")
    assert page.inner_text("#stat-published") == "0"
    blank = page.evaluate("document.getElementById('chart-published').toDataURL()")
    for i in range(6):
        publish(herald_url, "metrics", [{"value": {"n": i * 10 + j}} for j in range(10)])
        time.sleep(0.3)
    wait_for_text(page, "stat-published", "60")
    chart = "document.getElementById('chart-published').toDataURL()"
    wait_until_sync(lambda: page.evaluate(chart) != blank, what="the chart redrawn")
    assert page.inner_text("#stat-topics") == "1"
    screenshot(page, "overview")
    page.emulate_media(color_scheme="dark")
    screenshot(page, "overview-dark")
    page.set_viewport_size({"width": 420, "height": 800})
    screenshot(page, "overview-narrow")
    assert page.console_errors == []


def test_browser_shows_a_published_records_value_and_bytes_as_hex(
    herald_url: str, page: Any
) -> None:
    publish(
        herald_url,
        "orders",
        [
            {"key": "k-1", "headers": {"source": "test"}, "value": {"order": "console-4711"}},
            {"key": "k-2", "value_b64": "3q2+7w=="},
        ],
    )
    page.goto(f"{herald_url}/console/#/topics")
    page.click("tr[data-topic=orders]")
    page.click("#browse-load")
    page.wait_for_selector("#browse-messages .message")
    text = page.inner_text("#browse-messages")
    assert '"order": "console-4711"' in text
    assert "k-1" in text and "source=test" in text
    assert "de ad be ef" in text
    screenshot(page, "topics")
    assert page.console_errors == []


def test_message_browser_pages_forward_and_back_and_reads_by_time(
    herald_url: str, page: Any
) -> None:
    publish(herald_url, "pages", [{"value": {"n": i}} for i in range(30)])
    page.goto(f"{herald_url}/console/#/topics")
    page.fill("#new-topic-name", "made.here")
    page.fill("#new-topic-partitions", "2")
    page.click("#create-topic")
    page.wait_for_selector("tr[data-topic='made.here']")
    made = httpx.get(f"{herald_url}/v1/topics/made.here").json()
    assert len(made["partitions"]) == 2
    page.click("tr[data-topic=pages]")
    page.click("#browse-load")
    wait_for_text(page, "browse-info", "offsets 0\u201319")
    page.click("#browse-next")
    wait_for_text(page, "browse-info", "offsets 20\u201329")
    assert page.locator("#browse-messages .message").count() == 10
    page.click("#browse-prev")
    wait_for_text(page, "browse-info", "offsets 0\u201319")
    page.select_option("#browse-mode", "timestamp")
    page.fill("#browse-time", "2000-01-01T00:00:00")
    page.click("#browse-load")
    wait_for_text(page, "browse-info", "offsets 0\u201319")
    page.fill("#browse-time", "2999-01-01T00:00:00")
    page.click("#browse-load")
    wait_for_text(page, "browse-info", "at offset 30")
    assert page.console_errors == []


def test_live_tail_shows_new_records(herald_url: str, page: Any) -> None:
    publish(herald_url, "live", [{"value": "before"}])
    page.goto(f"{herald_url}/console/#/topics")
    page.click("tr[data-topic=live]")
    page.click("#tail-toggle")
    wait_for_text(page, "tail-state", "live")
    publish(herald_url, "live", [{"value": "tailed-record"}])
    page.wait_for_selector("#tail-messages .message")
    assert "tailed-record" in page.inner_text("#tail-messages")
    page.click("#tail-toggle")
    assert page.inner_text("#tail-state") == "paused"
    assert page.console_errors == []


def test_seek_and_redrive_work_from_the_ui(herald_url: str, page: Any) -> None:
    with httpx.Client(base_url=herald_url) as http:
        seek_and_redrive(herald_url, http, page)


def seek_and_redrive(herald_url: str, http: httpx.Client, page: Any) -> None:
    publish(herald_url, "src", [{"value": i} for i in range(5)])
    response = http.put(
        "/v1/subscriptions/workers",
        json={"topic": "src", "start": "earliest", "dead_letter_topic": "src.dlq"},
    )
    assert response.status_code == 201, response.text
    dead = {"herald-source-topic": "src", "herald-source-partition": "0"}
    publish(herald_url, "src.dlq", [{"value": {"dead": i}, "headers": dead} for i in range(3)])

    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=workers]")
    wait_for_text(page, "sub-backlog", "5")
    assert page.inner_text("#dlq-size") == "3 records held"
    page.click("#seek-latest")
    page.click("#confirm-ok")
    wait_for_text(page, "sub-backlog", "0")
    page.click("#seek-earliest")
    page.click("#confirm-ok")
    wait_for_text(page, "sub-backlog", "5")
    page.fill("#seek-time", "2999-01-01T00:00:00")
    page.click("#seek-timestamp")
    page.click("#confirm-ok")
    wait_for_text(page, "sub-backlog", "0")
    page.fill("#seek-time", "2000-01-01T00:00:00")
    page.click("#seek-timestamp")
    page.click("#confirm-ok")
    wait_for_text(page, "sub-backlog", "5")

    page.click("#redrive")
    page.wait_for_selector("#confirm-dialog[open]")
    screenshot(page, "redrive-confirm")
    page.click("#confirm-ok")
    expect(page.locator("#redrive-result")).to_contain_text("3 republished")
    topic = http.get("/v1/topics/src").json()
    assert topic["partitions"][0]["end_offset"] == 8
    records = http.get("/v1/topics/src/partitions/0/messages?offset=5").json()["messages"]
    assert [r["value"] for r in records] == [{"dead": 0}, {"dead": 1}, {"dead": 2}]
    assert all("herald-source-topic" not in r["headers"] for r in records)

    page.click("#redrive")  # a second redrive is deduplicated, not republished
    page.click("#confirm-ok")
    expect(page.locator("#redrive-result")).to_contain_text("3 already redriven")
    assert http.get("/v1/topics/src").json()["partitions"][0]["end_offset"] == 8
    screenshot(page, "subscriptions")
    assert page.console_errors == []


def test_seek_asks_first_and_a_cancelled_seek_changes_nothing(herald_url: str, page: Any) -> None:
    publish(herald_url, "backlogged", [{"value": i} for i in range(5)])
    sub = {"topic": "backlogged", "start": "earliest"}
    assert httpx.put(f"{herald_url}/v1/subscriptions/careful", json=sub).status_code == 201
    seeks: list[str] = []
    page.on("request", lambda r: seeks.append(r.url) if r.url.endswith("/seek") else None)
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=careful]")
    wait_for_text(page, "sub-backlog", "5")

    def backlog() -> int:
        stats = httpx.get(f"{herald_url}/v1/subscriptions/careful").json()["stats"]
        return int(stats["backlog"])

    page.click("#seek-latest")
    page.wait_for_selector("#confirm-dialog[open]")
    question = page.inner_text("#confirm-dialog")
    assert "backlog of 5 records" in question and "will not be delivered" in question
    screenshot(page, "seek-confirm")
    page.click("#confirm-dialog button[value=cancel]")
    expect(page.locator("#confirm-dialog")).not_to_have_attribute("open", "")
    page.click("#seek-earliest")  # Escape cancels too
    page.wait_for_selector("#confirm-dialog[open]")
    assert "all 5 records it holds are delivered again" in page.inner_text("#confirm-text")
    page.keyboard.press("Escape")
    expect(page.locator("#confirm-dialog")).not_to_have_attribute("open", "")
    wait_for_text(page, "sub-backlog", "5")  # a later snapshot: still untouched
    assert seeks == [] and backlog() == 5

    page.click("#seek-latest")
    page.click("#confirm-ok")
    wait_for_text(page, "sub-backlog", "0")
    assert len(seeks) == 1 and backlog() == 0
    assert page.console_errors == []


def test_overview_says_when_the_server_is_gone_and_when_it_is_back(
    herald_server: HeraldProcess, page: Any
) -> None:
    page.goto(f"{herald_server.url}/console/")
    wait_for_text(page, "live-text", "live")
    wait_for_text(page, "stat-health", "OK")
    herald_server.kill()
    wait_for_text(page, "live-text", "server unreachable")
    wait_for_text(page, "stat-health", "Unreachable")
    screenshot(page, "server-gone")
    herald_server.restart()
    wait_for_text(page, "stat-health", "OK")
    wait_for_text(page, "live-text", "live")


def test_an_empty_server_says_how_to_begin(herald_url: str, page: Any) -> None:
    page.goto(f"{herald_url}/console/")
    start = page.locator("#getting-started")
    expect(start).to_be_visible()
    assert f"curl {herald_url}/v1/topics/orders/messages" in start.inner_text()
    screenshot(page, "empty-server")
    page.click("#getting-started a[href='#/topics']")
    expect(page.locator("#topics-empty")).to_contain_text("Create one above")
    page.click("#nav a[data-page=subscriptions]")
    expect(page.locator("#subs-empty")).to_contain_text("herald subscriptions create")
    publish(herald_url, "orders", [{"value": {"item": "book"}}])
    page.click("#nav a[data-page=overview]")
    expect(page.locator("#stat-topics")).to_have_text("1")
    expect(start).to_be_hidden()
    assert page.console_errors == []


def test_a_subscription_shows_its_delayed_records(herald_url: str, page: Any) -> None:
    """PROTOCOL §8 delayed delivery: the detail counts records waiting for deliver_at."""
    with httpx.Client(base_url=herald_url, timeout=30) as http:
        made = http.put("/v1/subscriptions/later", json={"topic": "remind", "start": "earliest"})
        assert made.status_code == 201, made.text
        publish(herald_url, "remind", [{"value": 1, "delay_ms": 600_000}, {"value": 2}])
        # A pull reads the log: the plain record goes, the delayed one is set aside.
        pulled = http.post("/v1/subscriptions/later/pull", json={"wait_ms": 1000})
        assert [m["value"] for m in pulled.json()["messages"]] == [2]
        acked = http.post("/v1/subscriptions/later/ack", json={"ids": ["0-1"]})
        assert acked.json()["ok"] == ["0-1"]
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=later]")
    wait_for_text(page, "sub-delayed", "1")
    wait_for_text(page, "sub-pause", "waiting: delayed records")
    wait_for_text(page, "sub-backlog", "1")
    assert page.console_errors == []
