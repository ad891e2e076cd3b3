"""cluster/fresh_reads.py: callers share reads, never one that started before them."""

from __future__ import annotations

import asyncio

import pytest

from cluster.fresh_reads import FreshReads


class Reads:
    """A read of a key that answers the read's sequence number once released."""

    def __init__(self) -> None:
        self.started = 0
        self.release = asyncio.Event()

    async def __call__(self, key: str) -> int:
        self.started += 1
        number = self.started
        await self.release.wait()
        if key == "broken":
            raise RuntimeError(f"read {number} failed")
        return number


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_many_callers_make_at_most_two_reads() -> None:
    reads = Reads()
    fresh: FreshReads[str, int] = FreshReads(reads)
    callers = [asyncio.create_task(fresh.get("t")) for _ in range(10)]
    await settle()
    assert reads.started == 1  # the first caller's; the others wait for the next
    reads.release.set()
    assert await asyncio.gather(*callers) == [1] + [2] * 9
    assert reads.started == 2


async def test_a_caller_arriving_during_a_read_gets_the_next_one() -> None:
    reads = Reads()
    fresh: FreshReads[str, int] = FreshReads(reads)
    first = asyncio.create_task(fresh.get("t"))
    await settle()
    later = [asyncio.create_task(fresh.get("t")) for _ in range(5)]
    await settle()
    assert reads.started == 1  # the next read waits for the current one
    reads.release.set()
    assert await first == 1
    assert await asyncio.gather(*later) == [2] * 5  # started after they arrived
    assert reads.started == 2


async def test_keys_do_not_share_and_a_failure_reaches_every_caller() -> None:
    reads = Reads()
    fresh: FreshReads[str, int] = FreshReads(reads)
    broken = [asyncio.create_task(fresh.get("broken")) for _ in range(3)]
    fine = asyncio.create_task(fresh.get("t"))
    await settle()
    assert reads.started == 2
    reads.release.set()
    for caller in broken:
        with pytest.raises(RuntimeError, match="failed"):
            await caller
    assert await fine == 2


async def test_a_cancelled_caller_leaves_the_read_to_the_others() -> None:
    reads = Reads()
    fresh: FreshReads[str, int] = FreshReads(reads)
    first = asyncio.create_task(fresh.get("t"))
    waiting = [asyncio.create_task(fresh.get("t")) for _ in range(2)]
    await settle()
    first.cancel()
    waiting[0].cancel()
    reads.release.set()
    assert await waiting[1] == 2
    assert reads.started == 2
    assert await fresh.get("t") == 3  # nothing left behind
