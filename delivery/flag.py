"""A one-bit event, at a tenth of `asyncio.Event`'s size.

Every idle WebSocket consumer holds a handful of these, and every tail its delivery
worker's two (issue 27 §3: memory per consumer). `asyncio.Event` allocates a deque of
waiters up front (760 bytes on CPython 3.11) though one task or two at most wait on one
here; a `Flag` holds a list of waiters only while someone waits. Same semantics as `asyncio.Event`: `wait` returns at once when set, else when
`set` is next called; a cancelled waiter leaves no trace.
"""

from __future__ import annotations

import asyncio


class Flag:
    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
                if not self._waiters:
                    self._waiters = None
