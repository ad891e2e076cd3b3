"""Linearizable reads of one etcd key shared by the callers that need one at once.

A read of a topic from a node's own copy first reads the topic's key from etcd
(PROTOCOL §7: a re-created name is a new thing, and this node's view may lag): the
answer must come from a read that *started after* the caller arrived, or it could
predate a delete and re-create the caller must see. So a caller never joins a read
already under way; it joins the next one, which starts as soon as the current one
ends. However many reads of a topic arrive at once, at most two reads of its key are
in flight (the current and the next), instead of one per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FreshReads(Generic[K, V]):
    def __init__(self, read: Callable[[K], Awaitable[V]]) -> None:
        self._read = read
        self._running: dict[K, asyncio.Task[V]] = {}
        self._next: dict[K, asyncio.Future[V]] = {}

    async def get(self, key: K) -> V:
        """The value of ``key`` from a read started after this call; the read's error,
        if it fails. Cancelling a caller does not cancel the read others share."""
        if key not in self._running:
            return await asyncio.shield(self._start(key))
        waiting = self._next.get(key)
        if waiting is None:
            waiting = self._next[key] = asyncio.get_running_loop().create_future()
        return await asyncio.shield(waiting)

    def _start(self, key: K) -> asyncio.Task[V]:
        task = asyncio.ensure_future(self._read(key))
        self._running[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    def _finished(self, key: K, done: asyncio.Task[V]) -> None:
        del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: every caller may have gone
        waiting = self._next.pop(key, None)
        if waiting is not None:
            self._start(key).add_done_callback(lambda task: _settle(waiting, task))


def _settle(future: asyncio.Future[V], task: asyncio.Task[V]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif (error := task.exception()) is not None:
        future.set_exception(error)
        future.exception()  # retrieved: every caller may have gone
    else:
        future.set_result(task.result())
