"""The background work of a cluster node, owned in one place: each loop of its parts
(the metadata watch, reconcile, the leaders' ISR ticks, compaction, the fence, the
cursors) is started here by name and ended here, all together, when the node closes.

Not :class:`asyncio.TaskGroup`: that one is entered and left by one ``async with`` in
one task and cancels the task that entered it when a child fails — here the node starts
in the server's lifespan and closes later, and a loop that failed must not take the
server down with it. Every loop catches what it can live through; one that ends with an
exception anyway is logged at once, not at close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("herald.cluster")


class TaskGroup:
    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(_report)
        self._tasks.append(task)
        return task

    def named(self, name: str) -> asyncio.Task[None] | None:
        return next((t for t in self._tasks if t.get_name() == name), None)

    async def close(self) -> None:
        """Cancel every task and wait for each to end."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s ended: %r", task.get_name(), exc, exc_info=exc)
