"""PROTOCOL §6 (settled 2026-11-26): a token is never written to a log, `?token=` included.

A real server writes its log (uvicorn's loggers and Herald's, the access log on, at
DEBUG) to a file while every client uses it with a token: the Python SDK's producer,
consumer, tail and puller, a raw WebSocket that still passes `?token=` (browsers did),
the browser SDK's tail with a minted browser token and the console's stats socket with
the operator's admin token in a real Chromium. Then the log is searched: no token's
secret appears in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets
from playwright.sync_api import expect

from herald import Consumer, Producer, Puller, Tail
from server.auth import new_signing_key_line
from tests.conftest import HeraldProcess
from tests.console.test_sdk import app_origin, open_page, wait_for  # noqa: F401
from tests.security.conftest import write_auth_file


def _secrets_in(log: str, tokens: list[str]) -> list[str]:
    """The tokens (their secrets: an id alone may be logged) found in ``log``. A secret is
    everything after ``hrd_<id>_``: it may hold ``_`` itself, and the part after its last
    one (what this took once) was a few characters that matched the log by chance (the
    console loop of 2026-11-27)."""
    found = []
    for token in tokens:
        secret = token.split("_", 2)[2] if token.startswith("hrd_") else token[4:]
        assert len(secret) >= 16, token[:12]
        if secret[:16] in log:
            found.append(token[:12] + "…")
    return found


async def _python_clients(url: str, tokens: dict[str, str]) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    async with httpx.AsyncClient(base_url=url, headers=admin, timeout=30) as http:
        assert (await http.put("/v1/topics/logs.a", json={"partitions": 1})).status_code == 201
        for name in ("logs-ws", "logs-pull"):
            sub = {"topic": "logs.a", "start": "earliest"}
            assert (await http.put(f"/v1/subscriptions/{name}", json=sub)).status_code == 201
    async with Producer(url, tokens["publisher"]) as producer:
        for i in range(5):
            await producer.send_and_wait("logs.a", i)
    async with Consumer(url, "logs-ws", tokens["subscriber"], credit=10) as consumer:
        taken = await asyncio.wait_for(consumer.take_batch(5), 30)
        assert taken
        await consumer.ack_many(taken)
    async with Tail(url, "logs.a", tokens["subscriber"], start="earliest", limit=5) as tail:
        seen = [m async for m in tail]
        assert len(seen) == 5
    async with Puller(url, "logs-pull", tokens["subscriber"], wait_ms=0) as puller:
        pulled = await puller.pull()
        assert pulled
    # The query-string way (kept for compatibility) still works, and is not logged either.
    ws_url = url.replace("http", "ws", 1) + f"/v1/topics/logs.a/ws?token={tokens['reader']}"
    async with websockets.connect(ws_url, open_timeout=60) as ws:
        assert orjson.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "ready"
    # A refused token is not logged either.
    bad = tokens["reader"][:-4] + "AAAA"
    async with websockets.connect(ws_url.replace(tokens["reader"], bad), open_timeout=60) as ws:
        await asyncio.wait_for(ws.wait_closed(), 30)
        assert ws.close_code == 4401


def test_no_token_reaches_the_server_log(
    herald_factory: Callable[..., HeraldProcess],
    tmp_path: Path,
    page: Any,
    browser: Any,
    app_origin: str,  # noqa: F811 (the fixture imported above: the page's origin)
) -> None:
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(
        auth_file,
        {
            "admin": (["admin"], []),
            "publisher": (["publish"], ["logs.*"]),
            "subscriber": (["subscribe"], ["logs.*"]),
            "reader": (["subscribe"], ["logs.*"]),
            "backend": (["subscribe"], ["logs.*"]),
        },
    )
    with auth_file.open("a") as f:
        f.write("\n" + new_signing_key_line())
    server = herald_factory(
        "--auth-file", str(auth_file), "--cors-origin", app_origin,
        "--access-log", "--log-level", "debug",
    )  # fmt: skip
    # Playwright's sync API runs a loop on this thread: the SDK clients get their own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _python_clients(server.url, tokens)).result(timeout=120)

    # The browser SDK with a minted browser token.
    minted = httpx.post(
        f"{server.url}/v1/tokens",
        json={"ttl_ms": 60_000, "subscribe": ["logs.a"]},
        headers={"Authorization": f"Bearer {tokens['backend']}"},
        timeout=10,
    )
    assert minted.status_code == 201, minted.text
    browser_token = str(minted.json()["token"])
    socket_urls: list[str] = []  # the token rides in Sec-WebSocket-Protocol, not the URL
    page.on("websocket", lambda ws: socket_urls.append(ws.url))
    open_page(page, server, "logs.a", f"() => {orjson.dumps(browser_token).decode()}")
    wait_for(page, "(window.seen || []).length >= 5", "the browser tail's records")

    # The console's stats socket with the operator's admin token.
    console = browser.new_page()
    console.on("websocket", lambda ws: socket_urls.append(ws.url))
    try:
        console.goto(f"{server.url}/console/#/subscriptions")
        console.wait_for_selector("#token-dialog[open]")
        console.fill("#token-input", tokens["admin"])
        console.click("#token-dialog button")
        expect(console.locator("#live-text")).to_have_text("live")
    finally:
        console.close()
    page.close()

    assert any("/v1/stats/ws" in u for u in socket_urls), socket_urls
    assert any("/v1/topics/logs.a/ws" in u for u in socket_urls), socket_urls
    assert not [u for u in socket_urls if "token" in u]

    server.terminate()
    log = server.log()
    assert "WebSocket" in log, "the handshakes were logged (else this test proves nothing)"
    assert _secrets_in(log, [*tokens.values(), browser_token]) == []
