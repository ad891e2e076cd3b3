"""Helpers for the WebSocket consumer tests (PROTOCOL §3) against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import websockets
from websockets.asyncio.client import ClientConnection

QUIET_S = 0.3  # how long "nothing more arrives" is watched for


def ws_url(http_url: str, path: str) -> str:
    return http_url.replace("http", "ws", 1) + path


async def recv_json(ws: ClientConnection, within: float = 10.0) -> dict[str, Any]:
    frame = await asyncio.wait_for(ws.recv(), within)
    assert isinstance(frame, str), "PROTOCOL §3: every frame is a text frame"
    data = orjson.loads(frame)
    assert isinstance(data, dict)
    return data


async def nothing_arrives(ws: ClientConnection, seconds: float = QUIET_S) -> bool:
    try:
        await asyncio.wait_for(ws.recv(), seconds)
    except TimeoutError:
        return True
    return False


async def close_code(ws: ClientConnection, within: float = 10.0) -> int | None:
    """Read until the server closes; the close code it sent."""
    try:
        async with asyncio.timeout(within):
            async for _ in ws:
                pass
    except websockets.ConnectionClosed:
        pass
    return ws.close_code


async def send_json(ws: ClientConnection, frame: Any) -> None:
    await ws.send(orjson.dumps(frame).decode())


async def publish(
    http: httpx.AsyncClient, topic: str, values: list[Any], **extra: Any
) -> list[dict[str, Any]]:
    messages = [{"value": value, **extra} for value in values]
    reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert reply.status_code == 200, reply.text
    results: list[dict[str, Any]] = reply.json()["results"]
    return results


async def make_subscription(http: httpx.AsyncClient, name: str, topic: str, **config: Any) -> None:
    body = {"topic": topic, "start": "earliest", **config}
    reply = await http.put(f"/v1/subscriptions/{name}", json=body)
    assert reply.status_code in (200, 201), reply.text


async def receive_records(
    ws: ClientConnection, count: int, within: float = 10.0
) -> list[dict[str, Any]]:
    """`count` delivered records, checking no frame exceeds what is still expected."""
    records: list[dict[str, Any]] = []
    async with asyncio.timeout(within):
        while len(records) < count:
            frame = await recv_json(ws)
            if frame["type"] != "deliver":
                continue
            assert 1 <= len(frame["messages"]) <= count - len(records)
            records.extend(frame["messages"])
    return records
