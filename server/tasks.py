"""Ending the server's own background tasks without swallowing a cancellation
(STYLE principle 4: never `suppress(CancelledError)`), and what runs when a task ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` (None ones skipped) and wait until every one has ended.

    A task's own CancelledError ends with it: ``asyncio.wait`` does not raise what the
    tasks raised. If the caller itself is cancelled meanwhile, its CancelledError
    propagates from the wait, as it must. A task that failed with anything else
    re-raises it here.
    """
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    if not running:
        return
    await asyncio.wait(running)
    for task in running:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


def at_task_end(callback: Callable[[asyncio.Task[Any]], object]) -> None:
    """Call ``callback`` with the task running now once that task is done, however it
    ends (returned, raised, cancelled).

    What an ASGI layer serving a WebSocket undoes at the end (a count, a registration)
    goes here instead of into a ``finally`` around the next layer: uvicorn runs each
    connection's app call in a task of its own, and a ``finally`` keeps the layer's frame
    suspended for as long as the socket stays open (issue 27 §3: memory per idle
    consumer)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("at_task_end outside a task")
    task.add_done_callback(callback)
