"""ordered_by_key and max_in_flight across seeks, disconnects and at-most-once (PROTOCOL §2, §3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.e2e import ack, stats
from tests.subscribers import (
    make_subscription,
    nothing_arrives,
    receive_records,
    recv_json,
    ws_url,
)


def consumer(server: HeraldProcess, name: str, credit: int) -> websockets.connect:
    return websockets.connect(ws_url(server.url, f"/v1/subscriptions/{name}/ws?credit={credit}"))


async def publish_keyed(http: httpx.AsyncClient, topic: str, pairs: list[tuple[str, Any]]) -> None:
    messages = [{"key": key, "value": value} for key, value in pairs]
    reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert reply.status_code == 200, reply.text


async def test_seek_frees_the_key_of_a_dropped_in_flight_record(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ks"), unique("kss")
    await make_subscription(http, name, topic, ordered_by_key=True, ack_deadline_ms=60_000)
    await publish_keyed(http, topic, [("a", "a0"), ("a", "a1")])
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        [a0] = await receive_records(ws, 1)
        assert await nothing_arrives(ws)
        reply = await http.post(f"/v1/subscriptions/{name}/seek", json={"to": "earliest"})
        assert reply.status_code == 200
        [replayed] = await receive_records(ws, 1)
        assert (replayed["value"], replayed["attempt"]) == ("a0", 1)
        assert await nothing_arrives(ws), "still one in flight per key"
        await ack(ws, [replayed["id"]])
        [a1] = await receive_records(ws, 1)
        assert a1["value"] == "a1"
        # Seek to latest with a1 in flight, then a new record of the same key comes.
        reply = await http.post(f"/v1/subscriptions/{name}/seek", json={"to": "latest"})
        assert reply.status_code == 200
        await publish_keyed(http, topic, [("a", "a2")])
        [a2] = await receive_records(ws, 1)
        assert (a2["value"], a2["attempt"]) == ("a2", 1)
        assert a0["id"] == replayed["id"]


async def test_seek_frees_max_in_flight_slots(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ms"), unique("mss")
    await make_subscription(http, name, topic, max_in_flight=2, ack_deadline_ms=60_000)
    await publish_keyed(http, topic, [("k", i) for i in range(4)])
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        first = await receive_records(ws, 2)
        assert [r["value"] for r in first] == [0, 1]
        assert await nothing_arrives(ws)
        reply = await http.post(f"/v1/subscriptions/{name}/seek", json={"offsets": {"0": 2}})
        assert reply.status_code == 200
        rest = await receive_records(ws, 2)
        assert [r["value"] for r in rest] == [2, 3]
    assert (await stats(http, name))["backlog"] == 2


async def test_disconnect_gives_keyed_records_back_in_key_order(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("kd"), unique("kds")
    await make_subscription(http, name, topic, ordered_by_key=True, ack_deadline_ms=60_000)
    await publish_keyed(http, topic, [("a", "a0"), ("b", "b0"), ("a", "a1"), ("b", "b1")])
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        held = await receive_records(ws, 2)
        assert sorted(r["value"] for r in held) == ["a0", "b0"]
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        again = await receive_records(ws, 2)
        assert sorted((r["value"], r["attempt"]) for r in again) == [("a0", 2), ("b0", 2)]
        assert await nothing_arrives(ws)
        await ack(ws, [r["id"] for r in again])
        later = await receive_records(ws, 2)
        assert sorted((r["value"], r["attempt"]) for r in later) == [("a1", 1), ("b1", 1)]


async def test_at_most_once_never_holds_a_key_back(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ka"), unique("kas")
    await make_subscription(http, name, topic, ordered_by_key=True, delivery="at_most_once")
    await publish_keyed(http, topic, [("a", i) for i in range(5)])
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 5)
        assert [r["value"] for r in records] == list(range(5))
    current = await stats(http, name)
    assert (current["acked_total"], current["in_flight"], current["backlog"]) == (5, 0, 0)
