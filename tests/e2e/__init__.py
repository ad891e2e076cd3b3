"""End-to-end tests of PROTOCOL §3 and §5 against a real server over real sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection

from tests.subscribers import recv_json, send_json


async def ack(ws: ClientConnection, ids: list[str], req: Any = 1) -> dict[str, Any]:
    """Ack with a `req` and return the server's `acked` answer (deliveries in between skipped)."""
    await send_json(ws, {"type": "ack", "ids": ids, "req": req})
    while True:
        frame = await recv_json(ws)
        if frame["type"] == "acked" and frame["req"] == req:
            return frame


async def stats(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    reply = await http.get(f"/v1/subscriptions/{name}")
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()["stats"]
    return result


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 10.0, what: str = "condition"
) -> None:
    """Poll `check` until it is true; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"{what} not reached within {within} s"
        await asyncio.sleep(0.05)
