"""Waiting in tests without sleeping and hoping (STYLE 11): poll a condition until it
holds, within a generous bound, and fail saying what was awaited. The one poll-until
helper of the test suite, for coroutines (``wait_until``) and for plain threads
(``wait_until_sync``)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

WITHIN_S = 10.0  # generous: a loaded 2-core machine is slow, never wrong


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    within: float = WITHIN_S,
    what: str = "condition",
    interval: float = 0.005,
) -> None:
    """Poll ``condition`` (a function, or a coroutine function) until it is true."""
    deadline = time.monotonic() + within
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(interval)


def wait_until_sync(
    condition: Callable[[], bool],
    within: float = WITHIN_S,
    what: str = "condition",
    interval: float = 0.01,
) -> None:
    """``wait_until`` for tests that run outside an event loop."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        time.sleep(interval)
