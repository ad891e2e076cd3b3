"""The node's task group (cluster/task_group.py): every loop ends when the node closes,
and one that fails says so at once instead of vanishing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cluster.task_group import TaskGroup


async def test_closing_ends_every_task_it_started() -> None:
    group = TaskGroup()
    forever = asyncio.Event()
    tasks = [group.start(forever.wait(), f"loop-{i}") for i in range(3)]
    await asyncio.sleep(0)

    await group.close()

    assert all(task.done() for task in tasks)
    assert group.named("loop-1") is tasks[1]
    assert group.named("absent") is None


async def test_a_task_that_fails_is_logged_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    group = TaskGroup()

    async def broken() -> None:
        raise RuntimeError("the watch broke")

    with caplog.at_level(logging.ERROR, logger="herald.cluster"):
        task = group.start(broken(), "herald-broken")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # the done callback runs on the next turn of the loop

    assert any("herald-broken ended" in r.getMessage() for r in caplog.records)
    await group.close()
