"""herald.lifecycle: periodic work, supervised jobs restarted with backoff, services
started under one exit stack and stopped in reverse. Delays here are milliseconds;
nothing waits for a deadline by the second."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from herald.lifecycle import Backoff, periodic, start_service, supervised
from herald.protocol.errors import StorageUnavailable

log = logging.getLogger("tests.lifecycle")
QUICK = Backoff(first_s=0.001, max_s=0.004, healthy_s=60.0)


async def test_periodic_work_goes_on_after_a_failed_run(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    third = asyncio.Event()

    async def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise OSError("disk full")
        if len(runs) == 3:
            third.set()

    task = asyncio.create_task(periodic(0.001, work, what="flush", logger=log))
    await asyncio.wait_for(third.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()  # cancellation is not swallowed
    assert "flush failed" in caplog.text
    assert "Traceback" in caplog.text  # not an error the protocol names: a bug to read


async def test_a_periodic_run_failing_with_a_protocol_error_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = asyncio.Event()

    async def work() -> None:
        failed.set()
        raise StorageUnavailable("cannot fsync partition 0: [Errno 28] No space left on device")

    task = asyncio.create_task(periodic(0.001, work, what="periodic flush", logger=log))
    await asyncio.wait_for(failed.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert "periodic flush failed: cannot fsync partition 0" in caplog.text
    assert "Traceback" not in caplog.text


async def test_a_supervised_job_is_restarted_until_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def job() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise RuntimeError(f"failure {calls}")
        return "done"

    await asyncio.wait_for(supervised(job, what="dispatcher", logger=log, backoff=QUICK), 5)
    assert calls == 4
    assert caplog.text.count("dispatcher failed; restarting") == 3


async def test_a_final_exception_ends_supervision_and_reaches_the_caller() -> None:
    class Deleted(Exception):
        pass

    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        raise Deleted

    with pytest.raises(Deleted):
        await supervised(job, what="job", logger=log, backoff=QUICK, final=(Deleted,))
    assert calls == 1


async def test_cancelling_a_supervised_job_cancels_it_without_a_restart() -> None:
    started = asyncio.Event()
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(supervised(job, what="job", logger=log, backoff=QUICK))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()
    assert calls == 1


async def test_restart_delays_double_up_to_the_cap_and_start_over_after_a_healthy_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    backoff = Backoff(first_s=0.001, max_s=0.004, healthy_s=0.2)
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        if calls == 6:
            await asyncio.sleep(0.25)  # stays up longer than healthy_s, then fails
        if calls < 8:
            raise RuntimeError("again")

    await asyncio.wait_for(supervised(job, what="job", logger=log, backoff=backoff), 5)
    delays = [r.getMessage().rsplit(" ", 2)[-2] for r in caplog.records]
    assert delays == ["0.001", "0.002", "0.004", "0.004", "0.004", "0.001", "0.002"]


def test_a_backoff_that_shrinks_is_refused() -> None:
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s=2.0, max_s=1.0)


class Part:
    def __init__(self, name: str, events: list[str], *, fail: bool = False) -> None:
        self.name, self.events, self.fail = name, events, fail

    async def start(self) -> None:
        if self.fail:
            raise OSError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    async def stop(self) -> None:
        self.events.append(f"stop {self.name}")


async def test_services_stop_in_the_reverse_order_of_their_starts() -> None:
    events: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in ("storage", "cluster", "delivery", "webhooks"):
            await start_service(stack, Part(name, events))
    assert events == [
        "start storage",
        "start cluster",
        "start delivery",
        "start webhooks",
        "stop webhooks",
        "stop delivery",
        "stop cluster",
        "stop storage",
    ]


async def test_a_failed_start_stops_what_had_started() -> None:
    events: list[str] = []
    with pytest.raises(OSError, match="delivery cannot start"):
        async with contextlib.AsyncExitStack() as stack:
            await start_service(stack, Part("storage", events))
            await start_service(stack, Part("cluster", events))
            await start_service(stack, Part("delivery", events, fail=True))
    assert events == ["start storage", "start cluster", "stop cluster", "stop storage"]
