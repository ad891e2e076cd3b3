"""What the console says about delivery: records dropped for want of a dead-letter topic
are called dropped, and "paused: backoff" appears only when nothing can be delivered."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from playwright.sync_api import expect
from websockets.sync.client import ClientConnection, connect

from tests.console.conftest import screenshot
from tests.console.test_console import publish


def socket_url(url: str, subscription: str, credit: int) -> str:
    return f"{url.replace('http', 'ws', 1)}/v1/subscriptions/{subscription}/ws?credit={credit}"


def next_delivery(ws: ClientConnection) -> list[dict[str, Any]]:
    for _ in range(100):
        frame = json.loads(ws.recv(timeout=15))
        if frame["type"] == "deliver":
            return list(frame["messages"])
    raise AssertionError("no deliver frame")


def dead_letter_one(url: str, subscription: str) -> None:
    """Receive one record and nack it: with max_deliveries 1 it is dead-lettered at once."""
    with connect(socket_url(url, subscription, 1)) as ws:
        ids = [m["id"] for m in next_delivery(ws)]
        ws.send(json.dumps({"type": "nack", "ids": ids}))
        deadline = time.monotonic() + 15
        while httpx.get(f"{url}/v1/subscriptions/{subscription}").json()["stats"][
            "dead_lettered_total"
        ] < len(ids):
            assert time.monotonic() < deadline, "not dead-lettered"
            time.sleep(0.05)


def test_drops_without_a_dead_letter_topic_are_called_dropped(herald_url: str, page: Any) -> None:
    publish(herald_url, "jobs", [{"value": "poison"}])
    base = {"topic": "jobs", "start": "earliest", "max_deliveries": 1}
    with httpx.Client(base_url=herald_url) as http:
        assert http.put("/v1/subscriptions/lossy", json=base).status_code == 201
        kept = {**base, "dead_letter_topic": "jobs.dlq"}
        assert http.put("/v1/subscriptions/kept", json=kept).status_code == 201
    dead_letter_one(herald_url, "lossy")
    dead_letter_one(herald_url, "kept")

    page.goto(f"{herald_url}/console/#/subscriptions")
    lossy = page.locator("td[data-dead=lossy]")
    expect(lossy).to_have_text("1 dropped")
    assert "no dead_letter_topic" in lossy.locator("span").get_attribute("title").lower()
    expect(page.locator("td[data-dead=kept]")).to_have_text("1")

    page.click("tr[data-subscription=lossy]")
    expect(page.locator("#sub-dead")).to_have_text("1 (0/s)")
    assert page.locator("#sub-dead").locator("xpath=..").locator("th").inner_text() == "Dropped"
    expect(page.locator("#no-dlq")).to_contain_text("no dead_letter_topic is set")
    expect(page.locator("#dropped-count")).to_have_text("1 record")
    screenshot(page, "dropped")
    page.click("tr[data-subscription=kept]")
    expect(page.locator("#sub-dead")).to_have_text("1 (0/s)")
    assert page.locator("#sub-dead").locator("xpath=..").locator("th").inner_text() == (
        "Dead-lettered"
    )
    expect(page.locator("#dlq-size")).to_have_text("1 record held")

    page.click("#nav a[data-page=overview]")
    expect(page.locator("#stat-dead")).to_have_text("1")
    expect(page.locator("#stat-dropped")).to_have_text("+ 1 dropped")
    screenshot(page, "overview-dropped")
    assert page.console_errors == []


@contextmanager
def stream_with_one_nacked_record(
    url: str, topic: str, subscription: str
) -> Iterator[threading.Event]:
    """A consumer that nacks its first record for ten minutes and acks every other one,
    fed one record every 50 ms until the yielded event is set."""
    stop_publishing = threading.Event()
    stop_consuming = threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with httpx.Client(base_url=url) as http:
                for i in range(2000):
                    if stop_publishing.wait(0.05):
                        return
                    body = {"messages": [{"value": i}]}
                    assert http.post(f"/v1/topics/{topic}/messages", json=body).status_code == 200
        except BaseException as error:  # reported by the test, not lost in the thread
            failures.append(error)

    def consume(ws: ClientConnection) -> None:
        nacked = False
        try:
            while not stop_consuming.is_set():
                try:
                    frame = json.loads(ws.recv(timeout=0.2))
                except TimeoutError:
                    continue
                if frame["type"] != "deliver":
                    continue
                ids = [m["id"] for m in frame["messages"]]
                if not nacked:
                    ws.send(json.dumps({"type": "nack", "ids": ids[:1], "delay_ms": 600_000}))
                    ids, nacked = ids[1:], True
                time.sleep(0.02)  # the work
                if ids:
                    ws.send(json.dumps({"type": "ack", "ids": ids}))
                ws.send(json.dumps({"type": "credit", "n": len(frame["messages"])}))
        except BaseException as error:
            failures.append(error)

    with connect(socket_url(url, subscription, 100)) as ws:
        producer = threading.Thread(target=produce)
        consumer = threading.Thread(target=consume, args=(ws,))
        producer.start()
        consumer.start()
        try:
            yield stop_publishing
        finally:
            stop_publishing.set()
            producer.join(30)
            stop_consuming.set()
            consumer.join(30)
    assert not producer.is_alive() and not consumer.is_alive()
    assert failures == []


def test_backoff_badge_shows_only_when_nothing_is_deliverable(herald_url: str, page: Any) -> None:
    with httpx.Client(base_url=herald_url) as http:
        assert http.put("/v1/topics/stream", json={}).status_code == 201
        sub = {"topic": "stream", "start": "earliest"}
        assert http.put("/v1/subscriptions/steady", json=sub).status_code == 201
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=steady]")
    badge = page.locator("#sub-pause .badge")
    expect(badge).to_have_text("caught up")
    with stream_with_one_nacked_record(herald_url, "stream", "steady") as stop_publishing:
        expect(badge).to_have_text("delivering")
        expect(page.locator("#sub-acked")).not_to_have_text("0 (0/s)")
        shown = []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:  # about six snapshots, sampled ten times each
            shown.append(badge.inner_text())
            time.sleep(0.1)
        screenshot(page, "delivering-with-a-retry-pending")
        # "paused: backoff" is right whenever a snapshot saw nothing delivered for a
        # second (the producer or the server stalled on a loaded host): the stream keeps
        # it "delivering" most of the time, not every sample.
        assert shown.count("delivering") > len(shown) / 2, shown
        assert set(shown) <= {"delivering", "paused: backoff"}, shown
        # The stream stops: only the nacked record is left, waiting out its delay.
        stop_publishing.set()
        expect(badge).to_have_text("paused: backoff")
        assert "1 record waits" in (badge.get_attribute("title") or "")
        screenshot(page, "paused-backoff")
    assert page.console_errors == []


def test_redrive_is_offered_only_once_there_are_dead_letters(herald_url: str, page: Any) -> None:
    publish(herald_url, "tasks", [{"value": "poison"}])
    sub = {"topic": "tasks", "start": "earliest", "max_deliveries": 1}
    sub["dead_letter_topic"] = "tasks.dlq"
    assert httpx.put(f"{herald_url}/v1/subscriptions/retrier", json=sub).status_code == 201
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=retrier]")
    expect(page.locator("#dlq-size")).to_contain_text("not created yet")
    expect(page.locator("#redrive")).to_be_disabled()
    assert "Nothing to redrive" in (page.locator("#redrive").get_attribute("title") or "")
    dead_letter_one(herald_url, "retrier")
    expect(page.locator("#dlq-size")).to_have_text("1 record held")
    expect(page.locator("#redrive")).to_be_enabled()
    assert page.console_errors == []
