"""etcd frozen, killed or half there: EtcdUnavailable within the timeout, failover, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import orjson
import pytest

from cluster.etcd import EtcdClient, EtcdOutcomeUnknown, EtcdUnavailable
from herald.protocol.errors import HeraldError
from tests.cluster.conftest import ATTEMPT_TIMEOUT_S, CLIENT_TIMEOUT_S, EtcdProcess, etcd_binary
from tests.conftest import free_port

# The call's budget, plus one attempt that may have started just before its end, plus
# scheduling slack on a loaded 2-core machine.
LATEST_S = CLIENT_TIMEOUT_S + ATTEMPT_TIMEOUT_S + 3.0


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A loopback port that accepts connections (the kernel does) and never answers:
    a frozen etcd member as a client sees it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def short_timeouts(endpoints: list[str]) -> EtcdClient:
    return EtcdClient(endpoints, timeout=CLIENT_TIMEOUT_S, attempt_timeout=ATTEMPT_TIMEOUT_S)


def refused_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


async def timed_failure(call: Awaitable[object]) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(EtcdUnavailable) as failure:
        await call
    return failure.value, time.monotonic() - started


def test_etcd_unavailable_is_the_cluster_unavailable_503() -> None:
    error = EtcdUnavailable("no etcd")
    assert isinstance(error, HeraldError)
    assert (error.code, error.status) == ("cluster_unavailable", 503)
    assert error.extra["retry_after"] == 1
    assert issubclass(EtcdOutcomeUnknown, EtcdUnavailable)


async def test_a_frozen_etcd_gives_unavailable_within_the_timeout_then_recovers(
    etcd_server: EtcdProcess, etcd: EtcdClient
) -> None:
    await etcd.put("/f/k", "before")
    async with short_timeouts(etcd_server.urls) as impatient:
        etcd_server.pause()
        try:
            read, read_s = await timed_failure(impatient.get("/f/k"))
            write, write_s = await timed_failure(impatient.put("/f/k", "during"))
            _, grant_s = await timed_failure(impatient.lease_grant(5))
        finally:
            etcd_server.resume()
    assert not isinstance(read, EtcdOutcomeUnknown)  # a read is repeated until the budget
    assert CLIENT_TIMEOUT_S - 0.2 <= read_s < LATEST_S
    # A write was sent and not answered: applied or not, nobody can tell.
    assert isinstance(write, EtcdOutcomeUnknown) and write_s < LATEST_S
    assert grant_s < LATEST_S
    kv = await etcd.get("/f/k")
    assert kv is not None and kv.value in (b"before", b"during")
    await etcd.put("/f/k", "after")


async def test_a_killed_etcd_gives_unavailable_then_works_once_restarted(
    etcd_server: EtcdProcess, etcd: EtcdClient
) -> None:
    await etcd.put("/f/k", "kept")
    etcd_server.kill()
    async with short_timeouts(etcd_server.urls) as impatient:
        _, read_s = await timed_failure(impatient.get("/f/k"))
        # Refused connections: nothing was sent, so even a write is retried, then refused.
        write, write_s = await timed_failure(impatient.put("/f/k", "lost"))
    assert not isinstance(write, EtcdOutcomeUnknown)
    assert read_s < LATEST_S and write_s < LATEST_S
    await asyncio.to_thread(etcd_server.start)
    kv = await etcd.get("/f/k")
    assert kv is not None and kv.value == b"kept"
    assert await etcd.put("/f/k", "again") > kv.mod_revision


async def test_a_refused_endpoint_fails_over_to_the_next(etcd_server: EtcdProcess) -> None:
    endpoints = [refused_endpoint(), *etcd_server.urls]
    async with short_timeouts(endpoints) as etcd:
        started = time.monotonic()
        await etcd.put("/f/k", "v")  # nothing reached the refused one: safe to send on
        assert time.monotonic() - started < CLIENT_TIMEOUT_S
        assert etcd.current_endpoint == etcd_server.urls[0]
        kv = await etcd.get("/f/k")
        assert kv is not None and kv.value == b"v"


async def test_a_silent_endpoint_fails_over_for_reads_and_is_unknown_for_writes(
    etcd_server: EtcdProcess, silent_endpoint: str
) -> None:
    endpoints = [silent_endpoint, etcd_server.urls[1]]
    async with short_timeouts(endpoints) as etcd:
        started = time.monotonic()
        assert await etcd.get("/f/nothing") is None  # one attempt timed out, then the next
        assert ATTEMPT_TIMEOUT_S - 0.1 <= time.monotonic() - started < LATEST_S
        assert etcd.current_endpoint == etcd_server.urls[1]

    async with short_timeouts(endpoints) as etcd:
        with pytest.raises(EtcdOutcomeUnknown):
            await etcd.put("/f/k", "v")  # sent to the silent one: maybe applied
        assert etcd.current_endpoint == etcd_server.urls[1]  # the next call goes on
        await etcd.put("/f/k", "v")


async def test_when_every_endpoint_is_down_the_call_ends_within_its_timeout(
    silent_endpoint: str,
) -> None:
    endpoints = [refused_endpoint(), silent_endpoint]
    async with short_timeouts(endpoints) as etcd:
        error, took = await timed_failure(etcd.range("/", prefix=True))
    assert took < LATEST_S
    assert "no etcd endpoint answered" in str(error)


async def test_a_watch_on_a_frozen_etcd_raises_unavailable_and_resumes_after(
    etcd_server: EtcdProcess, etcd: EtcdClient
) -> None:
    idle_probe_s = 0.5
    async with (
        short_timeouts(etcd_server.urls) as impatient,
        impatient.watch("/f/", prefix=True, idle_probe_s=idle_probe_s) as watch,
    ):
        await etcd.put("/f/a", "1")
        async with asyncio.timeout(10):
            assert (await anext(watch)).kv.key == b"/f/a"
        etcd_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(EtcdUnavailable):
                async with asyncio.timeout(30):  # a guard: the watch must end by itself
                    await anext(watch)
            took = time.monotonic() - started
        finally:
            etcd_server.resume()
        resume = watch.next_revision
    # The quiet stream is probed, the probe times out, reconnecting fails for the budget.
    assert took < 2 * idle_probe_s + ATTEMPT_TIMEOUT_S + LATEST_S
    await etcd.put("/f/b", "2")
    async with etcd.watch("/f/", prefix=True, start_revision=resume) as watch:
        async with asyncio.timeout(10):
            assert (await anext(watch)).kv.key == b"/f/b"


async def test_a_watch_opens_on_the_next_endpoint_when_the_first_is_silent(
    etcd_server: EtcdProcess, silent_endpoint: str
) -> None:
    endpoints = [silent_endpoint, etcd_server.urls[0]]
    async with (
        short_timeouts(endpoints) as etcd,
        etcd.watch("/f/", prefix=True) as watch,
    ):
        await etcd.put("/f/x", "1")
        async with asyncio.timeout(10):
            assert (await anext(watch)).kv.value == b"1"


@contextlib.asynccontextmanager
async def answering(status: bytes, content_type: bytes, body: bytes) -> AsyncIterator[str]:
    """An HTTP endpoint that answers every request with the same response."""
    answer = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        content_type,
        len(body),
        body,
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client hung up
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def proxy_error_endpoint() -> AsyncIterator[str]:
    """An HTTP server that is not etcd: it answers every request 502 with an HTML page."""
    page = b"<html><body>502 Bad Gateway</body></html>"
    async with answering(b"502 Bad Gateway", b"text/html", page) as url:
        yield url


@pytest.fixture
async def closing_member_endpoint() -> AsyncIterator[str]:
    """What an etcd member's gateway answers while the member shuts down (seen in the
    nemesis: gRPC CANCELED through grpc-gateway, HTTP 408)."""
    message = "grpc: the client connection is closing"
    body = orjson.dumps({"error": message, "code": 1, "message": message})
    async with answering(b"408 Request Timeout", b"application/json", body) as url:
        yield url


async def test_an_endpoint_that_is_not_etcd_is_passed_over_for_reads(
    etcd_server: EtcdProcess, proxy_error_endpoint: str
) -> None:
    async with short_timeouts([proxy_error_endpoint, etcd_server.urls[0]]) as etcd:
        assert await etcd.get("/f/nothing") is None
        assert etcd.current_endpoint == etcd_server.urls[0]
    async with short_timeouts([proxy_error_endpoint, etcd_server.urls[0]]) as etcd:
        with pytest.raises(EtcdOutcomeUnknown, match="502"):
            await etcd.put("/f/k", "v")  # a proxy's 502 says nothing of whether etcd applied it


async def test_a_member_closing_its_connections_is_passed_over(
    etcd_server: EtcdProcess, closing_member_endpoint: str
) -> None:
    """A read fails over to the next member; a write there may have been applied, so it
    is unknown (503), never an unhandled error (a 500, found by the nemesis)."""
    async with short_timeouts([closing_member_endpoint, etcd_server.urls[0]]) as etcd:
        assert await etcd.get("/f/nothing") is None
        assert etcd.current_endpoint == etcd_server.urls[0]
    async with short_timeouts([closing_member_endpoint, etcd_server.urls[0]]) as etcd:
        with pytest.raises(EtcdOutcomeUnknown, match="closing"):
            await etcd.put("/f/k", "v")


def test_without_etcd_installed_the_tests_fail_saying_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd on this PATH
    with pytest.raises(pytest.fail.Exception, match="`make test` installs it"):
        etcd_binary()
