"""With an auth file (PROTOCOL §6) the console asks for a token, and an admin action
with a token that lacks the admin right is refused with a clear message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot


def test_console_asks_for_a_token_and_refuses_admin_actions_to_a_non_admin(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path, page: Any
) -> None:
    admin_id, admin = new_token()
    viewer_id, viewer = new_token()
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(
        toml_entry(admin_id, admin, ["admin"], [])
        + "\n"
        + toml_entry(viewer_id, viewer, ["metrics", "subscribe"], ["src*"])
    )
    server = herald_factory("--auth-file", str(auth_file))
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=server.url, headers=headers) as http:
        assert http.put("/v1/topics/src", json={}).status_code == 201
        sub = {"topic": "src", "dead_letter_topic": "src.dlq", "start": "earliest"}
        assert http.put("/v1/subscriptions/guarded", json=sub).status_code == 201
        assert http.put("/v1/topics/src.dlq", json={}).status_code == 201
        dead = {"value": 1, "headers": {"herald-source-topic": "src"}}  # something to redrive
        assert (
            http.post("/v1/topics/src.dlq/messages", json={"messages": [dead]}).status_code == 200
        )
        assert http.get("/v1/stats", headers={"Authorization": ""}).status_code == 401

    page.goto(f"{server.url}/console/#/subscriptions")
    page.wait_for_selector("#token-dialog[open]")
    screenshot(page, "auth-token")
    page.fill("#token-input", viewer)
    page.click("#token-dialog button")
    expect(page.locator("#live-text")).to_have_text("live")
    assert page.evaluate("sessionStorage.getItem('herald.token')") == viewer
    page.click("tr[data-subscription=guarded]")
    page.click("#redrive")
    page.click("#confirm-ok")
    page.wait_for_selector("#toast:not([hidden])")
    assert "needs a token with the admin right" in page.inner_text("#toast")
    screenshot(page, "auth-forbidden")
    # Reading the dead letters needs only subscribe on the topic; changing settings is admin.
    no_reason = "tr.reason-group[data-reason=''] .reason-count"
    expect(page.locator(no_reason)).to_have_text("1")
    page.fill("#edit-max_in_flight", "5")
    page.click("#edit-save")
    expect(page.locator("#edit-error")).to_contain_text("needs a token with the admin right")
    # The 401s before the token was given are the browser's own network log lines.
    assert [e for e in page.console_errors if "401" not in e and "403" not in e] == []


def test_a_refused_token_is_said_to_be_refused(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path, page: Any
) -> None:
    token_id, token = new_token()
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(toml_entry(token_id, token, ["admin"], []))
    server = herald_factory("--auth-file", str(auth_file))
    page.goto(f"{server.url}/console/")
    page.wait_for_selector("#token-dialog[open]")
    expect(page.locator("#token-refused")).to_be_hidden()  # nothing was refused yet
    page.fill("#token-input", "hrl_wrong")
    page.click("#token-dialog button")
    page.wait_for_selector("#token-dialog[open]")
    expect(page.locator("#token-refused")).to_be_visible()
    screenshot(page, "auth-refused")
    page.fill("#token-input", token)
    page.click("#token-dialog button")
    expect(page.locator("#live-text")).to_have_text("live")
    expect(page.locator("#token-dialog")).not_to_have_attribute("open", "")
