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
from tests.server import assert_problem


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


def test_integers_of_thousands_of_digits_in_paths_queries_and_seeks_are_4xx(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    """Python converts at most 4300 digits at once; past that the text is out of range,
    never a 500."""
    huge = "9" * 5000
    topic, name = unique("t"), unique("s")
    with httpx.Client(base_url=shared_herald.url, timeout=30) as http:
        assert http.put(f"/v1/subscriptions/{name}", json={"topic": topic}).status_code == 201
        read = f"/v1/topics/{topic}/partitions"
        for response, status, code in (
            (http.get(f"{read}/{huge}/messages"), 404, "partition_not_found"),
            (http.get(f"{read}/-{huge}/messages"), 404, "partition_not_found"),
            (http.get(f"{read}/0/messages?offset={huge}"), 400, "validation_error"),
            (http.get(f"{read}/0/messages?limit=-{huge}"), 400, "validation_error"),
            (
                http.post(f"/v1/subscriptions/{name}/seek", json={"offsets": {huge: 1}}),
                404,
                "partition_not_found",
            ),
            (
                http.post(
                    f"/v1/subscriptions/{name}/seek",
                    content='{"offsets": {"0": ' + "9" * 300 + "}}",
                ),
                400,
                "validation_error",
            ),
        ):
            problem = assert_problem(response, status, code)
            assert len(problem["detail"]) < 400


def test_any_string_in_key_headers_and_id_is_stored_and_read_back_exactly(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    """Keys, header names and values and producer ids are re-encoded by the server (record
    files, the dedup index, read and deliver frames): control characters, U+2028 and
    astral characters come back as sent."""
    topic = unique("strings")
    odd = ["\u0000\n", "a\u2028b\u2029", "😀" * 128, "\\", '"', "\x7f\x1b[0m"]
    messages = [
        {"value": i, "id": text, "key": text, "headers": {text: text, "x": text}}
        for i, text in enumerate(odd)
    ]
    with httpx.Client(base_url=shared_herald.url, timeout=30) as http:
        first = http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
        assert first.status_code == 200, first.text
        again = http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
        assert all(r["duplicate"] for r in again.json()["results"])
        read = http.get(f"/v1/topics/{topic}/partitions/0/messages")
        records = json.loads(read.text)["messages"]
    assert [(r["key"], r["headers"]) for r in records] == [
        (text, {text: text, "x": text}) for text in odd
    ]
