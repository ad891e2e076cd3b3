"""PROTOCOL §8 Filter against a real server: WebSocket, pull, PUT/PATCH, stats, metrics."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.e2e import ack, stats
from tests.e2e.test_pull import pull
from tests.e2e.test_redelivery import consumer
from tests.helpers import wait_until
from tests.subscribers import make_subscription, nothing_arrives, receive_records, recv_json


async def publish_keyed(
    http: httpx.AsyncClient, topic: str, items: list[tuple[str | None, dict[str, str]]]
) -> None:
    messages = [
        {"value": n, "key": key, "headers": headers} for n, (key, headers) in enumerate(items)
    ]
    reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert reply.status_code == 200, reply.text


ITEMS: list[tuple[str | None, dict[str, str]]] = [
    ("eu-1", {"type": "order"}),
    ("us-1", {"type": "order"}),
    (None, {"type": "order"}),
    ("eu-2", {}),
    ("eu-3", {"type": "refund"}),
]
FILTER = 'hasPrefix(key, "eu-") AND NOT headers.type = "refund"'


async def test_websocket_consumer_gets_only_matching_records(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ft"), unique("fts")
    await make_subscription(http, name, topic, filter=FILTER)
    assert (await http.get(f"/v1/subscriptions/{name}")).json()["config"]["filter"] == FILTER
    await publish_keyed(http, topic, ITEMS)
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 2)
        assert [r["value"] for r in records] == [0, 3]
        assert await nothing_arrives(ws, 0.3)
        await ack(ws, [r["id"] for r in records])
    current = await stats(http, name)
    assert (current["filtered_total"], current["delivered_total"], current["backlog"]) == (3, 2, 0)
    text = (await http.get("/metrics")).text
    assert f'herald_filtered_records_total{{subscription="{name}"}} 3' in text


async def test_a_filter_skips_records_with_no_consumer_attached(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    """PROTOCOL §8 (settled 2026-11-26): skipped records are acked whether or not a
    consumer is attached, so `backlog` counts only the records that match."""
    topic, name, none = unique("fn"), unique("fns"), unique("fnz")
    await make_subscription(http, name, topic, filter=FILTER)
    await make_subscription(http, none, topic, filter='key = "nobody"')
    await publish_keyed(http, topic, ITEMS)

    async def skipped() -> bool:
        return (await stats(http, name))["filtered_total"] == 3 and (await stats(http, none))[
            "filtered_total"
        ] == 5

    await wait_until(skipped, within=20, what="the filters applied without a consumer")
    matching, nothing = await stats(http, name), await stats(http, none)
    assert (matching["backlog"], matching["delivered_total"]) == (2, 0)
    assert (nothing["backlog"], nothing["delivered_total"]) == (0, 0)
    async with consumer(shared_herald, name, 10) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 2)
        assert [r["value"] for r in records] == [0, 3]
        await ack(ws, [r["id"] for r in records])
    current = await stats(http, name)
    assert (current["filtered_total"], current["delivered_total"], current["backlog"]) == (3, 2, 0)


async def test_pull_and_patch_use_the_filter(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("fp"), unique("fps")
    await make_subscription(http, name, topic, filter="headers:type")
    await publish_keyed(http, topic, ITEMS[:4])
    assert [m["value"] for m in await pull(http, name)] == [0, 1, 2]
    reply = await http.patch(f"/v1/subscriptions/{name}", json={"filter": 'key = "eu-9"'})
    assert reply.status_code == 200 and reply.json()["config"]["filter"] == 'key = "eu-9"'
    await publish_keyed(http, topic, [("eu-9", {}), ("eu-8", {})])
    assert [m["value"] for m in await pull(http, name, wait_ms=5000)] == [0]
    reply = await http.patch(f"/v1/subscriptions/{name}", json={"filter": None})
    assert reply.json()["config"]["filter"] is None


@pytest.mark.parametrize(
    ("filter_", "code", "position"),
    [
        ("", "bad_request", 0),
        ('key = "a" and headers:b', "bad_request", 10),
        ("headers:", "bad_request", 8),
        (5, "bad_request", None),
        ('key = "' + "x" * 1100 + '"', "validation_error", None),
    ],
)
async def test_bad_filters_are_400_with_the_position(
    shared_herald: HeraldProcess,
    http: httpx.AsyncClient,
    unique: Callable[[str], str],
    filter_: object,
    code: str,
    position: int | None,
) -> None:
    name = unique("fb")
    reply = await http.put(
        f"/v1/subscriptions/{name}", json={"topic": unique("t"), "filter": filter_}
    )
    assert (reply.status_code, reply.json()["code"]) == (400, code), reply.text
    if position is not None:
        assert f"position {position}" in reply.json()["detail"]
    assert reply.json().get("position") == position  # a problem member (docs/protocol.md)
    assert (await http.get(f"/v1/subscriptions/{name}")).status_code == 404
    await make_subscription(http, name, unique("t"))
    reply = await http.patch(f"/v1/subscriptions/{name}", json={"filter": filter_})
    assert (reply.status_code, reply.json()["code"]) == (400, code), reply.text
