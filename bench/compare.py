"""Herald beside Redis Streams, NATS JetStream and RabbitMQ: one workload, one sitting.

One workload run against each system through its usual Python asyncio client — for
Herald, its own SDK (``herald.Producer`` and ``herald.Consumer`` with default settings
but the consumer's window) — doing the same work per record: each record built and
sent through the client, each delivery decoded by the client (a ``herald.Message``)
and acked through it. On this machine, in rounds that alternate the systems so that
the host's noise falls on all of them alike:

- end to end: one producer publishes N records of 1 KiB (4 concurrent batches of 500
  in flight), one consumer with 1,000 records outstanding acks every record;
- latency: one record per publish at a fixed rate, publish-to-deliver time.

Also the CPU time per record of the client (this process: producer and consumer) and
of the server process, in each phase. Herald's records are 1 KiB JSON strings (the
peers' are 1 KiB of bytes, which they carry as is; Herald would carry bytes base64'd).
The server's own capacity, with a client that costs nothing, is
``python -m bench.herald_bench``'s figure, not this one.

Durability as each is usually run: Herald acks=1 and acks=all; Redis with AOF fsync
every second, and with fsync before every answer (``always``, the peer of acks=all);
NATS JetStream file storage (its default periodic sync); RabbitMQ with a durable queue,
persistent messages and publisher confirms (fsynced before confirm).

Needs the servers (``apt-get install redis-server nats-server rabbitmq-server``) and
the clients (``pip install -e '.[bench]'``); a system whose server is missing is
skipped with a note. Run: ``python -m bench.compare [--records N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from bench import herald_bench
from bench.common import (
    cpu_seconds,
    free_port,
    herald_server,
    percentile,
    temp_dir,
    wait_for_port,
)

RECORD = b"x" * 1024
BATCH = 500
CONCURRENCY = 4
WINDOW = 1000


@dataclass(frozen=True, slots=True)
class Figures:
    e2e_rate: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    e2e_client_us: float  # CPU µs per record, end to end: this process
    e2e_server_us: float  # and the server's process
    lat_client_us: float  # the same at the fixed rate
    lat_server_us: float


class System(Protocol):
    name: str
    pid: int | None  # the server's process, for its CPU time

    async def end_to_end(self, records: int) -> float:
        """Seconds from the first publish to the last record delivered and acked."""
        ...

    async def latency(self, rate: int, seconds: float) -> list[float]:
        """Publish-to-deliver times (ms) of one-record publishes at ``rate``."""
        ...


# --- shared pieces ----------------------------------------------------------------


@contextlib.contextmanager
def server_process(
    what: str, cmd: list[str], port: int, env: dict[str, str] | None = None, limit: float = 30
) -> Iterator[int]:
    """Run a server in its own process group and temp dir until the block ends; yields
    its pid."""
    with temp_dir(f"bench-{what}-") as data, (data / "server.log").open("wb") as log:
        full = [part.replace("{data}", str(data)) for part in cmd]
        env = {k: v.replace("{data}", str(data)) for k, v in (env or {}).items()}
        proc = subprocess.Popen(
            full, env={**os.environ, **env}, stdout=log, stderr=log, start_new_session=True
        )
        try:
            wait_for_port(port, proc, what, limit)
            yield proc.pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def open_loop(
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

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent: dict[int, int] = {}
        self.latencies: list[float] = []
        self.done = asyncio.Event()

    def send(self, seq: int) -> bytes:
        self.sent[seq] = time.perf_counter_ns()
        return b"%d" % seq

    def delivered(self, payload: Any) -> None:
        self.latencies.append((time.perf_counter_ns() - self.sent[int(payload)]) / 1e6)
        if len(self.latencies) >= self.total:
            self.done.set()


async def batches_of(records: int, publish_batch: Callable[[int], Awaitable[None]]) -> None:
    """``records`` split in batches of BATCH, CONCURRENCY of them in flight."""
    queue = [min(BATCH, records - i) for i in range(0, records, BATCH)]

    async def worker() -> None:
        while queue:
            await publish_batch(queue.pop())

    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(worker())


async def timed_end_to_end(
    records: int, publish_batch: Callable[[int], Awaitable[None]], counter: Counter
) -> float:
    """Seconds from the first publish until ``counter`` has seen every record."""
    start = time.perf_counter()
    await batches_of(records, publish_batch)
    await asyncio.wait_for(counter.done.wait(), 600)
    return time.perf_counter() - start


async def timed_latencies(
    rate: int, seconds: float, send: Callable[[int], Coroutine[Any, Any, None]], clock: Clock
) -> list[float]:
    """Publish-to-deliver times of ``send`` on an open-loop schedule."""
    await open_loop(rate, seconds, send)
    await asyncio.wait_for(clock.done.wait(), 120)
    return clock.latencies


# --- Herald -----------------------------------------------------------------------

HERALD_RECORD = "x" * 1024  # a 1 KiB JSON value (a string)


class Herald:
    """Herald through its SDK, default settings but the consumer's window (WINDOW, as
    the peers' consumers have)."""

    def __init__(self, url: str, acks: str, pid: int | None) -> None:
        self.url, self.acks, self.pid = url, acks, pid
        self.name = f"Herald SDK acks={acks}"

    @contextlib.asynccontextmanager
    async def _subscription(self) -> AsyncIterator[tuple[Any, Any, str]]:
        from herald import Admin, Consumer, Producer

        topic, name = f"t-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
        async with Admin(self.url) as admin:
            await admin.create_topic(topic)
            await admin.create_subscription(name, topic, start="earliest")
            producer = Producer(self.url, acks=self.acks)
            consumer = Consumer(self.url, name, credit=WINDOW)
            try:
                yield producer, consumer, topic
            finally:
                await producer.close()
                await consumer.close()
                await admin.delete_subscription(name)
                await admin.delete_topic(topic)

    @staticmethod
    async def _consume(consumer: Any, on_record: Callable[[Any], None]) -> None:
        while batch := await consumer.take_batch(WINDOW):  # [] once closed
            for message in batch:
                on_record(message.value)
            await consumer.ack_many(batch)  # as the Redis adapter XACKs each batch

    async def end_to_end(self, records: int) -> float:
        async with self._subscription() as (producer, consumer, topic):
            counter = Counter(records)

            async def publish_batch(n: int) -> None:
                # One future for the batch, as Redis's adapter runs one pipeline (gather
                # over n send() futures costs the client about as much as the sends).
                await producer.send_many(topic, [HERALD_RECORD for _ in range(n)])

            reading = asyncio.create_task(self._consume(consumer, counter.delivered))
            try:
                return await timed_end_to_end(records, publish_batch, counter)
            finally:
                await consumer.close()
                await reading

    async def latency(self, rate: int, seconds: float) -> list[float]:
        async with self._subscription() as (producer, consumer, topic):
            clock = Clock(int(rate * seconds))

            async def send(seq: int) -> None:
                await producer.send(topic, clock.send(seq).decode())

            reading = asyncio.create_task(self._consume(consumer, clock.delivered))
            try:
                return await timed_latencies(rate, seconds, send, clock)
            finally:
                await consumer.close()
                await reading


# --- Redis Streams ----------------------------------------------------------------


class RedisStreams:
    def __init__(self, port: int, fsync: str, pid: int) -> None:
        self.port, self.pid = port, pid
        self.name = f"Redis Streams (AOF {fsync})"

    @contextlib.asynccontextmanager
    async def _stream(self) -> AsyncIterator[tuple[Any, Any, str]]:
        import redis.asyncio as redis

        # The consumer has a connection of its own, as a separate process would.
        # redis-py 8 caps a pool at 100 connections and raises past them (redis-py 5 had
        # no cap, and a busy host then made thousands of connections time out): sends
        # beyond 100 out wait for a connection instead.
        pool = redis.BlockingConnectionPool(port=self.port, max_connections=100, timeout=None)
        producer = redis.Redis(connection_pool=pool)
        consumer = redis.Redis(port=self.port)
        stream = f"s-{uuid.uuid4().hex[:8]}"
        await producer.xgroup_create(stream, "g", id="$", mkstream=True)
        try:
            yield producer, consumer, stream
        finally:
            await producer.delete(stream)
            await producer.aclose()
            await pool.disconnect()  # a pool it was given is not the client's to close
            await consumer.aclose()

    @staticmethod
    async def _consume(
        client: Any, stream: str, on_record: Callable[[bytes], None], done: asyncio.Event
    ) -> None:
        # Short blocks instead of cancelling a blocked XREADGROUP, which redis-py can
        # leave hanging.
        while not done.is_set():
            answer = await client.xreadgroup("g", "c", {stream: ">"}, count=WINDOW, block=50)
            for _, entries in answer or ():
                for _, fields in entries:
                    on_record(fields[b"v"])
                await client.xack(stream, "g", *(entry_id for entry_id, _ in entries))

    async def end_to_end(self, records: int) -> float:
        async with self._stream() as (producer, consumer, stream):
            counter = Counter(records)

            async def publish_batch(n: int) -> None:
                async with producer.pipeline(transaction=False) as pipe:
                    for _ in range(n):
                        pipe.xadd(stream, {"v": RECORD})
                    await pipe.execute()

            reading = asyncio.create_task(
                self._consume(consumer, stream, counter.delivered, counter.done)
            )
            try:
                return await timed_end_to_end(records, publish_batch, counter)
            finally:
                counter.done.set()
                await reading

    async def latency(self, rate: int, seconds: float) -> list[float]:
        async with self._stream() as (producer, consumer, stream):
            clock = Clock(int(rate * seconds))

            async def send(seq: int) -> None:
                await producer.xadd(stream, {"v": clock.send(seq)})

            reading = asyncio.create_task(
                self._consume(consumer, stream, clock.delivered, clock.done)
            )
            try:
                return await timed_latencies(rate, seconds, send, clock)
            finally:
                clock.done.set()
                await reading


@contextlib.contextmanager
def redis_server(fsync: str) -> Iterator[RedisStreams]:
    """``fsync``: everysec (what acks=1 promises, and more) or always (acks=all)."""
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", "{data}"]
    cmd += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
    with server_process("redis", cmd, port) as pid:
        yield RedisStreams(port, fsync, pid)


# --- NATS JetStream ---------------------------------------------------------------


class JetStream:
    name = "NATS JetStream (file)"

    def __init__(self, port: int, pid: int) -> None:
        self.port, self.pid = port, pid

    @contextlib.asynccontextmanager
    async def _stream(self) -> AsyncIterator[tuple[Any, str]]:
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream()
        name = f"s{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=name, subjects=[name])
        try:
            yield js, name
        finally:
            await js.delete_stream(name)
            await nc.close()

    async def _consume(self, js: Any, subject: str, on_record: Callable[[bytes], None]) -> Any:
        from nats.js.api import ConsumerConfig

        async def handle(msg: Any) -> None:
            on_record(msg.data)
            await msg.ack()

        config = ConsumerConfig(max_ack_pending=WINDOW)
        return await js.subscribe(
            subject, durable="c", cb=handle, manual_ack=True, config=config, pending_msgs_limit=-1
        )

    async def end_to_end(self, records: int) -> float:
        async with self._stream() as (js, subject):
            counter = Counter(records)

            async def publish_batch(n: int) -> None:
                acks = [await js.publish_async(subject, RECORD) for _ in range(n)]
                await asyncio.gather(*acks)

            sub = await self._consume(js, subject, counter.delivered)
            try:
                return await timed_end_to_end(records, publish_batch, counter)
            finally:
                await sub.unsubscribe()

    async def latency(self, rate: int, seconds: float) -> list[float]:
        async with self._stream() as (js, subject):
            clock = Clock(int(rate * seconds))

            async def send(seq: int) -> None:
                await js.publish(subject, clock.send(seq))

            sub = await self._consume(js, subject, clock.delivered)
            try:
                return await timed_latencies(rate, seconds, send, clock)
            finally:
                await sub.unsubscribe()


@contextlib.contextmanager
def nats_server() -> Iterator[JetStream]:
    port = free_port()
    cmd = ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", "{data}"]
    with server_process("nats", cmd, port) as pid:
        yield JetStream(port, pid)


# --- RabbitMQ ---------------------------------------------------------------------


class RabbitMQ:
    name = "RabbitMQ (durable, confirms)"

    def __init__(self, port: int, pid: int) -> None:
        self.port, self.pid = port, pid  # the script's pid: its Erlang VM is a child

    @contextlib.asynccontextmanager
    async def _queue(self) -> AsyncIterator[tuple[Any, Any, str]]:
        import aio_pika

        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.port}/")
        publish = await connection.channel(publisher_confirms=True)
        consume = await connection.channel()
        await consume.set_qos(prefetch_count=WINDOW)
        name = f"q-{uuid.uuid4().hex[:8]}"
        queue = await consume.declare_queue(name, durable=True)
        try:
            yield publish, queue, name
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await connection.close()

    @staticmethod
    def _message(body: bytes) -> Any:
        import aio_pika

        return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    @staticmethod
    async def _consume(queue: Any, on_record: Callable[[bytes], None]) -> str:
        async def handle(message: Any) -> None:
            on_record(message.body)
            await message.ack()

        tag: str = await queue.consume(handle)
        return tag

    async def end_to_end(self, records: int) -> float:
        async with self._queue() as (channel, queue, name):
            counter = Counter(records)

            async def publish_batch(n: int) -> None:
                exchange = channel.default_exchange
                await asyncio.gather(
                    *(exchange.publish(self._message(RECORD), routing_key=name) for _ in range(n))
                )

            tag = await self._consume(queue, counter.delivered)
            try:
                return await timed_end_to_end(records, publish_batch, counter)
            finally:
                await queue.cancel(tag)

    async def latency(self, rate: int, seconds: float) -> list[float]:
        async with self._queue() as (channel, queue, name):
            clock = Clock(int(rate * seconds))

            async def send(seq: int) -> None:
                await channel.default_exchange.publish(
                    self._message(clock.send(seq)), routing_key=name
                )

            tag = await self._consume(queue, clock.delivered)
            try:
                return await timed_latencies(rate, seconds, send, clock)
            finally:
                await queue.cancel(tag)


@contextlib.contextmanager
def rabbitmq_server() -> Iterator[RabbitMQ]:
    port = free_port()
    env = {
        "HOME": "{data}",  # its Erlang cookie
        "RABBITMQ_NODENAME": f"bench{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": "{data}/mnesia",
        "RABBITMQ_LOG_BASE": "{data}/log",
        "RABBITMQ_ENABLED_PLUGINS_FILE": "{data}/enabled_plugins",
        "RABBITMQ_CONFIG_FILE": "{data}/rabbitmq",
    }
    # Debian's /usr/sbin wrapper switches to the rabbitmq user; the real script does not.
    script = "/usr/lib/rabbitmq/bin/rabbitmq-server"
    with server_process("rabbitmq", [script], port, env, limit=90) as pid:
        yield RabbitMQ(port, pid)


# --- the run ----------------------------------------------------------------------

SERVERS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[System]]]] = {
    "redis": ("redis-server", functools.partial(redis_server, "everysec")),
    "redis-always": ("redis-server", functools.partial(redis_server, "always")),
    "nats": ("nats-server", nats_server),
    "rabbitmq": ("/usr/lib/rabbitmq/bin/rabbitmq-server", rabbitmq_server),
}


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of a process and every descendant alive (RabbitMQ's start script runs
    its Erlang VM as a child)."""
    if pid is None:
        return None
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += cpu_seconds(current) or 0.0
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack.extend(int(child) for child in children.read().split())
    return total


class CpuMeter:
    """CPU seconds of this process and of the server's (with its children) over a phase."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.client = time.process_time()
        self.server = tree_cpu_seconds(pid)

    def per_record_us(self, records: int) -> tuple[float, float]:
        client = time.process_time() - self.client
        now = tree_cpu_seconds(self.pid)
        server = now - self.server if now is not None and self.server is not None else 0.0
        return client / records * 1e6, server / records * 1e6


async def measure(system: System, records: int, rate: int, seconds: float) -> Figures:
    meter = CpuMeter(system.pid)
    elapsed = await system.end_to_end(records)
    e2e_client, e2e_server = meter.per_record_us(records)
    meter = CpuMeter(system.pid)
    ordered = sorted(await system.latency(rate, seconds))
    lat_client, lat_server = meter.per_record_us(len(ordered))
    return Figures(
        records / elapsed,
        percentile(ordered, 0.50),
        percentile(ordered, 0.99),
        percentile(ordered, 0.999),
        e2e_client,
        e2e_server,
        lat_client,
        lat_server,
    )


async def one_round(
    systems: list[System], records: int, rate: int, seconds: float
) -> dict[str, Figures]:
    figures = {}
    for system in systems:
        print(f"  {system.name} ...", file=sys.stderr, flush=True)
        figures[system.name] = await measure(system, records, rate, seconds)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per e2e run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; figures are medians")
    parser.add_argument("--rate", type=int, default=2000, help="msg/s of the latency run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency run")
    parser.add_argument("--systems", nargs="*", choices=sorted(SERVERS), default=sorted(SERVERS))
    args = parser.parse_args()
    # Killed (timeout, CI), still stop the servers started below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    runner = getattr(__import__("uvloop"), "run", asyncio.run)

    with contextlib.ExitStack() as stack:
        url, pid = stack.enter_context(herald_server())
        systems: list[System] = [Herald(url, "1", pid), Herald(url, "all", pid)]
        for name in args.systems:
            binary, start = SERVERS[name]
            if shutil.which(binary) is None:
                print(f"{name}: {binary} not installed, skipped", file=sys.stderr)
                continue
            systems.append(stack.enter_context(start()))
        host_start = herald_bench.HostSample.take(None)
        rounds = []
        for number in range(args.rounds):
            print(f"round {number + 1}/{args.rounds}", file=sys.stderr, flush=True)
            # Rotate the order so no system always runs first (warm caches, quiet host).
            shift = number % len(systems)
            rotated = systems[shift:] + systems[:shift]
            rounds.append(runner(one_round(rotated, args.records, args.rate, args.seconds)))
        host_end = herald_bench.HostSample.take(None)

    print(
        f"{args.records} x 1 KiB records end to end ({CONCURRENCY} concurrent batches of "
        f"{BATCH}, consumer window {WINDOW} acking every record); latency at {args.rate} msg/s, "
        f"one record per publish, {args.seconds:g} s; medians of {args.rounds} rounds"
    )
    print("CPU µs per record: client = this process (producer and consumer), server = its process")
    print(
        f"{'system':<30} {'e2e msg/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'p999 ms':>8} "
        f"{'bulk cli':>8} {'bulk srv':>8} {'2k cli':>7} {'2k srv':>7}"
    )
    for system in systems:
        runs = [r[system.name] for r in rounds]

        def med(field: str, runs: list[Figures] = runs) -> float:
            return statistics.median(getattr(r, field) for r in runs)

        print(
            f"{system.name:<30} {med('e2e_rate'):>10,.0f} {med('p50_ms'):>7.2f} "
            f"{med('p99_ms'):>7.2f} {med('p999_ms'):>8.2f} {med('e2e_client_us'):>8.1f} "
            f"{med('e2e_server_us'):>8.1f} {med('lat_client_us'):>7.1f} {med('lat_server_us'):>7.1f}"
        )
    if host_start is not None and host_end is not None and host_end.total > host_start.total:
        steal = (host_end.steal - host_start.steal) / (host_end.total - host_start.total)
        print(f"host: steal {steal:.1%} of CPU time during the run (taken by the hypervisor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
