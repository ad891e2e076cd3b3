"""A Consumer closed with 1012 (PROTOCOL §7: its subscription's coordinator is moving)
comes back within 50-200 ms, jittered, however many times in a row, instead of backing
off as from a dead server (issue 28: consumers waited 4 s while nodes answered 1012).
The delays are read from what the consumer decided (its reconnect log), not timed."""

from __future__ import annotations

import asyncio
import logging

import pytest
from websockets.asyncio.server import ServerConnection, serve

from herald import Consumer
from herald.consumer import COORDINATOR_MOVING_RETRY_S
from tests.helpers import wait_until

SERVICE_RESTART = 1012
TRY_AGAIN_LATER = 1013
ATTEMPTS = 8


def reconnect_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(r.args[3])  # type: ignore[index]
        for r in caplog.records
        if r.name == "herald.consumer" and "reconnecting in" in r.msg
    ]


async def closing_node(code: int, attempts: list[int]) -> tuple[object, str]:
    async def handler(ws: ServerConnection) -> None:
        attempts.append(1)
        await ws.close(code, "the subscription's coordinator is moving")

    server = await serve(handler, "127.0.0.1", 0)
    port = next(iter(server.sockets)).getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def first_message(consumer: Consumer) -> object:
    async for message in consumer:
        return message
    return None


async def run_until_attempts(code: int, caplog: pytest.LogCaptureFixture) -> list[float]:
    caplog.set_level(logging.WARNING, logger="herald")
    attempts: list[int] = []
    server, url = await closing_node(code, attempts)
    consumer = Consumer(url, "s")  # the default backoff: 0.05 s doubling up to 5 s
    reader = asyncio.ensure_future(first_message(consumer))
    try:
        await wait_until(
            lambda: len(attempts) >= ATTEMPTS or reader.done(), within=60, what="attempts"
        )
        assert not reader.done(), reader
    finally:
        await consumer.close()
        await asyncio.wait((reader,))
        server.close()  # type: ignore[attr-defined]
    return reconnect_delays(caplog)


async def test_1012_retries_quickly_without_growing_the_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    delays = await run_until_attempts(SERVICE_RESTART, caplog)
    low, high = COORDINATOR_MOVING_RETRY_S
    assert len(delays) >= ATTEMPTS - 1
    assert all(low <= d <= high for d in delays), delays
    assert (low, high) == (0.05, 0.2)


async def test_1013_still_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    # "Try again later" (a node at its connection limit) is retried too, with backoff.
    delays = await run_until_attempts(TRY_AGAIN_LATER, caplog)
    assert max(delays) > COORDINATOR_MOVING_RETRY_S[1], delays
