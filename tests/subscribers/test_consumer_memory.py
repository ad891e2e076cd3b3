"""What an idle WebSocket consumer costs the server (issue 27 §3), and that the leaner
connection still speaks PROTOCOL §3 with and without permessage-deflate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.subscribers import make_subscription, publish, receive_records, recv_json, ws_url

CONSUMERS = 300


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_compressed_consumer_gets_acks_and_records_over_many_frames(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    """permessage-deflate with context takeover both ways: each side's zlib stream is made
    at its first message and kept, so every later frame must still decode."""
    topic, name = unique("cmt"), unique("cms")
    assert (await http.put(f"/v1/topics/{topic}", json={})).status_code == 201
    await make_subscription(http, name, topic)
    url = ws_url(shared_herald.url, f"/v1/subscriptions/{name}/ws?credit=1")
    async with websockets.connect(url, compression="deflate") as ws:
        assert ws.protocol.extensions, "the server did not negotiate permessage-deflate"
        assert (await recv_json(ws))["type"] == "ready"
        await publish(http, topic, [f"record {i} " * 20 for i in range(5)])
        seen = []
        for i in range(5):  # one record a frame: credit 1, then 1 more per ack
            [record] = await receive_records(ws, 1)
            seen.append(record["value"])
            await ws.send(f'{{"type":"ack","ids":["{record["id"]}"],"req":"r{i}"}}')
            acked = await recv_json(ws)
            while acked["type"] != "acked":
                acked = await recv_json(ws)
            assert acked["ok"] == [record["id"]]
            await ws.send('{"type":"credit","n":1}')
    assert seen == [f"record {i} " * 20 for i in range(5)]


async def _idle_consumers_kib(server: HeraldProcess, compression: str | None) -> float:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.put("/v1/topics/idle", json={})).status_code == 201
        await make_subscription(http, "idle", "idle")
    url = ws_url(server.url, "/v1/subscriptions/idle/ws?credit=10")
    gate = asyncio.Semaphore(16)

    async def one(stack: contextlib.AsyncExitStack) -> None:
        async with gate:
            ws = await stack.enter_async_context(
                websockets.connect(url, compression=compression, open_timeout=60)
            )
            assert (await recv_json(ws, within=60))["type"] == "ready"

    async with contextlib.AsyncExitStack() as warm:  # what a first connection allocates once
        await asyncio.gather(*(one(warm) for _ in range(50)))
    await asyncio.sleep(1)
    before = resident_kib(server.pid)
    async with contextlib.AsyncExitStack() as stack:
        await asyncio.gather(*(one(stack) for _ in range(CONSUMERS)))
        await asyncio.sleep(1)
        after = resident_kib(server.pid)
    return (after - before) / CONSUMERS


async def test_an_idle_consumer_with_compression_holds_no_zlib_stream(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    """A deflate compressor of uvicorn's settings (window bits 12, memLevel 5) holds about
    38 KiB: made at the handshake, it took an idle consumer past 80 KiB. Made at the first
    message, an idle one costs what one without compression does (~25 KiB measured by
    bench/consumer_memory.py); 55 KiB leaves room for the allocator's noise."""
    server = herald_factory(env={"HERALD_MAX_REQUESTS_PER_CLIENT": "0"})  # all from 127.0.0.1
    per_consumer = await _idle_consumers_kib(server, "deflate")
    assert per_consumer < 55, f"{per_consumer:.1f} KiB per idle consumer with compression"
