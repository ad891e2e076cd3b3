"""The keepalive wheel (server/keepalive.py): one loop timer serving every connection's
pings and pong deadlines, each at its due time or at most a tick after, never before."""

from __future__ import annotations

import asyncio

from server.keepalive import KeepaliveWheel

TICK_S = 0.02


class Connection:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.served_at: list[float] = []
        self.served = asyncio.Event()

    def keepalive_due(self) -> None:
        self.served_at.append(self.loop.time())
        self.served.set()


class Failing(Connection):
    def keepalive_due(self) -> None:
        super().keepalive_due()
        raise RuntimeError("this connection's ping failed")


async def test_each_connection_is_served_once_not_before_its_time_and_within_a_tick() -> None:
    loop = asyncio.get_running_loop()
    wheel = KeepaliveWheel(loop, TICK_S)
    delays = [0.0, 0.01, 0.05, 0.05, 0.11]
    connections = [Connection(loop) for _ in delays]
    start = loop.time()
    for connection, delay in zip(connections, delays, strict=True):
        wheel.add(connection, delay)
    async with asyncio.timeout(10):
        for connection in connections:
            await connection.served.wait()
    await asyncio.sleep(3 * TICK_S)  # nothing is served twice
    for connection, delay in zip(connections, delays, strict=True):
        [at] = connection.served_at
        assert at >= start + delay - 0.002  # the loop's clock has ms granularity
        # A tick late at most, and whatever a loaded machine stalls the loop for.
        assert at <= start + delay + TICK_S + 2.0


async def test_a_discarded_connection_is_not_served_and_an_earlier_one_rearms_the_timer() -> None:
    loop = asyncio.get_running_loop()
    wheel = KeepaliveWheel(loop, TICK_S)
    gone, late, early = Connection(loop), Connection(loop), Connection(loop)
    start = loop.time()
    slot = wheel.add(gone, 0.05)
    # Late by far more than a loaded machine stalls the loop: early is served first only
    # if its add rearmed the timer.
    wheel.add(late, 2.0)
    wheel.discard(gone, slot)
    wheel.add(early, 0.01)  # before the slot the timer was armed for
    async with asyncio.timeout(10):
        await early.served.wait()
        assert not late.served_at
        await late.served.wait()
    assert early.served_at[0] < start + 2.0 <= late.served_at[0] + 0.002
    assert not gone.served_at


async def test_one_connection_failing_does_not_stop_the_others() -> None:
    loop = asyncio.get_running_loop()
    wheel = KeepaliveWheel(loop, TICK_S)
    failing, other, later = Failing(loop), Connection(loop), Connection(loop)
    wheel.add(failing, 0.01)
    wheel.add(other, 0.01)
    wheel.add(later, 0.1)
    async with asyncio.timeout(10):
        await other.served.wait()
        await later.served.wait()
    assert failing.served_at
