"""The selected topic or subscription lives in the URL: a reload keeps it, a link opens
it, back and forward walk the selections, and a name that does not exist says so."""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.console.conftest import screenshot
from tests.console.test_console import publish


def subscribe(url: str, name: str, topic: str) -> None:
    body = {"topic": topic, "start": "earliest"}
    response = httpx.put(f"{url}/v1/subscriptions/{name}", json=body)
    assert response.status_code == 201, response.text


def expect_subscription_shown(page: Any, name: str) -> None:
    expect(page).to_have_url(re.compile(rf"/console/#/subscriptions/{re.escape(name)}$"))
    expect(page.locator("#sub-detail h2").first).to_have_text(name)
    expect(page.locator("tr.selected")).to_have_attribute("data-subscription", name)


def test_selected_subscription_survives_reload_and_back_and_forward(
    herald_url: str, page: Any
) -> None:
    publish(herald_url, "orders", [{"value": 1}])
    subscribe(herald_url, "workers", "orders")
    subscribe(herald_url, "billing.v2", "orders")
    page.goto(f"{herald_url}/console/#/subscriptions")
    expect(page.locator("#sub-hint")).to_contain_text("Select a subscription")
    page.click("tr[data-subscription=workers]")
    expect_subscription_shown(page, "workers")
    page.reload()
    expect_subscription_shown(page, "workers")

    page.click("tr[data-subscription='billing.v2']")
    expect_subscription_shown(page, "billing.v2")
    page.go_back()
    expect_subscription_shown(page, "workers")
    page.go_forward()
    expect_subscription_shown(page, "billing.v2")
    page.go_back()
    page.go_back()  # the page as first opened: nothing selected
    expect(page).to_have_url(re.compile(r"/console/#/subscriptions$"))
    expect(page.locator("#sub-detail h2")).to_have_count(0)
    expect(page.locator("#sub-hint")).to_contain_text("Select a subscription")
    expect(page.locator("tr.selected")).to_have_count(0)

    # From the subscription to its topic, and back.
    page.go_forward()
    page.click("#sub-detail a[href='#/topics/orders']")
    expect(page).to_have_url(re.compile(r"/console/#/topics/orders$"))
    expect(page.locator("#topic-detail h2").first).to_have_text("Partitions of orders")
    page.go_back()
    expect_subscription_shown(page, "workers")
    assert page.console_errors == []


def test_a_deep_link_opens_the_topic_or_subscription_it_names(herald_url: str, page: Any) -> None:
    publish(herald_url, "audit.log", [{"value": {"who": "deep-link"}}])
    subscribe(herald_url, "auditor", "audit.log")
    fresh = page.context.new_page()  # a new tab: a real page load, not a hash change
    fresh.goto(f"{herald_url}/console/#/topics/audit.log")
    expect(fresh.locator("#topic-detail h2").first).to_have_text("Partitions of audit.log")
    expect(fresh.locator("#nav a.active")).to_have_text("Topics")
    fresh.click("#browse-load")
    expect(fresh.locator("#browse-messages")).to_contain_text("deep-link")

    fresh.goto(f"{herald_url}/console/#/subscriptions/auditor")
    expect_subscription_shown(fresh, "auditor")
    expect(fresh.locator("#sub-backlog")).to_have_text("1")

    other = page.context.new_page()
    other.goto(f"{herald_url}/console/#/subscriptions/nope")
    expect(other.locator("#sub-missing")).to_contain_text("No subscription named nope")
    other.goto(f"{herald_url}/console/#/topics/missing.topic")
    expect(other.locator("#topic-missing")).to_contain_text("No topic named missing.topic")
    screenshot(other, "missing-topic")


def test_a_slow_click_on_a_row_survives_the_refresh(herald_url: str, page: Any) -> None:
    """A click is a mousedown and a mouseup on the same element: the once-a-second
    refresh must not replace the row in between (a person's press can take that long)."""
    publish(herald_url, "slow", [{"value": 0}])
    subscribe(herald_url, "patient", "slow")
    page.goto(f"{herald_url}/console/#/subscriptions")
    row = page.locator("tr[data-subscription=patient]")
    expect(row.locator("td").nth(2)).to_have_text("1")
    box = row.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    publish(herald_url, "slow", [{"value": 1}])
    expect(row.locator("td").nth(2)).to_have_text("2")  # refreshed under the pressed button
    page.mouse.up()
    expect_subscription_shown(page, "patient")
    assert page.console_errors == []


def test_on_a_phone_the_tables_fit_and_keep_the_delivery_state(herald_url: str, page: Any) -> None:
    publish(herald_url, "small.screen", [{"value": 1}])
    subscribe(herald_url, "pocket", "small.screen")
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{herald_url}/console/#/subscriptions")
    badge = page.locator("tr[data-subscription=pocket] .badge")
    expect(badge).to_have_text("no consumers")
    box = badge.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390, box
    table = page.locator("#subs-table table").bounding_box()
    assert table is not None and table["x"] + table["width"] <= 390, table
    screenshot(page, "subscriptions-phone")
    page.goto(f"{herald_url}/console/#/topics")
    table = page.locator("#topics-table table")
    expect(table).to_contain_text("small.screen")
    box = table.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390, box
    assert page.console_errors == []


def test_selecting_a_row_far_down_brings_its_detail_into_view(herald_url: str, page: Any) -> None:
    publish(herald_url, "many", [{"value": 1}])
    for n in range(14):
        subscribe(herald_url, f"sub-{n:02d}", "many")
    page.set_viewport_size({"width": 390, "height": 700})
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=sub-00]")  # at the top: the detail is below all 14
    title = page.locator("#sub-detail h2").first
    expect(title).to_have_text("sub-00")
    expect(title).to_be_in_viewport()
    box = title.bounding_box()
    assert box is not None and box["y"] >= page.locator("header").bounding_box()["height"], box
    assert page.console_errors == []
