"""Rate limits per token, concurrent connections per client, and slow clients (PROTOCOL §6)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import websockets

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess

LIMITS = {"HERALD_MAX_REQUESTS_PER_CLIENT": "3", "HERALD_HEADER_TIMEOUT_S": "1",
          "HERALD_BODY_TIMEOUT_S": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[HeraldProcess, dict[str, str]]]:
    base = tmp_path_factory.mktemp("limited")
    tokens: dict[str, str] = {}
    entries = []
    for who, extra in (
        ("admin", ""),
        ("by_count", "messages_per_second = 2\n"),
        ("by_bytes", "bytes_per_second = 1000\n"),
    ):
        token_id, token = new_token()
        tokens[who] = token
        roles = ["admin"] if who == "admin" else ["publish"]
        topics = [] if who == "admin" else ["*"]
        entries.append(toml_entry(token_id, token, roles, topics) + extra)
    (base / "auth.toml").write_text("\n".join(entries))
    server = HeraldProcess(
        base / "data", extra_args=["--auth-file", str(base / "auth.toml")], env=LIMITS
    ).start()
    try:
        yield server, tokens
    finally:
        server.terminate()


def publish(server: HeraldProcess, token: str, values: list[object]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/topics/rl/messages",
        json={"messages": [{"value": v} for v in values]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_messages_per_second_is_a_token_bucket_answering_429_with_retry_after(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, tokens = limited
    assert publish(server, tokens["by_count"], [1, 2]).status_code == 200
    refused = publish(server, tokens["by_count"], [3])
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    time.sleep(1.1)  # the bucket refills at 2 messages a second
    assert publish(server, tokens["by_count"], [3]).status_code == 200
    # Unlimited tokens are not slowed by another token's bucket.
    assert publish(server, tokens["admin"], list(range(50))).status_code == 200


def test_bytes_per_second_limit(limited: tuple[HeraldProcess, dict[str, str]]) -> None:
    server, tokens = limited
    assert publish(server, tokens["by_bytes"], ["x" * 700]).status_code == 200
    refused = publish(server, tokens["by_bytes"], ["x" * 700])
    assert refused.status_code == 429 and "Retry-After" in refused.headers


async def test_concurrent_connections_per_client_address_are_capped(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, tokens = limited
    url = server.url.replace("http://", "ws://") + f"/v1/topics/rl/ws?token={tokens['admin']}"
    async with websockets.connect(url) as first, websockets.connect(url) as second:
        async with websockets.connect(url) as third:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                async with websockets.connect(url) as fourth:
                    await asyncio.wait_for(fourth.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            async with httpx.AsyncClient() as client:
                busy = await client.get(f"{server.url}/healthz")
            assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
            await third.close()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{server.url}/healthz")).status_code == 200
        assert first.state is websockets.State.OPEN and second.state is websockets.State.OPEN


def test_a_client_trickling_headers_is_disconnected(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, _ = limited
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 8:
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            sock.settimeout(0.3)
            try:
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed
        assert time.monotonic() - started < 5


def test_a_stalled_body_gets_408_and_frees_the_request(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, tokens = limited
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = (
            "POST /v1/topics/rl/messages HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {tokens['admin']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"messages": [')
        started = time.monotonic()
        answer = b""
        while b"request_timeout" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"request_timeout" in answer
        assert time.monotonic() - started < 5


async def test_a_websocket_frame_over_the_cap_closes_1009(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, tokens = limited
    url = server.url.replace("http://", "ws://") + f"/v1/topics/rl/ws?token={tokens['admin']}"
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send("x" * (2 * 1024 * 1024))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
