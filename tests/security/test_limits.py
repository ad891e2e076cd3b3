"""Rate limits per token, concurrent connections per client, and slow clients (PROTOCOL §6)."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from server.auth import new_token, toml_entry
from tests.conftest import PROJECT_ROOT, HeraldProcess

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


# The buckets' arithmetic in time (refill, debt, Retry-After honest) is tested on an
# injected clock in tests/server/test_publish_limiter.py. Here, the wire: a refusal is
# provoked by a batch that leaves its token tens of seconds in debt, so that the next
# publish is refused however slowly a loaded machine gets it there (a full bucket's
# [1, 2] then [3] was admitted once when [3] came more than half a second later).


def test_messages_per_second_is_a_token_bucket_answering_429_with_retry_after(
    limited: tuple[HeraldProcess, dict[str, str]],
) -> None:
    server, tokens = limited
    # 2 messages a second: a full bucket admits a larger batch, then owes it (19.5 s).
    assert publish(server, tokens["by_count"], list(range(40))).status_code == 200
    refused = publish(server, tokens["by_count"], [40])
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 20
    # Unlimited tokens are not slowed by another token's bucket.
    assert publish(server, tokens["admin"], list(range(50))).status_code == 200


def test_bytes_per_second_limit(limited: tuple[HeraldProcess, dict[str, str]]) -> None:
    server, tokens = limited
    # 1000 bytes a second: 40 kB leave the token about 40 s in debt.
    assert publish(server, tokens["by_bytes"], ["x" * 40_000]).status_code == 200
    refused = publish(server, tokens["by_bytes"], ["x"])
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1


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


def test_a_keep_alive_request_gets_its_own_header_deadline(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    # The deadline (3 s here: seconds of slack either side on a loaded host) restarts
    # after each response: a request answered late in the connection's first 3 s is not
    # cut by that deadline, and a client then trickling its next request's headers is
    # still disconnected, about 3 s after the answer (not 1.2, as the first would).
    server = herald_factory(env={"HERALD_HEADER_TIMEOUT_S": "3"})
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        time.sleep(1.8)  # the connection's own deadline is 1.2 s away
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, answer
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(next(
            line.split(b":", 1)[1] for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ))  # fmt: skip
        while len(body) < length:
            chunk = sock.recv(4096)
            assert chunk
            body += chunk
        answered = time.monotonic()  # at or after the server sent the answer
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        closed_after = None
        while time.monotonic() - answered < 15:
            try:
                sock.sendall(b"X")
            except OSError:
                closed_after = time.monotonic() - answered
                break
            sock.settimeout(0.1)
            try:
                if sock.recv(1024) == b"":
                    closed_after = time.monotonic() - answered
                    break
            except TimeoutError:
                pass
        assert closed_after is not None
        assert 2.0 < closed_after < 12, closed_after


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


# ------------------------------------------------------------------ the cap as a flag


async def open_tail(server: HeraldProcess, forwarded_for: str | None = None) -> Any:
    """A topic tail (a WebSocket held open), sent through a 'proxy' naming the client."""
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    url = server.url.replace("http://", "ws://") + "/v1/topics/capped/ws"
    ws = await websockets.connect(url, additional_headers=headers)
    return ws


async def is_refused_1013(ws: Any) -> bool:
    """True when the server closed it 1013 (over the cap); False when it said ready."""
    try:
        async with asyncio.timeout(10):
            frame = json.loads(await ws.recv())
    except websockets.ConnectionClosed as closed:
        assert closed.rcvd is not None
        assert closed.rcvd.code == 1013, closed.rcvd
        return True
    assert frame["type"] == "ready", frame
    return False


def with_topic(server: HeraldProcess) -> HeraldProcess:
    assert httpx.put(f"{server.url}/v1/topics/capped", timeout=10).status_code == 201
    return server


async def test_the_per_client_cap_is_a_serve_flag(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    server = with_topic(herald_factory("--max-requests-per-client", "2"))
    first, second = await open_tail(server), await open_tail(server)
    try:
        assert not await is_refused_1013(first) and not await is_refused_1013(second)
        third = await open_tail(server)
        assert await is_refused_1013(third)
        async with httpx.AsyncClient() as client:
            busy = await client.get(f"{server.url}/healthz")
        assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
        assert busy.json()["code"] == "rate_limited"
    finally:
        await first.close()
        await second.close()


async def test_a_cap_of_0_turns_it_off(herald_factory: Callable[..., HeraldProcess]) -> None:
    server = with_topic(herald_factory(env={"HERALD_MAX_REQUESTS_PER_CLIENT": "0"}))
    sockets = [await open_tail(server) for _ in range(6)]
    try:
        for ws in sockets:
            assert not await is_refused_1013(ws)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{server.url}/healthz")).status_code == 200
    finally:
        for ws in sockets:
            await ws.close()


async def test_x_forwarded_for_counts_only_from_a_trusted_proxy(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    cap = ("--max-requests-per-client", "1")
    trusted = with_topic(herald_factory(*cap, "--forwarded-allow-ips", "127.0.0.1"))
    # Trusted: two clients behind the proxy are two addresses, each with its own cap.
    a, b = await open_tail(trusted, "198.51.100.1"), await open_tail(trusted, "198.51.100.2")
    try:
        assert not await is_refused_1013(a) and not await is_refused_1013(b)
        assert await is_refused_1013(await open_tail(trusted, "198.51.100.1"))
    finally:
        await a.close()
        await b.close()
    for flags in ((), ("--forwarded-allow-ips", "192.0.2.0/24")):
        # Not trusted (no proxy named, or another one): the header is ignored and every
        # connection counts against the peer's own address.
        server = with_topic(herald_factory(*cap, *flags))
        a = await open_tail(server, "198.51.100.1")
        try:
            assert not await is_refused_1013(a)
            assert await is_refused_1013(await open_tail(server, "198.51.100.2"))
        finally:
            await a.close()


def test_a_bad_forwarded_allow_ips_is_refused_at_startup(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "0", "--data-dir",
         str(tmp_path / "d"), "--forwarded-allow-ips", "not-an-address"],
        capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "forwarded_allow_ips" in done.stderr
    assert not (tmp_path / "d").exists()


def test_a_trickled_body_gets_408_at_its_total_deadline(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    """A byte every 0.5 s never stalls for the 2 s body timeout; the whole body must
    still arrive within HERALD_BODY_DEADLINE_S (PROTOCOL §6, issue 26 item 7)."""
    server = herald_factory(env={"HERALD_BODY_TIMEOUT_S": "2", "HERALD_BODY_DEADLINE_S": "3"})
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = (
            "POST /v1/topics/trickle/messages HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode())
        answer = b""
        for _ in range(120):  # 60 s of trickling at most: far past the deadline
            try:
                sock.sendall(b" ")
            except OSError:
                break  # the server answered and closed
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
                if b"request_timeout" in answer:
                    break
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"within 3 s" in answer
