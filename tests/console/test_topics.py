"""The Topics page as a first-time user meets it: a labelled create form that refuses a
bad name before asking the server, and a selected topic that shows its records at once."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import expect

from tests.console.conftest import screenshot
from tests.console.test_console import publish


def test_selecting_a_topic_shows_its_first_records_without_a_click(
    herald_url: str, page: Any
) -> None:
    with httpx.Client(base_url=herald_url) as http:
        assert http.put("/v1/topics/first.look", json={"partitions": 2}).status_code == 201
    publish(herald_url, "first.look", [{"partition": 0, "value": "on-zero"}])
    publish(herald_url, "first.look", [{"partition": 1, "value": "on-one"}])
    page.goto(f"{herald_url}/console/#/topics")
    expect(page.locator("#topic-hint")).to_contain_text("Select a topic")
    page.click("tr[data-topic='first.look']")
    expect(page.locator("#topic-hint")).to_have_count(0)
    expect(page.locator("#browse-messages")).to_contain_text("on-zero")
    expect(page.locator("#browse-info")).to_have_text("offsets 0\u20130")
    page.select_option("#browse-partition", "1")  # another partition loads at once too
    expect(page.locator("#browse-messages")).to_contain_text("on-one")
    expect(page.locator("#browse-messages")).not_to_contain_text("on-zero")
    screenshot(page, "topic-selected")
    assert page.console_errors == []


def test_create_topic_form_is_labelled_and_checks_the_name_first(
    herald_url: str, page: Any
) -> None:
    puts: list[str] = []
    page.on("request", lambda r: puts.append(r.url) if r.method == "PUT" else None)
    page.goto(f"{herald_url}/console/#/topics")
    expect(page.get_by_label("Partitions")).to_have_value("1")
    expect(page.get_by_label("Retention (hours)")).to_have_value("")
    page.get_by_label("Name").fill("not a name!")
    page.click("#create-topic")
    assert page.locator("#new-topic-name:invalid").count() == 1
    page.get_by_label("Name").fill("labelled.topic")
    page.get_by_label("Partitions").fill("3")
    page.get_by_label("Retention (hours)").fill("2")
    page.click("#create-topic")
    page.wait_for_selector("tr[data-topic='labelled.topic']")
    expect(page.locator("#topic-detail h2").first).to_have_text("Partitions of labelled.topic")
    assert puts == [f"{herald_url}/v1/topics/labelled.topic"]
    topic = httpx.get(f"{herald_url}/v1/topics/labelled.topic").json()
    assert len(topic["partitions"]) == 3
    assert topic["config"]["retention_ms"] == 2 * 3600_000
    screenshot(page, "topic-created")
    assert page.console_errors == []
