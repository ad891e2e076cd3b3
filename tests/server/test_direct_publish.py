"""The publish route below ASGI (server/direct_publish.py, server/http_protocol.py), on a
real server with an auth file and the access log, spoken to over raw sockets.

A publish whose whole request comes in one write is served by the HTTP protocol itself;
the same request with its body sent a moment after its headers goes the ASGI way (its
body was not all there when its headers were). Each request of a set (published, refused
by the access check, refused by validation, msgpack, acks 0/1/all, the client's request
id) is sent both ways, and the answers must be the same: status, headers, body (offsets
aside). Then what the protocol must keep of HTTP/1.1 when it answers itself: pipelined
requests answered in order, ``Connection: close``, ``Expect: 100-continue``, a body in
pieces, and the server's word on which way publishes go."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from tests.conftest import HeraldProcess
from tests.security.conftest import write_auth_file

TOKENS = {
    "admin": (["admin"], []),
    "publisher": (["publish"], ["orders.*"]),
    "stranger": (["publish", "subscribe"], ["other.*"]),
}
PAUSE_S = 0.3  # between a request's headers and its body, when they are sent apart
TIMEOUT_S = 30.0


@dataclass
class Served:
    server: HeraldProcess
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("direct")
    auth_file = base / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    server = HeraldProcess(
        base / "data", extra_args=["--auth-file", str(auth_file), "--access-log"]
    ).start()
    try:
        yield Served(server, tokens)
    finally:
        server.terminate()


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


def request(
    topic: str,
    body: bytes,
    *,
    token: str | None = None,
    query: str = "acks=1",
    content_type: str = "application/json",
    extra: tuple[tuple[str, str], ...] = (),
) -> tuple[bytes, bytes]:
    """A publish request: its head and its body."""
    lines = [
        f"POST /v1/topics/{topic}/messages?{query} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{name}: {value}" for name, value in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), body


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = [(k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]
    length = next((int(v) for k, v in headers if k == "content-length"), 0)
    return Answer(int(status_line.split()[1]), headers, await reader.readexactly(length))


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection to the server, whose reads are all over within TIMEOUT_S."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            yield reader, writer
    finally:
        writer.close()


async def exchange(port: int, *writes: bytes, answers: int = 1) -> list[Answer]:
    """Writes each piece in turn (PAUSE_S apart) on one connection, then reads answers."""
    async with connected(port) as (reader, writer):
        for index, piece in enumerate(writes):
            if index:
                await asyncio.sleep(PAUSE_S)
            writer.write(piece)
            await writer.drain()
        return [await read_answer(reader) for _ in range(answers)]


def comparable(answer: Answer) -> tuple[int, list[tuple[str, str]], Any]:
    """An answer without what differs between two publishes: the date, a fresh request
    id, the offsets the records got."""
    headers = sorted(
        (k, "" if k in ("date", "x-request-id", "content-length") else v) for k, v in answer.headers
    )
    body: Any = orjson.loads(answer.body) if answer.body else None
    if isinstance(body, dict) and "results" in body:
        body = [{**r, "offset": None} for r in body["results"]]
    return answer.status, headers, body


def cases(tokens: dict[str, str]) -> dict[str, tuple[int, bytes, bytes]]:
    """name -> (the status it gets, the request's head, its body)."""
    publisher, stranger = tokens["publisher"], tokens["stranger"]
    one = orjson.dumps({"messages": [{"value": {"n": 1}, "key": "k"}]})
    packed = msgspec.msgpack.encode({"messages": [{"value": b"\x00\x01", "key": "k"}]})
    topic = "orders.direct"
    mine = (("X-Request-Id", "mine-1"),)
    msgpack = "application/vnd.msgpack"
    return {
        "acks=1": (200, *request(topic, one, token=publisher)),
        "acks=all": (200, *request(topic, one, token=publisher, query="acks=all")),
        "acks=0": (202, *request(topic, one, token=publisher, query="acks=0")),
        "msgpack": (200, *request(topic, packed, token=publisher, content_type=msgpack)),
        "the client's request id": (200, *request(topic, one, token=publisher, extra=mine)),
        "no token": (401, *request(topic, one)),
        "a token that is not valid": (401, *request(topic, one, token="hrd_00000000_" + "x" * 43)),
        "another topic's token": (403, *request(topic, one, token=stranger)),
        "not JSON": (400, *request(topic, b"{nope", token=publisher)),
        "an unknown member": (400, *request(topic, b'{"messages":[{"valu":1}]}', token=publisher)),
        "acks not known": (400, *request(topic, one, token=publisher, query="acks=2")),
        "no body": (400, *request(topic, b"", token=publisher)),
        "a name too long": (400, *request("orders." + "n" * 300, one, token=publisher)),
    }


async def test_each_publish_is_answered_alike_either_way(served: Served) -> None:
    port = served.server.port
    for name, (status, head, body) in cases(served.tokens).items():
        (whole,) = await exchange(port, head + body)
        (apart,) = await exchange(port, head, body) if body else await exchange(port, head)
        assert comparable(whole) == comparable(apart), name
        assert whole.status == status, (name, whole)
        assert whole.header("x-request-id"), name
        if name == "the client's request id":
            assert whole.header("x-request-id") == apart.header("x-request-id") == "mine-1"


async def test_the_records_are_the_ones_sent_whether_the_body_came_whole_or_in_pieces(
    served: Served,
) -> None:
    """The body that came in pieces after its headers is handed on whole."""
    token = served.tokens["publisher"]
    value = "v" * 5000
    body = orjson.dumps({"messages": [{"value": value, "key": "whole"}]})
    head, _ = request("orders.pieces", body, token=token)
    third = len(body) // 3
    (whole,) = await exchange(served.server.port, head + body)
    (pieces,) = await exchange(
        served.server.port, head + body[:third], body[third : 2 * third], body[2 * third :]
    )
    assert whole.status == pieces.status == 200
    offsets = [orjson.loads(a.body)["results"][0] for a in (whole, pieces)]
    admin = {"Authorization": f"Bearer {served.tokens['admin']}"}
    async with httpx.AsyncClient(base_url=served.server.url, headers=admin) as http:
        for result in offsets:
            read = await http.get(
                f"/v1/topics/orders.pieces/partitions/{result['partition']}/messages",
                params={"offset": result["offset"], "limit": 1},
            )
            assert read.json()["messages"][0]["value"] == value


async def test_pipelined_requests_are_answered_in_the_order_sent(served: Served) -> None:
    """HTTP/1.1: answers in the order of the requests, whichever way each is served (a
    publish, a read behind it that goes the ASGI way, a publish again)."""
    token = served.tokens["publisher"]
    one = orjson.dumps({"messages": [{"value": 1}]})
    first = b"".join(request("orders.pipe", one, token=token, extra=(("X-Request-Id", "p-1"),)))
    read = (
        "GET /v1/topics/orders.pipe HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-2\r\n"
        f"Authorization: Bearer {served.tokens['admin']}\r\n\r\n"
    ).encode()
    third = b"".join(request("orders.pipe", one, token=token, extra=(("X-Request-Id", "p-3"),)))
    answers = await exchange(served.server.port, first + read + third, answers=3)
    assert [a.header("x-request-id") for a in answers] == ["p-1", "p-2", "p-3"]
    assert [a.status for a in answers] == [200, 200, 200]
    assert orjson.loads(answers[1].body)["name"] == "orders.pipe"


async def test_connection_close_is_kept(served: Served) -> None:
    head, body = request(
        "orders.close", b'{"messages":[{"value":1}]}', token=served.tokens["publisher"],
        extra=(("Connection", "close"),),
    )  # fmt: skip
    async with connected(served.server.port) as (reader, writer):
        writer.write(head + body)
        answer = await read_answer(reader)
        assert answer.status == 200
        assert answer.header("connection") == "close"
        assert await reader.read() == b""  # the server closed it


async def test_expect_100_continue_is_answered_before_the_body(served: Served) -> None:
    head, body = request(
        "orders.continue", b'{"messages":[{"value":1}]}', token=served.tokens["publisher"],
        extra=(("Expect", "100-continue"),),
    )  # fmt: skip
    async with connected(served.server.port) as (reader, writer):
        writer.write(head)
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(body)
        assert (await read_answer(reader)).status == 200


async def test_the_access_log_has_a_line_for_a_publish_served_below_asgi(served: Served) -> None:
    head, body = request(
        "orders.logged", b'{"messages":[{"value":1}]}', token=served.tokens["publisher"],
        extra=(("X-Request-Id", "logged-1"),),
    )  # fmt: skip
    (answer,) = await exchange(served.server.port, head + body)
    assert answer.status == 200
    line = re.compile(
        r"herald\.access: POST /v1/topics/orders\.logged/messages 200 .*\[req=logged-1\]"
    )
    for _ in range(100):  # the line is written after the answer
        if line.search(served.server.log()):
            break
        await asyncio.sleep(0.1)
    assert line.search(served.server.log()), served.server.log()[-2000:]


def test_the_server_says_which_way_publishes_go(
    served: Served, herald_factory: Any, tmp_path: Path
) -> None:
    """Said once at startup, so that a fast path lost (a layer added that the direct
    route does not know) shows; behind a trusted proxy uvicorn's proxy-headers layer
    wraps the app, and publishes go through the ASGI layers, still served."""
    assert "publishes are served below ASGI" in served.server.log()
    proxied = herald_factory("--forwarded-allow-ips", "127.0.0.1")
    assert "publishes go through the ASGI layers" in proxied.log()
    answer = httpx.post(
        f"{proxied.url}/v1/topics/t/messages", json={"messages": [{"value": 1}]}, timeout=30
    )
    assert answer.status_code == 200, answer.text
