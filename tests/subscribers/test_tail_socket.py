"""Ephemeral tails, PROTOCOL §3 `GET /v1/topics/{topic}/ws`, against a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
import websockets

from tests.conftest import HeraldProcess
from tests.subscribers import (
    close_code,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)


@pytest.fixture
async def topic(http: httpx.AsyncClient, unique: Callable[[str], str]) -> str:
    """Two partitions, records 0..4 in partition 0 and 10..12 in partition 1."""
    name = unique("tail")
    assert (await http.put(f"/v1/topics/{name}", json={"partitions": 2})).status_code == 201
    await publish(http, name, [0, 1, 2, 3, 4], partition=0)
    await publish(http, name, [10, 11, 12], partition=1)
    return name


def tail_url(server: HeraldProcess, topic: str, query: str = "") -> str:
    return ws_url(server.url, f"/v1/topics/{topic}/ws{query}")


async def test_tail_from_earliest_sends_every_record_once(
    shared_herald: HeraldProcess, topic: str
) -> None:
    async with websockets.connect(
        tail_url(shared_herald, topic, "?from=earliest&credit=100")
    ) as ws:
        ready = await recv_json(ws)
        assert ready["type"] == "ready" and ready["subscription"] is None
        assert ready["credit"] == 100
        records = await receive_records(ws, 8)
        assert sorted(r["value"] for r in records) == [0, 1, 2, 3, 4, 10, 11, 12]
        for record in records:
            assert record["attempt"] == 1 and "subscription" not in record
            assert record["topic"] == topic
        for partition in (0, 1):
            offsets = [r["offset"] for r in records if r["partition"] == partition]
            assert offsets == sorted(offsets)
        assert await nothing_arrives(ws)


async def test_tail_from_latest_sends_only_new_records(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, topic: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, "?credit=10")) as ws:
        await recv_json(ws)
        assert await nothing_arrives(ws)
        await publish(http, topic, ["new"], partition=1)
        [record] = await receive_records(ws, 1)
        assert (record["value"], record["partition"], record["offset"]) == ("new", 1, 3)


async def test_tail_from_offset_applies_to_every_partition(
    shared_herald: HeraldProcess, topic: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, "?from=2&credit=10")) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 4)
        assert sorted(r["value"] for r in records) == [2, 3, 4, 12]
        assert await nothing_arrives(ws)


async def test_tail_from_offset_past_the_end_starts_at_the_end(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, topic: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, "?from=1000&credit=10")) as ws:
        await recv_json(ws)
        await publish(http, topic, ["p0"], partition=0)
        [record] = await receive_records(ws, 1)
        assert (record["value"], record["offset"]) == ("p0", 5)


async def test_tail_from_timestamp(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, topic: str
) -> None:
    await asyncio.sleep(0.01)
    since = int(time.time() * 1000)
    await asyncio.sleep(0.01)
    await publish(http, topic, ["late"], partition=0)
    async with websockets.connect(
        tail_url(shared_herald, topic, f"?from=ts:{since}&credit=10")
    ) as ws:
        await recv_json(ws)
        [record] = await receive_records(ws, 1)
        assert record["value"] == "late"
        assert await nothing_arrives(ws)


async def test_tail_spends_credit_and_ignores_acks(
    shared_herald: HeraldProcess, topic: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, "?from=earliest&credit=3")) as ws:
        assert (await recv_json(ws))["credit"] == 3
        records = await receive_records(ws, 3)
        assert await nothing_arrives(ws)
        # Acks are ignored and never answered, even with req; they give no credit.
        await send_json(ws, {"type": "ack", "ids": [r["id"] for r in records], "req": 1})
        assert await nothing_arrives(ws)
        await send_json(ws, {"type": "credit", "n": 5})
        rest = await receive_records(ws, 5)
        assert sorted(r["value"] for r in records + rest) == [0, 1, 2, 3, 4, 10, 11, 12]


async def test_tail_bad_frames_are_answered(shared_herald: HeraldProcess, topic: str) -> None:
    async with websockets.connect(tail_url(shared_herald, topic)) as ws:
        await recv_json(ws)
        await ws.send('{"type":"credit","n":0}')
        assert (await recv_json(ws))["code"] == "bad_frame"
        await ws.send('{"type":"bogus"}')
        assert (await recv_json(ws))["code"] == "unknown_type"


@pytest.mark.parametrize(
    ("query", "positions"),
    [
        ("?from=earliest&positions=true", {"0": 0, "1": 0}),
        ("?from=2&positions=true", {"0": 2, "1": 2}),
        ("?from=1000&positions=true", {"0": 5, "1": 3}),  # past the end: the end
        ("?positions=true", {"0": 5, "1": 3}),  # latest
        ("?from=earliest&positions=false", None),
        ("?from=earliest", None),
    ],
)
async def test_a_tail_asked_for_positions_says_where_it_starts(
    shared_herald: HeraldProcess, topic: str, query: str, positions: dict[str, int] | None
) -> None:
    """docs/protocol.md §3 "Where a tail starts": an extension a client asks for."""
    async with websockets.connect(tail_url(shared_herald, topic, query)) as ws:
        ready = await recv_json(ws)
        assert ready["type"] == "ready"
        assert ready.get("positions") == positions
        if positions is None:
            assert "positions" not in ready


async def test_a_tail_s_positions_start_past_what_retention_removed(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    """A tail asked to start below the log's start starts at the start, and says so:
    what a resuming client needs to tell its application which records it missed."""
    server = herald_factory("--segment-bytes", "65536", "--retention-interval", "0.2")
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        made = await http.put("/v1/topics/aging", json={"partitions": 1, "retention_ms": 1000})
        assert made.status_code == 201, made.text
        for n in range(30):  # ~240 kB: several 64 KiB segments
            await publish(http, "aging", [{"n": n, "pad": "x" * 8000}], partition=0)

        async def start_offset() -> int:
            body = (await http.get("/v1/topics/aging")).json()
            return int(body["partitions"][0]["start_offset"])

        deadline = time.monotonic() + 60
        while (before := await start_offset()) == 0:
            assert time.monotonic() < deadline, "retention never deleted a segment"
            await asyncio.sleep(0.2)
        async with websockets.connect(
            tail_url(server, "aging", "?from=0&positions=true&credit=100")
        ) as ws:
            ready = await recv_json(ws)
            after = await start_offset()  # retention goes on meanwhile
            assert before <= ready["positions"]["0"] <= after


@pytest.mark.parametrize(
    "query",
    ["?from=nope", "?from=-1", "?from=ts:", "?from=ts:x", "?credit=x", "?positions=yes"],
)
async def test_bad_tail_query_closes_4400(
    shared_herald: HeraldProcess, topic: str, query: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, query)) as ws:
        assert await close_code(ws) == 4400


async def test_tail_of_a_missing_topic_closes_4404_and_creates_nothing(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    name = unique("ghost")
    async with websockets.connect(tail_url(shared_herald, name, "?credit=1")) as ws:
        assert await close_code(ws) == 4404
    assert (await http.get(f"/v1/topics/{name}")).status_code == 404


async def test_tail_closes_4410_when_its_topic_is_deleted(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, topic: str
) -> None:
    async with websockets.connect(tail_url(shared_herald, topic, "?credit=1")) as ws:
        await recv_json(ws)
        assert (await http.delete(f"/v1/topics/{topic}")).status_code == 204
        assert await close_code(ws) == 4410
