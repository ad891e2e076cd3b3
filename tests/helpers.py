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
FIRST_INTERVAL_S = 0.005  # polls start fast and back off, so that a condition asked
MAX_INTERVAL_S = 0.1  # of a server over HTTP does not hammer it


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    within: float = WITHIN_S,
    what: str = "condition",
) -> None:
    """Poll ``condition`` (a function, or a coroutine function) until it is true."""
    deadline = time.monotonic() + within
    interval = FIRST_INTERVAL_S
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(interval)
        interval = min(interval * 2, MAX_INTERVAL_S)


def wait_until_sync(
    condition: Callable[[], bool],
    within: float = WITHIN_S,
    what: str = "condition",
) -> None:
    """``wait_until`` for tests that run outside an event loop."""
    deadline = time.monotonic() + within
    interval = FIRST_INTERVAL_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        time.sleep(interval)
        interval = min(interval * 2, MAX_INTERVAL_S)


class FakeClock:
    """An injected monotonic clock (STYLE 10) that moves only when the test moves it."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
