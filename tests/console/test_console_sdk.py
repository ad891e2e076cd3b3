"""The console's live views go through the browser SDK (issue 17: one client, not two):
it loads /sdk/herald.js, opens no WebSocket of its own, and its live tail resumes across
a server restart showing every record once, which its old hand-made socket did not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot

STATIC = Path(__file__).resolve().parents[2] / "web_console" / "static"


def publish(url: str, topic: str, values: list[str]) -> None:
    body = {"messages": [{"key": v, "value": v} for v in values]}
    response = httpx.post(f"{url}/v1/topics/{topic}/messages", json=body, timeout=10)
    assert response.status_code == 200, response.text


def tailed(page: Any) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of the tail's records, oldest first."""
    rows = page.locator("#tail-messages .message").evaluate_all(
        "els => els.map(e => [e.querySelector('.meta b').textContent, e.dataset.offset,"
        " e.querySelector('pre.value').textContent])"
    )
    return [(int(p), int(o), json.loads(v)) for p, o, v in reversed(rows)]


def test_the_console_tail_resumes_across_a_restart_through_the_sdk(
    herald_server: HeraldProcess, page: Any
) -> None:
    url = herald_server.url
    made = httpx.put(f"{url}/v1/topics/resumed", json={"partitions": 2}, timeout=10)
    assert made.status_code == 201, made.text
    page.goto(f"{url}/console/#/topics/resumed")
    page.click("#tail-toggle")
    expect(page.locator("#tail-state")).to_have_text("live")
    before = [f"a{i}" for i in range(10)]
    publish(url, "resumed", before)
    expect(page.locator("#tail-messages .message")).to_have_count(10)

    herald_server.kill()
    expect(page.locator("#tail-state")).to_have_text("reconnecting")
    herald_server.restart()
    after = [f"b{i}" for i in range(10)]
    publish(url, "resumed", after)  # possibly before the page is back: it resumes
    expect(page.locator("#tail-state")).to_have_text("live")
    expect(page.locator("#tail-messages .message")).to_have_count(20)
    screenshot(page, "tail-resumed")

    records = tailed(page)
    assert sorted(v for _, _, v in records) == sorted(before + after)  # each once
    for partition in (0, 1):
        offsets = [o for p, o, _ in records if p == partition]
        assert offsets == list(range(len(offsets))), (partition, offsets)  # in order, no hole

    # The console's modules came with the SDK, from the same origin (the CSP holds).
    loaded = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert f"{url}/sdk/herald.js" in loaded


def test_the_console_opens_no_websocket_of_its_own() -> None:
    """Live data is the SDK's job: no console module builds a socket or a socket URL."""
    for module in sorted(STATIC.glob("*.js")):
        text = module.read_text()
        assert "new WebSocket" not in text, module.name
        assert "/ws" not in text, module.name
