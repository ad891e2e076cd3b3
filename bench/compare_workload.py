"""bench/compare.py's workloads, apart from any one system: what a record holds, how
records are sent (the client's per-record call or its batch call, how many in flight),
and the adapters' common shape (``System``, ``Channel``).

Every system is driven by the same functions here (``end_to_end``, ``latency``) through
its ``Channel``: ``send`` is the client's per-record publish, ``send_batch`` its batch
form, and ``consuming`` decodes and acks every delivery with the per-record or the
batch call. So a mode does the same work per record on every system, and a system's
adapter says only how its client spells each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

RECORD_BYTES = 1024
BATCH = 500
CONCURRENCY = 4
WINDOW = 1000
SEQ_DIGITS = 10  # a latency record starts with its sequence number, zero-padded
_RANDOM = os.urandom(RECORD_BYTES)


class Payload(enum.Enum):
    """What a record holds. JSON: 1 KiB of text (Herald: a JSON string ``value``; the
    peers carry its bytes as they are). Binary: 1 KiB of random bytes (Herald: a
    ``value_b64`` each way; the peers carry them as they are)."""

    JSON = "json"
    BINARY = "binary"

    def record(self, seq: int | None = None) -> bytes:
        """A record's bytes; with ``seq``, stamped with it (the latency runs)."""
        body = _RANDOM if self is Payload.BINARY else b"x" * RECORD_BYTES
        if seq is None:
            return body
        return b"%0*d" % (SEQ_DIGITS, seq) + body[SEQ_DIGITS:]


class Calls(enum.Enum):
    """Which of the client's calls publish and ack: one call per record (Herald:
    ``producer.send``, ``message.ack()``) or its batch calls (``send_many``,
    ``ack_many``)."""

    RECORD = "per-record"
    BATCH = "batch"


class Shape(enum.Enum):
    """How many records the producer has in flight (sent, not yet answered)."""

    BATCHES = f"{CONCURRENCY} batches of {BATCH}"  # CONCURRENCY batch calls of BATCH
    WINDOW = f"one window of {WINDOW}"  # WINDOW records, refilled as answers come


@dataclass(frozen=True, slots=True)
class Workload:
    """An end-to-end run's mode."""

    shape: Shape
    calls: Calls
    payload: Payload

    @property
    def label(self) -> str:
        return f"{self.payload.value}, {self.shape.value}, {self.calls.value} calls"


WORKLOADS = (
    Workload(Shape.BATCHES, Calls.BATCH, Payload.JSON),  # the table of 2026-11-25
    Workload(Shape.WINDOW, Calls.BATCH, Payload.JSON),
    Workload(Shape.WINDOW, Calls.RECORD, Payload.JSON),
    Workload(Shape.BATCHES, Calls.BATCH, Payload.BINARY),
    Workload(Shape.WINDOW, Calls.BATCH, Payload.BINARY),
    Workload(Shape.WINDOW, Calls.RECORD, Payload.BINARY),
)
LATENCY_MODES = tuple(
    (calls, payload) for payload in Payload for calls in (Calls.RECORD, Calls.BATCH)
)


class Channel(Protocol):
    """One system's producer and consumer on a fresh stream/topic/queue."""

    def encode(self, record: bytes) -> Any:
        """The value the client is given for ``record`` (Herald's JSON mode: a str)."""
        ...

    def send(self, value: Any) -> Awaitable[Any]:
        """The client's per-record publish, answered once the server has it."""
        ...

    def send_batch(self, values: list[Any]) -> Awaitable[Any]:
        """The client's batch publish (or what its users do for one), answered once
        the server has every record."""
        ...

    def consuming(
        self, on_record: Callable[[Any], None], calls: Calls
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Until the block ends: each delivery decoded, given to ``on_record`` and acked
        with the ``calls`` kind of ack."""
        ...


class System(Protocol):
    name: str
    pid: int | None  # the server's process, for its CPU time

    def channel(self, payload: Payload) -> contextlib.AbstractAsyncContextManager[Channel]: ...


class Counter:
    """Counts deliveries; ``done`` once all ``total`` are in."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.got = 0
        self.done = asyncio.Event()

    def delivered(self, _: Any) -> None:
        self.got += 1
        if self.got >= self.total:
            self.done.set()


class Clock:
    """Send times by sequence number, and the latency of each delivery."""

    def __init__(self, total: int, payload: Payload) -> None:
        self.total = total
        self.payload = payload
        self.sent: dict[int, int] = {}
        self.latencies: list[float] = []
        self.done = asyncio.Event()

    def stamp(self, seq: int) -> bytes:
        self.sent[seq] = time.perf_counter_ns()
        return self.payload.record(seq)

    def delivered(self, value: bytes | str) -> None:
        seq = int(value[:SEQ_DIGITS])
        self.latencies.append((time.perf_counter_ns() - self.sent[seq]) / 1e6)
        if len(self.latencies) >= self.total:
            self.done.set()


# --- how records are sent -----------------------------------------------------------


async def _batches(records: int, value: Any, channel: Channel) -> None:
    """``records`` in batch calls of BATCH, CONCURRENCY of them in flight."""
    queue = [min(BATCH, records - i) for i in range(0, records, BATCH)]

    async def worker() -> None:
        while queue:
            await channel.send_batch([value] * queue.pop())

    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(worker())


async def _window_of_records(records: int, value: Any, channel: Channel) -> None:
    """One per-record call per record, WINDOW of them unanswered at most: a slot frees
    as each answer comes and the next record takes it."""
    room = asyncio.Semaphore(WINDOW)
    out: set[asyncio.Future[Any]] = set()
    failures: list[BaseException] = []

    def answered(future: asyncio.Future[Any]) -> None:
        room.release()
        out.discard(future)
        if not future.cancelled() and future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]

    for _ in range(records):
        await room.acquire()
        if failures:
            raise failures[0]
        future = asyncio.ensure_future(channel.send(value))
        out.add(future)
        future.add_done_callback(answered)
    await asyncio.gather(*out)
    if failures:
        raise failures[0]


async def _window_of_batches(records: int, value: Any, channel: Channel) -> None:
    """Batch calls keeping WINDOW records unanswered at most: each call takes all the
    room free when it is made (the first the whole window, the next what the answers
    freed meanwhile)."""
    room = WINDOW
    freed = asyncio.Event()
    left = records

    def release(n: int) -> None:
        nonlocal room
        room += n
        freed.set()

    async with asyncio.TaskGroup() as group:
        while left:
            while room == 0:
                freed.clear()
                await freed.wait()
            n = min(room, left)
            room -= n
            left -= n
            task = group.create_task(_answered(channel.send_batch([value] * n)))
            task.add_done_callback(lambda _, n=n: release(n))


async def _answered(call: Awaitable[Any]) -> None:
    await call  # a task's coroutine around a client's future (Herald's send_many)


async def end_to_end(system: System, workload: Workload, records: int) -> float:
    """Seconds from the first publish until every record was delivered (and acked)."""
    async with system.channel(workload.payload) as channel:
        counter = Counter(records)
        value = channel.encode(workload.payload.record())
        async with channel.consuming(counter.delivered, workload.calls):
            start = time.perf_counter()
            if workload.shape is Shape.BATCHES:
                await _batches(records, value, channel)
            elif workload.calls is Calls.RECORD:
                await _window_of_records(records, value, channel)
            else:
                await _window_of_batches(records, value, channel)
            await asyncio.wait_for(counter.done.wait(), 600)
            return time.perf_counter() - start


async def _open_loop(
    rate: int, seconds: float, send: Callable[[int], Coroutine[Any, Any, None]]
) -> None:
    """Start ``send(seq)`` on schedule; a slow answer never delays the next send."""
    total = int(rate * seconds)
    async with asyncio.TaskGroup() as group:
        start = time.perf_counter()
        for seq in range(total):
            delay = start + seq / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(send(seq))


async def latency(
    system: System, calls: Calls, payload: Payload, rate: int, seconds: float
) -> list[float]:
    """Publish-to-deliver times (ms) of one-record publishes at ``rate``: each sent with
    the per-record call or a batch call of one, each delivery acked likewise."""
    async with system.channel(payload) as channel:
        clock = Clock(int(rate * seconds), payload)

        async def send(seq: int) -> None:
            value = channel.encode(clock.stamp(seq))
            await (channel.send(value) if calls is Calls.RECORD else channel.send_batch([value]))

        async with channel.consuming(clock.delivered, calls):
            await _open_loop(rate, seconds, send)
            await asyncio.wait_for(clock.done.wait(), 120)
        return clock.latencies


@contextlib.asynccontextmanager
async def running(
    task: asyncio.Task[None], stop: Callable[[], Awaitable[None]]
) -> AsyncIterator[None]:
    """Yield while ``task`` consumes; then ``stop()`` it and wait for it to end."""
    try:
        yield
    finally:
        await stop()
        await task
