"""Ending the server's own background tasks without swallowing a cancellation
(STYLE principle 4: never `suppress(CancelledError)`)."""

from __future__ import annotations

import asyncio
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
