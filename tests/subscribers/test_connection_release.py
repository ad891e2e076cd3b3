"""A WebSocket consumer's objects are freed when its connection ends, not later by the
cycle collector: a server holding hundreds of thousands of long-lived objects seldom
runs a full collection (issue 27 §3), so garbage in a cycle stays for a long while.

The server runs in this process (conftest's `served`: uvicorn on a free loopback port,
as `herald serve` runs it), so that the test can hold a weak reference to a
connection's session and see it go, with the collector off, once the client closes.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import httpx
import pytest
import websockets

from subscribers.session import ConsumerSession
from subscribers.tail import TailSession

pytestmark = pytest.mark.timeout(60)


def the_one(kind: type[Any]) -> weakref.ref[Any]:
    """A weak reference to the one live object of ``kind`` (a connection's session)."""
    [one] = [o for o in gc.get_objects() if type(o) is kind]
    return weakref.ref(one)


async def freed(ref: weakref.ref[Any]) -> bool:
    """Whether ``ref``'s object goes, with the collector off, once its connection's
    tasks have wound down (bounded)."""
    for _ in range(1500):  # 30 s: a loaded host winds the tasks down late
        if ref() is None:
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.fixture
def collector_off() -> Any:
    gc.collect()
    gc.disable()
    yield
    gc.enable()


async def test_a_closed_tail_is_freed_without_the_collector(
    served: tuple[Any, str], collector_off: None
) -> None:
    _, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        assert (await http.put("/v1/topics/gone", json={})).status_code == 201
    async with websockets.connect(f"ws://{address}/v1/topics/gone/ws?credit=5") as ws:
        assert b'"ready"' in await ws.recv(decode=False)
        ref = the_one(TailSession)
    assert await freed(ref), "the closed tail's session is still held"


async def test_a_closed_subscription_consumer_is_freed_without_the_collector(
    served: tuple[Any, str], collector_off: None
) -> None:
    _, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        made = await http.put("/v1/subscriptions/left", json={"topic": "gone"})
        assert made.status_code == 201, made.text
    async with websockets.connect(f"ws://{address}/v1/subscriptions/left/ws?credit=5") as ws:
        assert b'"ready"' in await ws.recv(decode=False)
        ref = the_one(ConsumerSession)
    assert await freed(ref), "the closed consumer's session is still held"
