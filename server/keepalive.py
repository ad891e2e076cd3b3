"""One timer for every WebSocket's keepalive pings, instead of a timer per connection.

PROTOCOL §3: the server pings every WebSocket each ``--ws-ping-interval`` seconds and
drops one whose pong is more than ``--ws-ping-timeout`` seconds late. uvicorn keeps a
timer handle per connection for that (about 650 bytes of Python heap with what it
holds, and a libuv timer besides: issue 27 §3, memory per idle consumer). Here the
connections of one event loop share a :class:`KeepaliveWheel`: time is cut in ticks,
each connection waits in the slot of the tick its next ping or pong deadline falls in,
and one loop timer, armed for the earliest slot, serves them all. A connection is served
at its due time or at most one tick after it, never before.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from typing import Protocol

log = logging.getLogger("herald.server")

# At most this long, and at most a quarter of the interval or timeout, between turns.
_MAX_TICK_S = 1.0


class KeptAlive(Protocol):
    """A connection the wheel serves: ``keepalive_due`` when its time has come."""

    def keepalive_due(self) -> None: ...


class KeepaliveWheel:
    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float) -> None:
        self._loop = loop
        self._tick = tick_s
        self._slots: dict[int, set[KeptAlive]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: int | None = None  # the slot the timer is set for

    def add(self, connection: KeptAlive, delay_s: float) -> int:
        """Serve ``connection`` ``delay_s`` from now (or up to a tick later); its slot,
        which ``discard`` takes to take it out again."""
        slot = math.ceil((self._loop.time() + delay_s) / self._tick)
        waiting = self._slots.get(slot)
        if waiting is None:
            waiting = self._slots[slot] = set()
        waiting.add(connection)
        if self._armed_for is None or slot < self._armed_for:
            self._arm(slot)
        return slot

    def discard(self, connection: KeptAlive, slot: int) -> None:
        waiting = self._slots.get(slot)
        if waiting is not None:
            waiting.discard(connection)
            if not waiting:
                del self._slots[slot]  # the timer, if set for it, finds nothing due

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = slot
        self._timer = self._loop.call_at(slot * self._tick, self._turn)

    def _turn(self) -> None:
        self._timer = self._armed_for = None
        now = self._loop.time() / self._tick
        # The slots are at most (the longer of interval and timeout) / tick + 1.
        for slot in [s for s in self._slots if s <= now]:
            for connection in self._slots.pop(slot):
                try:
                    connection.keepalive_due()
                except Exception:  # one connection's failure does not stop the others'
                    log.exception("keepalive of a WebSocket failed")
        if self._slots:
            self._arm(min(self._slots))


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeepaliveWheel] = (
    weakref.WeakKeyDictionary()
)


def wheel_of(
    loop: asyncio.AbstractEventLoop, interval_s: float, timeout_s: float
) -> KeepaliveWheel:
    """The wheel of ``loop`` (made at its first use, with a tick fine enough for an
    interval and timeout of these lengths: the server's are the same for every socket)."""
    wheel = _wheels.get(loop)
    if wheel is None:
        tick = min(_MAX_TICK_S, interval_s / 4, timeout_s / 4)
        wheel = _wheels[loop] = KeepaliveWheel(loop, tick)
    return wheel
