"""Seek, at-most-once, stats and metrics, seen from real consumers (PROTOCOL §2, §3, §5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.e2e import ack, stats
from tests.helpers import wait_until
from tests.subscribers import (
    make_subscription,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)


def consumer(server: HeraldProcess, name: str, credit: int) -> websockets.connect:
    return websockets.connect(ws_url(server.url, f"/v1/subscriptions/{name}/ws?credit={credit}"))


async def seek(http: httpx.AsyncClient, name: str, body: dict[str, Any]) -> None:
    reply = await http.post(f"/v1/subscriptions/{name}/seek", json=body)
    assert reply.status_code == 200, reply.text


async def publish_one_by_one(http: httpx.AsyncClient, topic: str, count: int) -> None:
    """`count` records with strictly increasing timestamps (one request each, 5 ms apart)."""
    for value in range(count):
        await publish(http, topic, [value])
        await asyncio.sleep(0.005)


async def test_seek_in_every_form_replays_with_attempt_1(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sk"), unique("sks")
    await make_subscription(http, name, topic, ack_deadline_ms=60_000)
    await publish_one_by_one(http, topic, 4)
    async with consumer(shared_herald, name, 1000) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 4)
        # Nack the last one so its next send would be attempt 2; the seek resets that.
        await send_json(ws, {"type": "nack", "ids": [records[3]["id"]], "delay_ms": 0})
        assert (await receive_records(ws, 1))[0]["attempt"] == 2
        await ack(ws, [r["id"] for r in records])

        await seek(http, name, {"to": "earliest"})
        replay = await receive_records(ws, 4)
        assert [(r["value"], r["attempt"]) for r in replay] == [(v, 1) for v in range(4)]
        await ack(ws, [r["id"] for r in replay])

        await seek(http, name, {"timestamp": records[2]["timestamp"]})
        replay = await receive_records(ws, 2)
        assert [(r["value"], r["attempt"]) for r in replay] == [(2, 1), (3, 1)]
        await ack(ws, [r["id"] for r in replay])

        await seek(http, name, {"offsets": {"0": 1}})
        replay = await receive_records(ws, 3)
        assert [(r["value"], r["attempt"]) for r in replay] == [(1, 1), (2, 1), (3, 1)]

        # Seek to latest while these three are in flight: they leave flight.
        await seek(http, name, {"to": "latest"})
        assert await nothing_arrives(ws)
        answer = await ack(ws, [r["id"] for r in replay], req="late")
        assert answer["ok"] == [] and answer["unknown"] == [r["id"] for r in replay]
        await publish(http, topic, ["new"])
        [fresh] = await receive_records(ws, 1)
        assert (fresh["value"], fresh["offset"], fresh["attempt"]) == ("new", 4, 1)
    current = await stats(http, name)
    assert (current["backlog"], current["in_flight"]) == (1, 0)


async def test_seek_leaves_partitions_not_named_untouched(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sp"), unique("sps")
    assert (await http.put(f"/v1/topics/{topic}", json={"partitions": 2})).status_code == 201
    await make_subscription(http, name, topic, ack_deadline_ms=60_000)
    reply = await http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": "p0", "partition": 0}, {"value": "p1", "partition": 1}]},
    )
    assert reply.status_code == 200
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        held = {r["value"]: r for r in await receive_records(ws, 2)}
        await seek(http, name, {"offsets": {"0": 1}})  # past p0's only record
        assert await nothing_arrives(ws), "partition 1's in-flight record stays in flight"
        answer = await ack(ws, [held["p0"]["id"], held["p1"]["id"]])
        assert answer["ok"] == [held["p1"]["id"]], "untouched by the seek"
        assert answer["unknown"] == [held["p0"]["id"]], "dropped from flight by the seek"
    current = await stats(http, name)
    assert current["partitions"] == [
        {"partition": 0, "ack_floor": 1},
        {"partition": 1, "ack_floor": 1},
    ]
    assert current["backlog"] == 0


async def test_at_most_once_sends_count_as_acked_and_are_never_redelivered(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("am"), unique("ams")
    await make_subscription(http, name, topic, delivery="at_most_once", ack_deadline_ms=100)
    await publish(http, topic, ["a", "b", "c"])
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 3)
        assert [r["attempt"] for r in records] == [1, 1, 1]
        assert await nothing_arrives(ws, 0.6), "no redelivery after the 100 ms deadline"
        answer = await ack(ws, [records[0]["id"]])
        assert answer["unknown"] == [records[0]["id"]], "already counted as acked"
    current = await stats(http, name)
    assert current["acked_total"] == 3 and current["delivered_total"] == 3
    assert (current["backlog"], current["in_flight"], current["redelivered_total"]) == (0, 0, 0)
    assert current["partitions"] == [{"partition": 0, "ack_floor": 3}]


def metric(text: str, family: str, name: str) -> float:
    prefix = f'{family}{{subscription="{name}"}} '
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line[len(prefix) :])


async def test_stats_and_metrics_count_the_same_history(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("st"), unique("sts"), unique("std")
    await make_subscription(
        http, name, topic, ack_deadline_ms=60_000, max_deliveries=2, dead_letter_topic=dead
    )
    await publish(http, topic, list(range(5)))
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 5)
        await ack(ws, [records[0]["id"], records[1]["id"]])
        # Record 2: nacked twice -> dead-lettered. Record 3: nacked once -> redelivered.
        await send_json(
            ws, {"type": "nack", "ids": [records[2]["id"], records[3]["id"]], "delay_ms": 0}
        )
        again = await receive_records(ws, 2)
        assert sorted(r["attempt"] for r in again) == [2, 2]
        await send_json(ws, {"type": "nack", "ids": [records[2]["id"]], "delay_ms": 0})

        async def dead_lettered() -> bool:
            # Counted once the dead-letter topic has it (an fsynced publish, not instant).
            return (await stats(http, name))["dead_lettered_total"] == 1

        await wait_until(dead_lettered, what="the dead letter")
        current = await stats(http, name)
        expected = {
            "backlog": 2,  # records 3 and 4, both in flight
            "in_flight": 2,
            "consumers": 1,
            "delivered_total": 7,
            "redelivered_total": 2,
            "acked_total": 2,
            "dead_lettered_total": 1,
            "expired_total": 0,
            "filtered_total": 0,
            "delayed": 0,
            "partitions": [{"partition": 0, "ack_floor": 3}],
        }
        assert current == expected
        text = (await http.get("/metrics")).text
        assert metric(text, "herald_delivered_records_total", name) == 7
        assert metric(text, "herald_redelivered_records_total", name) == 2
        assert metric(text, "herald_acked_records_total", name) == 2
        assert metric(text, "herald_dead_lettered_records_total", name) == 1
        assert metric(text, "herald_expired_records_total", name) == 0
        assert metric(text, "herald_backlog_records", name) == 2
        assert metric(text, "herald_in_flight_records", name) == 2
        assert metric(text, "herald_consumers", name) == 1
        assert f'herald_published_records_total{{topic="{topic}"}} 5' in text
        assert f'herald_published_records_total{{topic="{dead}"}} 1' in text

    # PROTOCOL §3: the consumer left, its two records are given back; record 3 has had its
    # max_deliveries (2) sends, so it is dead-lettered instead of waiting for a third.
    async def given_back() -> bool:
        return (await stats(http, name))["dead_lettered_total"] == 2

    await wait_until(given_back, what="record 3 dead-lettered")
    current = await stats(http, name)
    assert (current["consumers"], current["in_flight"], current["backlog"]) == (0, 0, 1)
