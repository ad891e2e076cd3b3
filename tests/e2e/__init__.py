"""End-to-end tests of PROTOCOL §3 and §5 against a real server over real sockets."""

from __future__ import annotations

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
