"""A push subscription in the console: endpoint state, why delivery is paused
(circuit open) and the attempt log, against a real failing endpoint."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.console.conftest import screenshot


class Failing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def failing_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()
    thread.join()


def test_push_subscription_shows_circuit_open_and_its_attempt_log(
    herald_url: str, failing_endpoint: str, page: Any
) -> None:
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
    push = {
        "url": failing_endpoint,
        "secret": secret,
        "breaker": {"failures": 2, "open_ms": 60_000},
    }
    with httpx.Client(base_url=herald_url) as http:
        response = http.put("/v1/subscriptions/hooked", json={"topic": "events", "push": push})
        assert response.status_code == 201, response.text
        assert (
            http.post(
                "/v1/topics/events/messages", json={"messages": [{"value": 1}, {"value": 2}]}
            ).status_code
            == 200
        )

    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=hooked]")
    page.wait_for_selector("#sub-pause [data-pause=circuit_open]")
    expect(page.locator("#attempts tbody tr").nth(1)).to_be_attached()
    assert "500" in page.inner_text("#attempts")
    assert "open" in page.inner_text("#push-stats")
    assert "nothing is sent until a probe" in page.inner_text("#endpoint-state-why")
    screenshot(page, "webhook")
    assert page.console_errors == []


def test_a_batching_subscription_shows_its_batches_and_their_size(
    herald_url: str, failing_endpoint: str, page: Any
) -> None:
    """PROTOCOL §8 push.batch: the panel says what a request carries; the attempt log
    shows a batch as its first record and how many more it carried."""
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
    push = {
        "url": failing_endpoint,
        "secret": secret,
        "batch": {"max_records": 5, "max_wait_ms": 200},
        "breaker": {"failures": 1, "open_ms": 60_000},
    }
    with httpx.Client(base_url=herald_url) as http:
        response = http.put("/v1/subscriptions/batched", json={"topic": "bevents", "push": push})
        assert response.status_code == 201, response.text
        published = http.post(
            "/v1/topics/bevents/messages", json={"messages": [{"value": i} for i in range(3)]}
        )
        assert published.status_code == 200, published.text

    page.goto(f"{herald_url}/console/#/subscriptions")
    page.click("tr[data-subscription=batched]")
    expect(page.locator("#push-body")).to_contain_text("up to 5 records per request")
    expect(page.locator("#push-body")).to_contain_text("200 ms")
    expect(page.locator("#attempts tbody tr").first).to_contain_text("0-0 +2 more")
    assert page.console_errors == []
