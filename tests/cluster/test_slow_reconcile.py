"""A reconcile pass that runs long is logged with where it waits (cluster/node.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cluster import node


async def _waits_on_something_that_never_comes(never: asyncio.Event) -> None:
    await _deeper(never)


async def _deeper(never: asyncio.Event) -> None:
    await never.wait()


async def test_a_long_pass_is_logged_with_the_stack_it_waits_in(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(node, "_SLOW_PASS_S", 0.05)
    never, ended = asyncio.Event(), asyncio.Event()

    async def one_pass() -> None:
        slow = node._SlowPass(asyncio.current_task())
        try:
            async with asyncio.timeout(0.3):
                await _waits_on_something_that_never_comes(never)
        except TimeoutError:
            pass
        finally:
            slow.done()
            ended.set()

    with caplog.at_level(logging.WARNING, logger="herald.cluster"):
        await asyncio.wait_for(asyncio.create_task(one_pass()), 30)
    assert ended.is_set()
    reports = [r.getMessage() for r in caplog.records if "has run for" in r.getMessage()]
    assert reports, caplog.text
    assert "in _deeper" in reports[0], reports[0]  # the frame it waits in, not only its caller
    assert any("ended after" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_quick_pass_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="herald.cluster"):
        slow = node._SlowPass(asyncio.current_task())
        await asyncio.sleep(0)
        slow.done()
        await asyncio.sleep(0.05)
    assert not caplog.records
