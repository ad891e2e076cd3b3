"""Durable WebSocket consumers, PROTOCOL §3, against a real server over real sockets."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets

from tests.conftest import HeraldProcess
from tests.subscribers import (
    close_code,
    make_subscription,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)


@pytest.fixture
async def sub(http: httpx.AsyncClient, unique: Callable[[str], str]) -> tuple[str, str]:
    """(topic, subscription) starting at the earliest record."""
    topic, name = unique("wst"), unique("wss")
    assert (await http.put(f"/v1/topics/{topic}", json={})).status_code == 201
    await make_subscription(http, name, topic)
    return topic, name


def consumer_url(server: HeraldProcess, name: str, query: str = "") -> str:
    return ws_url(server.url, f"/v1/subscriptions/{name}/ws{query}")


async def test_ready_frame_comes_first(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, [1, 2])
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=5")) as ws:
        ready = await recv_json(ws)
        assert ready["type"] == "ready"
        assert ready["subscription"] == name
        assert isinstance(ready["consumer"], str) and ready["consumer"]
        assert ready["credit"] == 5
        records = await receive_records(ws, 2)
        assert [r["value"] for r in records] == [1, 2]
        first = records[0]
        assert first["topic"] == topic and first["subscription"] == name
        assert first["id"] == "0-0" and first["attempt"] == 1
        assert first["headers"] == {} and first["key"] is None and "value_b64" not in first


@pytest.mark.parametrize("credit", ["5000000", "9" * 5000, "0" * 5000 + "7"])
async def test_credit_param_above_the_cap_is_capped(
    shared_herald: HeraldProcess, sub: tuple[str, str], credit: str
) -> None:
    expected = 7 if credit.endswith("07") else 1_000_000
    async with websockets.connect(consumer_url(shared_herald, sub[1], f"?credit={credit}")) as ws:
        assert (await recv_json(ws))["credit"] == expected


async def test_no_credit_param_means_no_records(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    await publish(http, sub[0], [1])
    async with websockets.connect(consumer_url(shared_herald, sub[1])) as ws:
        assert (await recv_json(ws))["credit"] == 0
        assert await nothing_arrives(ws)


@pytest.mark.parametrize("query", ["?credit=abc", "?credit=-1", "?credit=1.5", "?credit="])
async def test_bad_credit_param_closes_4400(
    shared_herald: HeraldProcess, sub: tuple[str, str], query: str
) -> None:
    async with websockets.connect(consumer_url(shared_herald, sub[1], query)) as ws:
        assert await close_code(ws) == 4400


async def test_unknown_subscription_closes_4404(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    async with websockets.connect(consumer_url(shared_herald, unique("nosuch"), "?credit=1")) as ws:
        assert await close_code(ws) == 4404


async def test_push_subscription_closes_4409(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    name = unique("push")
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    push = {"url": "http://127.0.0.1:9/hook", "secret": secret}
    reply = await http.put(f"/v1/subscriptions/{name}", json={"topic": unique("pt"), "push": push})
    assert reply.status_code == 201, reply.text
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=1")) as ws:
        assert await close_code(ws) == 4409


async def test_deliver_frames_never_exceed_credit(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, list(range(50)))
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=7")) as ws:
        await recv_json(ws)
        first = await receive_records(ws, 7)
        assert await nothing_arrives(ws), "no record beyond the credit granted"
        # PROTOCOL §3: acks do not give credit back.
        await send_json(ws, {"type": "ack", "ids": [r["id"] for r in first]})
        assert await nothing_arrives(ws)
        await send_json(ws, {"type": "credit", "n": 3})
        await send_json(ws, {"type": "credit", "n": 10})
        more = await receive_records(ws, 13)
        assert await nothing_arrives(ws)
        offsets = [r["offset"] for r in first + more]
        assert offsets == list(range(20)), "first deliveries leave in offset order"


async def test_ack_with_req_is_answered_with_ok_and_unknown(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["a", "b"])
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=2")) as ws:
        await recv_json(ws)
        ids = [r["id"] for r in await receive_records(ws, 2)]
        req = {"n": [1, "two", None], "big": 123456789012345678901234567890}
        raw_req = '{"n":[1,"two",null],"big":123456789012345678901234567890}'
        await ws.send(f'{{"type":"ack","ids":["{ids[0]}","0-999","junk"],"req":{raw_req}}}')
        raw = await asyncio.wait_for(ws.recv(), 10)
        assert isinstance(raw, str)
        acked = json.loads(raw)  # the standard library keeps integers beyond 64 bits
        assert acked["type"] == "acked"
        assert acked["req"] == req, "req is echoed as sent"
        assert acked["ok"] == [ids[0]]
        assert sorted(acked["unknown"]) == ["0-999", "junk"]
        # An ack without req is not answered; acking twice makes the id unknown.
        await send_json(ws, {"type": "ack", "ids": [ids[1]]})
        await send_json(ws, {"type": "ack", "ids": ids, "req": 7, "extra": "ignored"})
        acked = await recv_json(ws)
        assert acked == {"type": "acked", "req": 7, "ok": [], "unknown": ids}


BAD_FRAMES: list[tuple[str | bytes, str]] = [
    ("not json", "bad_frame"),
    (b'{"type":"credit","n":1}', "bad_frame"),  # binary frame
    ("[1,2]", "bad_frame"),
    ('{"n":1}', "bad_frame"),
    ('{"type":5}', "bad_frame"),
    ('{"type":"subscribe"}', "unknown_type"),
    ('{"type":"credit"}', "bad_frame"),
    ('{"type":"credit","n":0}', "bad_frame"),
    ('{"type":"credit","n":1000001}', "bad_frame"),
    ('{"type":"credit","n":1.5}', "bad_frame"),
    ('{"type":"credit","n":"3"}', "bad_frame"),
    ('{"type":"credit","n":true}', "bad_frame"),
    ('{"type":"ack"}', "bad_frame"),
    ('{"type":"ack","ids":"0-0"}', "bad_frame"),
    ('{"type":"ack","ids":[0]}', "bad_frame"),
    ('{"type":"nack","ids":["0-0"],"delay_ms":-1}', "bad_frame"),
    ('{"type":"nack","ids":["0-0"],"delay_ms":600001}', "bad_frame"),
    ('{"type":"extend","ids":["0-0"]}', "bad_frame"),
    ('{"type":"extend","ids":["0-0"],"ms":99}', "bad_frame"),
    ('{"type":"extend","ids":["0-0"],"ms":600001}', "bad_frame"),
]


async def test_bad_frames_are_answered_and_the_connection_survives(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, [1])
    async with websockets.connect(consumer_url(shared_herald, name)) as ws:
        await recv_json(ws)
        for frame, code in BAD_FRAMES:
            await ws.send(frame)
            error = await recv_json(ws)
            assert error["type"] == "error", frame
            assert error["code"] == code, frame
            assert isinstance(error["message"], str)
        # Nothing changed: no credit was granted by the bad credit frames.
        assert await nothing_arrives(ws)
        await send_json(ws, {"type": "credit", "n": 1, "unknown": "members are ignored"})
        assert [r["value"] for r in await receive_records(ws, 1)] == [1]


async def test_hundred_bad_frames_close_1008(
    shared_herald: HeraldProcess, sub: tuple[str, str]
) -> None:
    async with websockets.connect(consumer_url(shared_herald, sub[1])) as ws:
        await recv_json(ws)
        for _ in range(99):
            await ws.send("{")
        for _ in range(99):
            assert (await recv_json(ws))["type"] == "error"
        assert ws.close_code is None, "99 bad frames are tolerated"
        await ws.send("{")
        assert await close_code(ws) == 1008


async def test_deleting_the_subscription_closes_its_consumers_4410(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    async with websockets.connect(consumer_url(shared_herald, sub[1], "?credit=1")) as ws:
        await recv_json(ws)
        assert (await http.delete(f"/v1/subscriptions/{sub[1]}")).status_code == 204
        assert await close_code(ws) == 4410


async def test_disconnect_gives_in_flight_back_at_once(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("gb"), unique("gbs")
    await make_subscription(http, name, topic, ack_deadline_ms=600_000)
    await publish(http, topic, ["x"])
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=1")) as ws:
        await recv_json(ws)
        [held] = await receive_records(ws, 1)
        assert held["attempt"] == 1
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=1")) as ws:
        await recv_json(ws)
        # Long before the 600 s deadline, with the next attempt (PROTOCOL §3).
        [again] = await receive_records(ws, 1, within=5)
        assert (again["id"], again["attempt"]) == (held["id"], 2)


async def test_competing_consumers_share_a_subscription(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    url = consumer_url(shared_herald, name, "?credit=10")
    async with websockets.connect(url) as one, websockets.connect(url) as two:
        await recv_json(one)
        await recv_json(two)
        await publish(http, topic, list(range(20)))
        # Neither acks, each has credit for 10: the 20 records are split, none twice.
        got_one, got_two = await asyncio.gather(receive_records(one, 10), receive_records(two, 10))
        values = sorted(r["value"] for r in got_one + got_two)
        assert values == list(range(20))
        assert await nothing_arrives(one) and await nothing_arrives(two)


async def test_every_subscription_gets_every_record(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, first, second = unique("fan"), unique("fan1"), unique("fan2")
    await make_subscription(http, first, topic)
    await make_subscription(http, second, topic)
    await publish(http, topic, list(range(5)))
    for name in (first, second):
        async with websockets.connect(consumer_url(shared_herald, name, "?credit=5")) as ws:
            await recv_json(ws)
            assert [r["value"] for r in await receive_records(ws, 5)] == list(range(5))


async def test_nack_with_delay_redelivers_with_next_attempt(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["n"])
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=2")) as ws:
        await recv_json(ws)
        [first] = await receive_records(ws, 1)
        await send_json(ws, {"type": "nack", "ids": [first["id"], "9-9", "junk"], "delay_ms": 0})
        [again] = await receive_records(ws, 1)
        assert (again["id"], again["attempt"]) == (first["id"], 2)


async def test_bytes_records_come_back_as_value_b64(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    payload: dict[str, Any] = {
        "value_b64": base64.b64encode(b"\x00\xff").decode(),
        "key": "k",
        "headers": {"h": "v"},
    }
    assert (
        await http.post(f"/v1/topics/{topic}/messages", json={"messages": [payload]})
    ).status_code == 200
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=1")) as ws:
        await recv_json(ws)
        [record] = await receive_records(ws, 1)
        assert record["value_b64"] == payload["value_b64"] and "value" not in record
        assert (record["key"], record["headers"]) == ("k", {"h": "v"})
