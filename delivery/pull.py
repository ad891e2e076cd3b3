"""Pull delivery (PROTOCOL §8 Pull): a request takes records from the subscription's
own cursor, as a short-lived consumer of the engine.

Each `pull` attaches a consumer whose credit is the request's ``max_messages``; the
core sends it records exactly as it sends a WebSocket consumer or a webhook (same
in-flight table, deadlines, attempts, max_in_flight, ordering, dead-lettering), into a
PullSink that holds them for the response. When the request answers, the consumer is
*released*: it leaves, but its records stay in flight until acked, nacked or past their
deadline (`/ack` and `/nack` apply to any in-flight record of the subscription). A
request that fails or is cancelled (the client went away) gives its records back at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from delivery.events import Delivery
from delivery.flag import Flag

# With nothing to wait for (wait_ms 0), a pull still lets the subscription's worker read
# what the log has; it answers once the worker is idle, at most this much later.
SETTLE_S = 2.0


class PullSink:
    """ConsumerSink of one pull request: keeps what the core sends for the response."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.changed = asyncio.Event()  # records arrived, or closed
        self.closed = False

    def send(self, topic: str, subscription: str, deliveries: Sequence[Delivery]) -> None:
        self.deliveries.extend(deliveries)
        self.changed.set()

    def close(self, code: int, reason: str) -> None:
        """The subscription was deleted or the server stops: answer with what there is."""
        self.closed = True
        self.changed.set()


async def first_of(events: Sequence[asyncio.Event | Flag], within: float | None) -> None:
    """Wait until one of ``events`` is set, or ``within`` seconds (no busy loop, no task
    left behind)."""
    if any(event.is_set() for event in events):
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
