"""What a graceful restart keeps for consumers (PROTOCOL §3)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.e2e import ack
from tests.subscribers import (
    make_subscription,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)


async def test_attempt_counts_survive_a_graceful_restart(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ar"), unique("ars")
    url = ws_url(herald_server.url, f"/v1/subscriptions/{name}/ws?credit=10")
    async with httpx.AsyncClient(base_url=herald_server.url, timeout=30) as http:
        await make_subscription(http, name, topic, ack_deadline_ms=60_000, max_deliveries=10)
        await publish(http, topic, ["twice", "once"])
    async with websockets.connect(url) as ws:
        await recv_json(ws)
        first, second = await receive_records(ws, 2)
        await send_json(ws, {"type": "nack", "ids": [first["id"]], "delay_ms": 0})
        [again] = await receive_records(ws, 1)
        assert again["attempt"] == 2
        assert (await ack(ws, [second["id"]]))["ok"] == [second["id"]]
    assert await asyncio.to_thread(herald_server.terminate) == 0
    await asyncio.to_thread(herald_server.restart)
    async with websockets.connect(url) as ws:
        await recv_json(ws)
        [after] = await receive_records(ws, 1)
        assert (after["id"], after["attempt"]) == (first["id"], 3), "third send after restart"


async def test_sigterm_closes_tails_with_1001(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("tt")
    async with httpx.AsyncClient(base_url=herald_server.url, timeout=30) as http:
        assert (await http.put(f"/v1/topics/{topic}")).status_code == 201
    url = ws_url(herald_server.url, f"/v1/topics/{topic}/ws?from=earliest&credit=5")
    async with websockets.connect(url) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        assert await asyncio.to_thread(herald_server.terminate) == 0
        try:
            async with asyncio.timeout(10):
                async for _ in ws:
                    pass
        except websockets.ConnectionClosed:
            pass
        assert ws.close_code == 1001
