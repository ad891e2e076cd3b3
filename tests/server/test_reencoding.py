"""Everywhere the server writes back what a client sent, it writes it exactly or
refuses it as a bad request: never a 500, never a dropped connection, never a changed
value (issue 20 §2). The published `value` is tests/server/test_value_encoding.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
import websockets

from tests.conftest import HeraldProcess


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "req",
    [
        nested(254),
        nested(255),
        nested(600),
        "18446744073709551616",
        '{"a":[' + "9" * 300 + "]}",
        "-" + "1" * 40,
    ],
)
async def test_an_ack_req_is_echoed_exactly_at_any_depth_and_size(
    shared_herald: HeraldProcess, unique: Callable[[str], str], req: str
) -> None:
    """PROTOCOL §3: `req` is any JSON value, echoed as sent (orjson alone could neither
    write it past 254 levels nor hold integers beyond 64 bits)."""
    name = unique("req")
    async with httpx.AsyncClient(base_url=shared_herald.url) as http:
        created = await http.put(f"/v1/subscriptions/{name}", json={"topic": unique("t")})
        assert created.status_code == 201
    url = shared_herald.url.replace("http://", "ws://") + f"/v1/subscriptions/{name}/ws"
    async with websockets.connect(url, max_size=None) as ws:
        await asyncio.wait_for(ws.recv(), 10)  # ready
        await ws.send('{"type":"ack","ids":["0-5"],"req":' + req + "}")
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert answer["type"] == "acked"
        assert answer["req"] == json.loads(req)
        assert answer["unknown"] == ["0-5"]


@pytest.mark.parametrize("depth", [1000, 1030])
async def test_an_ack_req_too_deep_to_read_is_a_bad_frame_and_the_socket_stays_open(
    shared_herald: HeraldProcess, unique: Callable[[str], str], depth: int
) -> None:
    name = unique("deepreq")
    async with httpx.AsyncClient(base_url=shared_herald.url) as http:
        created = await http.put(f"/v1/subscriptions/{name}", json={"topic": unique("t")})
        assert created.status_code == 201
    url = shared_herald.url.replace("http://", "ws://") + f"/v1/subscriptions/{name}/ws"
    async with websockets.connect(url, max_size=None) as ws:
        await asyncio.wait_for(ws.recv(), 10)
        await ws.send('{"type":"ack","ids":[],"req":' + nested(depth) + "}")
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (error["type"], error["code"]) == ("error", "bad_frame")
        await ws.send('{"type":"ack","ids":[],"req":1}')
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert answer == {"type": "acked", "ok": [], "unknown": [], "req": 1}
