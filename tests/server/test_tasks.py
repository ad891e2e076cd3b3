"""server/tasks.py: background tasks end without swallowing the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from server.tasks import cancel_and_wait


async def forever(started: asyncio.Event) -> None:
    started.set()
    await asyncio.Event().wait()


async def test_cancelled_tasks_end_and_their_cancellation_stops_there() -> None:
    started = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(forever(e)) for e in started]
    await asyncio.gather(*(e.wait() for e in started))
    await cancel_and_wait(*tasks, None)
    assert all(t.cancelled() for t in tasks)


async def test_the_callers_own_cancellation_propagates() -> None:
    started, stubborn_started = asyncio.Event(), asyncio.Event()
    release = asyncio.Event()

    async def stubborn() -> None:
        stubborn_started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # takes its time to end

    worker = asyncio.create_task(stubborn())
    await stubborn_started.wait()

    async def closer() -> None:
        started.set()
        await cancel_and_wait(worker)

    closing = asyncio.create_task(closer())
    await started.wait()
    await asyncio.sleep(0)  # closer is now waiting for the worker
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    release.set()
    await asyncio.wait([worker])
    assert worker.cancelled()


async def test_a_task_that_failed_reraises() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken())
    await asyncio.wait([task])
    with pytest.raises(RuntimeError):
        await cancel_and_wait(task)
