"""The producer's HTTP/1.1 transport (herald/_transport.py) against real servers: TLS,
bearer tokens, chunked answers, Retry-After, keep-alive and connections the server
closed while idle."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from herald import HeraldClientError, HeraldConnectionError, Producer
from herald._transport import ConnectionPool, TransportError
from tests.security.conftest import Secured, secured  # noqa: F401 (a fixture)
from tests.security.test_tls import TlsHerald, tls_herald  # noqa: F401 (a fixture)

# PROTOCOL §2: every result says whether it was a duplicate (the SDK decodes the answer
# into herald/protocol/records.py PublishResponse).
RESULTS = b'{"results":[{"partition":0,"offset":7,"duplicate":false}]}'


@dataclass
class Scripted:
    """A real HTTP/1.1 server on loopback answering each request with the next answer."""

    answers: list[bytes]
    close_after_each: bool = False
    requests: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(head + await reader.readexactly(length))
                self.times.append(time.monotonic())
                writer.write(self.answers.pop(0))
                await writer.drain()
                if self.close_after_each:
                    break  # closed without saying so: the client finds out on reuse
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def scripted(answers: list[bytes], close_after_each: bool = False) -> AsyncIterator[Scripted]:
    script = Scripted(answers, close_after_each)
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    script.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield script
    finally:
        server.close()
        await server.wait_closed()


def answer(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(status: str, body: bytes) -> bytes:
    halves = (body[:10], body[10:])
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in halves) + b"0\r\n\r\n"
    return f"HTTP/1.1 {status}\r\ntransfer-encoding: chunked\r\n\r\n".encode() + chunks


async def test_a_503_with_retry_after_then_a_chunked_answer_on_one_connection() -> None:
    problem = b'{"status":503,"code":"storage_unavailable","detail":"busy"}'
    busy = answer("503 Service Unavailable", problem, "retry-after: 0.3")
    async with (
        scripted([busy, chunked("200 OK", RESULTS)]) as server,
        Producer(server.url, acks="1") as producer,
    ):
        result = await asyncio.wait_for(producer.send_and_wait("t", {"a": 1}), 10)
    assert result is not None and (result.partition, result.offset) == (0, 7)
    assert server.times[1] - server.times[0] >= 0.3  # Retry-After, not the 50 ms backoff
    assert server.connections == 1  # kept alive across the error answer
    assert server.requests[0].startswith(b"POST /v1/topics/t/messages?acks=1 HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'{"messages":[{"value":{"a":1}}]}')


async def test_an_error_answer_is_raised_with_its_problem() -> None:
    problem = b'{"status":413,"code":"payload_too_large","detail":"too big","index":0}'
    async with (
        scripted([answer("413 Content Too Large", problem)]) as server,
        Producer(server.url) as producer,
    ):
        with pytest.raises(HeraldClientError) as caught:
            await asyncio.wait_for(producer.send_and_wait("t", 1), 10)
    assert (caught.value.status, caught.value.code, caught.value.index) == (
        413,
        "payload_too_large",
        0,
    )


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    ok = answer("200 OK", RESULTS)
    async with (
        scripted([ok, ok], close_after_each=True) as server,
        Producer(server.url, retries=1) as producer,  # not the retries: the pool replaces it
    ):
        first = await asyncio.wait_for(producer.send_and_wait("t", 1), 10)
        second = await asyncio.wait_for(producer.send_and_wait("t", 2), 10)
    assert first == second and server.connections == 2


async def test_publish_over_tls_with_the_servers_ca(tls_herald: TlsHerald) -> None:  # noqa: F811
    async with Producer(tls_herald.url, ssl_context=tls_herald.ca) as producer:
        result = await asyncio.wait_for(producer.send_and_wait("tls-sdk", "secret"), 15)
    assert result is not None and result.offset >= 0
    async with Producer(tls_herald.url) as untrusting:  # the system's CAs only
        with pytest.raises(HeraldConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.wait_for(untrusting.send_and_wait("tls-sdk", "x"), 15)


async def test_publish_with_a_bearer_token(secured: Secured) -> None:  # noqa: F811
    async with Producer(secured.url, token=secured.tokens["publisher"]) as producer:
        result = await asyncio.wait_for(producer.send_and_wait("orders.sdk", 1), 15)
        assert result is not None
        with pytest.raises(HeraldClientError) as forbidden:
            await asyncio.wait_for(producer.send_and_wait("billing", 1), 15)
        assert forbidden.value.status == 403
    async with Producer(secured.url) as anonymous:
        with pytest.raises(HeraldClientError) as unauthorized:
            await asyncio.wait_for(anonymous.send_and_wait("orders.sdk", 1), 15)
        assert unauthorized.value.status == 401


async def test_every_retry_honours_retry_after_and_the_retries_end() -> None:
    problem = b'{"status":503,"code":"storage_unavailable","detail":"busy"}'
    busy = answer("503 Service Unavailable", problem, "retry-after: 0.2")
    async with (
        scripted([busy, busy, chunked("200 OK", RESULTS)]) as server,
        Producer(server.url, acks="1") as producer,
    ):
        result = await asyncio.wait_for(producer.send_and_wait("t", 1), 10)
    assert result is not None and result.offset == 7
    assert server.times[1] - server.times[0] >= 0.2
    assert server.times[2] - server.times[1] >= 0.2  # the second retry, through tenacity
    async with (
        scripted([busy, busy, busy]) as server,
        Producer(server.url, acks="1", retries=2) as producer,
    ):
        with pytest.raises(HeraldClientError) as caught:
            await asyncio.wait_for(producer.send_and_wait("t", 1), 10)
    assert caught.value.status == 503
    assert len(server.requests) == 2  # two tries in all, then the last error as it is


async def test_a_requests_own_headers_go_with_it_alone() -> None:
    async with scripted([answer("200 OK", RESULTS)] * 2) as script:
        pool = ConnectionPool(script.url, token="fixed-token")
        try:
            await pool.request("POST", "/a", b"{}", "application/json", {"x-for": "one"})
            await pool.request("POST", "/b", b"{}", "application/json")
        finally:
            await pool.close()
    first, second = (request.split(b"\r\n\r\n")[0].lower() for request in script.requests)
    assert b"\r\nx-for: one\r\n" in first and b"authorization: bearer fixed-token" in first
    assert b"x-for" not in second and b"authorization: bearer fixed-token" in second


@pytest.mark.parametrize(
    ("name", "value"), [("x-a", "one\r\nx-injected: 1"), ("x-a", "one\ntwo"), ("x a", "v")]
)
async def test_a_header_that_would_break_the_request_is_refused_unsent(
    name: str, value: str
) -> None:
    async with scripted([answer("200 OK", RESULTS)]) as script:
        pool = ConnectionPool(script.url)
        try:
            with pytest.raises(ValueError, match="not a header line"):
                await pool.request("POST", "/a", b"{}", headers={name: value})
        finally:
            await pool.close()
    assert script.requests == [] and script.connections == 0


async def test_a_connection_idle_past_max_idle_s_is_not_reused() -> None:
    async with scripted([answer("200 OK", RESULTS)] * 2) as script:
        pool = ConnectionPool(script.url, max_idle_s=0.05)
        try:
            await pool.request("POST", "/a", b"{}")
            await asyncio.sleep(0.2)
            await pool.request("POST", "/b", b"{}")
        finally:
            await pool.close()
    assert script.connections == 2


async def test_connecting_gives_up_at_the_connect_timeout_not_the_requests() -> None:
    # A listening socket that never accepts, its backlog full: a connect to it hangs
    # (SYNs dropped) as it does to a node cut off by a partition.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        pool = ConnectionPool(f"http://127.0.0.1:{port}", timeout=60.0, connect_timeout=0.3)
        # The request's own timeout would say "no answer within 60 s".
        with pytest.raises(TransportError, match=r"could not connect .* within 0\.3 s"):
            await pool.request("POST", "/a", b"{}")
        await pool.close()
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_max_connections_bounds_requests_at_once_and_the_rest_wait() -> None:
    async with scripted([answer("200 OK", RESULTS)] * 6) as script:
        pool = ConnectionPool(script.url, max_connections=2)
        try:
            answers = await asyncio.gather(*(pool.request("POST", "/a", b"{}") for _ in range(6)))
        finally:
            await pool.close()
    assert [a.status for a in answers] == [200] * 6
    assert script.connections == 2  # the four others waited, then reused the two
