"""The console changes what it shows, in a real browser against a real server: a
subscription edited in place (PROTOCOL §8 PATCH) with the server's errors shown inline,
a subscription created, a topic deleted, and dead letters grouped by why they died with
one reason's records redriven."""

from __future__ import annotations

import json
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.console.conftest import screenshot
from tests.console.test_console import publish
from tests.helpers import wait_until_sync

SECRET = "whsec_aGVyYWxkLWNvbnNvbGUtc2VjcmV0LTAxMjM0NTY3"


def only_refused_requests(errors: list[str]) -> bool:
    """The browser logs every 4xx answer; the 400s the test asked for are the only ones."""
    return all("status of 400 (Bad Request)" in e for e in errors)


def config_of(url: str, name: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/subscriptions/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json()["config"])


def test_editing_a_subscription_patches_it_and_shows_the_servers_errors(
    herald_url: str, page: Any
) -> None:
    sub = {"topic": "orders", "start": "earliest"}
    assert httpx.put(f"{herald_url}/v1/subscriptions/editable", json=sub).status_code == 201
    patches: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: patches.append(json.loads(r.post_data or "{}")) if r.method == "PATCH" else None,
    )
    page.goto(f"{herald_url}/console/#/subscriptions/editable")
    expect(page.locator("#edit-max_in_flight")).to_have_value("1000")

    # A filter that does not parse: the server's problem, its position marked; nothing changes.
    page.fill("#edit-max_in_flight", "50")
    page.fill("#edit-filter", 'key = "a" and headers:b')
    page.click("#edit-save")
    error = page.locator("#edit-error")
    expect(error).to_contain_text("bad_request")
    expect(error).to_contain_text("at position 10")
    caret = page.locator("#edit-error-caret").inner_text().split("\n")
    assert caret == ['key = "a" and headers:b', " " * 10 + "^"]
    screenshot(page, "edit-filter-error")
    assert patches == [{"max_in_flight": 50, "filter": 'key = "a" and headers:b'}]
    assert config_of(herald_url, "editable")["max_in_flight"] == 1000  # all or nothing

    page.fill("#edit-filter", 'key = "a" AND headers:b')
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Saved: max_in_flight, filter.")
    expect(error).to_be_hidden()
    config = config_of(herald_url, "editable")
    assert (config["max_in_flight"], config["filter"]) == (50, 'key = "a" AND headers:b')

    # Out of range: validation_error, shown the same way.
    page.fill("#edit-ack_deadline_ms", "5")
    page.click("#edit-save")
    expect(error).to_contain_text("validation_error")
    expect(error).to_contain_text("ack_deadline_ms")
    page.fill("#edit-ack_deadline_ms", "30000")

    # The page is drawn again from the 200 body: the dead-letter panel follows at once.
    expect(page.locator("#no-dlq")).to_be_visible()
    page.fill("#edit-dlq", "orders.dead")
    page.fill("#edit-backoff-max", "5000")
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Saved: retry_backoff, dead_letter_topic.")
    expect(page.locator("#dlq-size")).to_contain_text("not created yet")
    expect(page.locator("#edit-dlq")).to_have_value("orders.dead")
    config = config_of(herald_url, "editable")
    assert config["dead_letter_topic"] == "orders.dead"
    assert config["retry_backoff"] == {"min_ms": 100, "max_ms": 5000}

    # Push on (a secret is needed), then a new URL without the secret: the old one is kept.
    page.check("#edit-push")
    page.fill("#edit-push-url", "http://127.0.0.1:9/first")
    page.fill("#edit-push-secret", SECRET)
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Saved: push.")
    expect(page.locator("#webhook")).to_contain_text("http://127.0.0.1:9/first")
    page.fill("#edit-push-url", "http://127.0.0.1:9/second")
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Saved: push.")
    assert "secret" not in patches[-1]["push"]
    assert patches[-1]["push"]["url"] == "http://127.0.0.1:9/second"
    assert config_of(herald_url, "editable")["push"]["url"] == "http://127.0.0.1:9/second"
    page.uncheck("#edit-push")
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Saved: push.")
    assert patches[-1] == {"push": None}
    assert config_of(herald_url, "editable")["push"] is None
    page.click("#edit-save")
    expect(page.locator("#edit-result")).to_have_text("Nothing changed.")
    screenshot(page, "edit-saved")
    # Changed elsewhere (the CLI, another tab) while the form is untouched: drawn again.
    elsewhere = httpx.patch(f"{herald_url}/v1/subscriptions/editable", json={"max_in_flight": 77})
    assert elsewhere.status_code == 200, elsewhere.text
    expect(page.locator("#edit-max_in_flight")).to_have_value("77")
    # While the user is typing, it is not.
    page.fill("#edit-max_deliveries", "9")
    httpx.patch(f"{herald_url}/v1/subscriptions/editable", json={"max_in_flight": 78})
    # A record the filter lets through: a snapshot that shows it was taken after the PATCH.
    publish(herald_url, "orders", [{"key": "a", "headers": {"b": "1"}, "value": 1}])
    expect(page.locator("#sub-backlog")).to_have_text("1")
    expect(page.locator("#edit-max_deliveries")).to_have_value("9")
    expect(page.locator("#edit-max_in_flight")).to_have_value("77")
    # What is not a number is said so, not sent as an empty field (a reset to the default).
    sent = len(patches)
    page.fill("#edit-max_deliveries", "")
    page.type("#edit-max_deliveries", "1e")
    page.click("#edit-save")
    expect(error).to_contain_text("Max deliveries (0: never) is not a number")
    assert len(patches) == sent
    assert only_refused_requests(page.console_errors)


def test_a_subscription_is_created_from_the_list(herald_url: str, page: Any) -> None:
    publish(herald_url, "orders", [{"value": i} for i in range(3)])
    page.goto(f"{herald_url}/console/#/subscriptions")
    page.fill("#new-sub-name", "made.here")
    page.fill("#new-sub-topic", "orders")
    page.select_option("#new-sub-start", "earliest")
    page.fill("#new-sub-dlq", "orders.dlq")
    page.fill("#new-sub-max-deliveries", "3")
    page.fill("#new-sub-filter", "headers:")
    page.click("#create-sub")
    expect(page.locator("#new-sub-error")).to_contain_text("at position 8")
    assert httpx.get(f"{herald_url}/v1/subscriptions/made.here").status_code == 404
    page.fill("#new-sub-filter", "")
    page.click("#create-sub")
    expect(page.locator("tr[data-subscription='made.here']")).to_have_class("selectable selected")
    expect(page.locator("#sub-backlog")).to_have_text("3")  # from earliest
    expect(page.locator("#new-sub-error")).to_be_hidden()
    config = config_of(herald_url, "made.here")
    assert (config["topic"], config["start"], config["dead_letter_topic"]) == (
        "orders",
        "earliest",
        "orders.dlq",
    )
    assert config["max_deliveries"] == 3 and config["filter"] is None
    screenshot(page, "subscription-created")
    assert only_refused_requests(page.console_errors)


def test_deleting_a_topic_asks_first_and_names_its_subscriptions(
    herald_url: str, page: Any
) -> None:
    publish(herald_url, "doomed", [{"value": i} for i in range(4)])
    sub = {"topic": "doomed", "start": "earliest"}
    assert httpx.put(f"{herald_url}/v1/subscriptions/doomed.reader", json=sub).status_code == 201
    page.goto(f"{herald_url}/console/#/topics/doomed")
    page.click("#delete-topic")
    page.wait_for_selector("#confirm-dialog[open]")
    question = page.inner_text("#confirm-text")
    assert "4 records" in question and "doomed.reader" in question
    screenshot(page, "delete-topic-confirm")
    page.click("#confirm-dialog button[value=cancel]")
    expect(page.locator("#confirm-dialog")).not_to_have_attribute("open", "")
    assert httpx.get(f"{herald_url}/v1/topics/doomed").status_code == 200
    page.click("#delete-topic")
    page.click("#confirm-ok")
    expect(page.locator("tr[data-topic=doomed]")).to_have_count(0)
    expect(page.locator("#topic-hint")).to_be_visible()
    assert httpx.get(f"{herald_url}/v1/topics/doomed").status_code == 404
    assert httpx.get(f"{herald_url}/v1/subscriptions/doomed.reader").status_code == 404
    assert page.console_errors == []


def dead_letter_with_reasons(url: str) -> None:
    """A real pull consumer nacks each record with a reason; max_deliveries 1 makes each
    nack a dead letter saying it (PROTOCOL §8)."""
    sub = {"topic": "bills", "start": "earliest", "max_deliveries": 1}
    sub["dead_letter_topic"] = "bills.dlq"
    assert httpx.put(f"{url}/v1/subscriptions/graded", json=sub).status_code == 201
    publish(url, "bills", [{"key": f"b{i}", "value": {"bill": i}} for i in range(6)])
    with httpx.Client(base_url=url) as http:
        ids: list[str] = []
        for _ in range(20):  # bounded: a pull may answer with what is ready so far
            wanted = {"max_messages": 6 - len(ids), "wait_ms": 5000}
            ids += [
                m["id"]
                for m in http.post("/v1/subscriptions/graded/pull", json=wanted).json()["messages"]
            ]
            if len(ids) == 6:
                break
        assert sorted(ids) == [f"0-{i}" for i in range(6)]
        for chunk, reason in (
            (["0-0", "0-2", "0-4"], "bad amount"),
            (["0-1", "0-5"], "unknown customer"),
            (["0-3"], None),
        ):
            body = {"ids": chunk} if reason is None else {"ids": chunk, "reason": reason}
            assert http.post("/v1/subscriptions/graded/nack", json=body).status_code == 204

        def held() -> int:
            topic = http.get("/v1/topics/bills.dlq")
            return topic.json()["partitions"][0]["end_offset"] if topic.status_code == 200 else 0

        wait_until_sync(lambda: held() == 6, what="6 dead letters")


def test_dead_letters_are_grouped_by_reason_and_one_reason_is_redriven(
    herald_url: str, page: Any
) -> None:
    dead_letter_with_reasons(herald_url)
    page.goto(f"{herald_url}/console/#/subscriptions/graded")
    group = "tr.reason-group[data-reason='{}']".format
    expect(page.locator(f"{group('bad amount')} .reason-count")).to_have_text("3")
    expect(page.locator(f"{group('unknown customer')} .reason-count")).to_have_text("2")
    expect(page.locator(f"{group('nack')} .reason-count")).to_have_text("1")
    reasons = page.locator("tr.reason-group code.reason").all_inner_texts()
    assert reasons == ["bad amount", "unknown customer", "nack"]  # the most first

    # Within a group, newest first: dead-lettered later means a higher dead-letter offset.
    page.click("details.reason-records[data-reason='bad amount'] summary")
    rows = page.locator("details.reason-records[data-reason='bad amount'] li.dead-record")
    expect(rows).to_have_count(3)
    keys = [rows.nth(i).get_attribute("data-key") or "" for i in range(3)]
    offsets = [int(k.split("-")[1]) for k in keys]
    assert offsets == sorted(offsets, reverse=True)
    sources = {rows.nth(i).locator("code").first.inner_text() for i in range(3)}
    assert sources == {"0-0", "0-2", "0-4"}
    assert "b4" in rows.first.inner_text() or "b2" in rows.first.inner_text()
    screenshot(page, "dead-letters-by-reason")

    page.click(f"{group('bad amount')} button.redrive-reason")
    page.wait_for_selector("#confirm-dialog[open]")
    assert "3 dead letters" in page.inner_text("#confirm-text")
    assert "bad amount" in page.inner_text("#confirm-text")
    page.click("#confirm-ok")
    result = page.locator("#redrive-result")
    expect(result).to_contain_text("3 republished")
    expect(result).to_contain_text("3 with other reasons left")
    records = httpx.get(f"{herald_url}/v1/topics/bills/partitions/0/messages?offset=6").json()
    assert sorted(r["value"]["bill"] for r in records["messages"]) == [0, 2, 4]
    # The open list stays open across the page's refreshes.
    expect(page.locator("details.reason-records[data-reason='bad amount']")).to_have_attribute(
        "open", ""
    )
    assert page.console_errors == []
