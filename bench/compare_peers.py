"""The peers in bench/compare.py: Redis Streams, NATS JetStream and RabbitMQ, each through
its usual asyncio client, each server started on a free loopback port in a temp dir.

Each adapter spells the modes' calls in its client's words:

| | per-record publish | batch publish | per-record ack | batch ack |
|---|---|---|---|---|
| Redis (redis-py) | ``XADD`` | a pipeline of ``XADD`` | ``XACK`` of one id | one ``XACK`` of a read's ids |
| NATS (nats-py) | ``js.publish`` | ``publish_async`` each, then ``gather`` | ``msg.ack()`` | (none: ``msg.ack()``) |
| RabbitMQ (aio-pika) | ``publish`` with confirms | ``gather`` over ``publish`` (none) | ``message.ack()`` | (none: ``message.ack()``) |

Durability as each is usually run: Redis with AOF fsync every second, and with fsync
before every answer (``always``, the peer of acks=all); NATS JetStream file storage (its
default periodic sync); RabbitMQ with a durable queue, persistent messages and publisher
confirms (fsynced before confirm).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from bench.common import free_port, temp_dir, wait_for_port
from bench.compare_workload import WINDOW, Calls, Payload, System, running


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


# --- Redis Streams ----------------------------------------------------------------


class RedisChannel:
    def __init__(self, producer: Any, consumer: Any, stream: str) -> None:
        self.producer, self.consumer, self.stream = producer, consumer, stream

    def encode(self, record: bytes) -> Any:
        return record

    def send(self, value: Any) -> Awaitable[Any]:
        return self.producer.xadd(self.stream, {"v": value})  # type: ignore[no-any-return]

    async def send_batch(self, values: list[Any]) -> None:
        async with self.producer.pipeline(transaction=False) as pipe:
            for value in values:
                pipe.xadd(self.stream, {"v": value})
            await pipe.execute()

    def consuming(
        self, on_record: Callable[[Any], None], calls: Calls
    ) -> contextlib.AbstractAsyncContextManager[None]:
        stop = asyncio.Event()

        async def stopped() -> None:
            stop.set()

        return running(asyncio.create_task(self._consume(on_record, calls, stop)), stopped)

    async def _consume(
        self, on_record: Callable[[Any], None], calls: Calls, stop: asyncio.Event
    ) -> None:
        client, stream = self.consumer, self.stream
        # Short blocks instead of cancelling a blocked XREADGROUP, which redis-py can
        # leave hanging.
        while not stop.is_set():
            answer = await client.xreadgroup("g", "c", {stream: ">"}, count=WINDOW, block=50)
            for _, entries in answer or ():
                for entry_id, fields in entries:
                    on_record(fields[b"v"])
                    if calls is Calls.RECORD:
                        await client.xack(stream, "g", entry_id)
                if calls is Calls.BATCH:
                    await client.xack(stream, "g", *(entry_id for entry_id, _ in entries))


class RedisStreams:
    def __init__(self, port: int, fsync: str, pid: int) -> None:
        self.port, self.pid = port, pid
        self.name = f"Redis Streams (AOF {fsync})"

    @contextlib.asynccontextmanager
    async def channel(self, payload: Payload) -> AsyncIterator[RedisChannel]:
        import redis.asyncio as redis

        # The consumer has a connection of its own, as a separate process would.
        # redis-py 8 caps a pool at 100 connections and raises past them (redis-py 5 had
        # no cap, and a busy host then made thousands of connections time out): sends
        # beyond 100 out wait for a connection instead.
        # A busy host takes seconds to accept 100 connections at once: redis-py's
        # connect timeout must not end the run.
        pool = redis.BlockingConnectionPool(
            port=self.port, max_connections=100, timeout=None, socket_connect_timeout=60
        )
        producer = redis.Redis(connection_pool=pool)
        consumer = redis.Redis(port=self.port)
        stream = f"s-{uuid.uuid4().hex[:8]}"
        await producer.xgroup_create(stream, "g", id="$", mkstream=True)
        try:
            yield RedisChannel(producer, consumer, stream)
        finally:
            await producer.delete(stream)
            await producer.aclose()
            await pool.disconnect()  # a pool it was given is not the client's to close
            await consumer.aclose()


@contextlib.contextmanager
def redis_server(fsync: str) -> Iterator[RedisStreams]:
    """``fsync``: everysec (what acks=1 promises, and more) or always (acks=all)."""
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", "{data}"]
    cmd += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
    with server_process("redis", cmd, port) as pid:
        yield RedisStreams(port, fsync, pid)


# --- NATS JetStream ---------------------------------------------------------------


class NatsChannel:
    def __init__(self, js: Any, subject: str) -> None:
        self.js, self.subject = js, subject

    def encode(self, record: bytes) -> Any:
        return record

    def send(self, value: Any) -> Awaitable[Any]:
        return self.js.publish(self.subject, value)  # type: ignore[no-any-return]

    async def send_batch(self, values: list[Any]) -> None:
        acks = [await self.js.publish_async(self.subject, value) for value in values]
        await asyncio.gather(*acks)

    @contextlib.asynccontextmanager
    async def consuming(
        self, on_record: Callable[[Any], None], calls: Calls
    ) -> AsyncIterator[None]:
        from nats.js.api import ConsumerConfig

        async def handle(msg: Any) -> None:
            on_record(msg.data)
            await msg.ack()  # nats-py has no batch ack: both modes ack each

        config = ConsumerConfig(max_ack_pending=WINDOW)
        sub = await self.js.subscribe(
            self.subject,
            durable="c",
            cb=handle,
            manual_ack=True,
            config=config,
            pending_msgs_limit=-1,
        )
        try:
            yield
        finally:
            await sub.unsubscribe()


class JetStream:
    name = "NATS JetStream (file)"

    def __init__(self, port: int, pid: int) -> None:
        self.port, self.pid = port, pid

    @contextlib.asynccontextmanager
    async def channel(self, payload: Payload) -> AsyncIterator[NatsChannel]:
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream()
        name = f"s{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=name, subjects=[name])
        try:
            yield NatsChannel(js, name)
        finally:
            await js.delete_stream(name)
            await nc.close()


@contextlib.contextmanager
def nats_server() -> Iterator[JetStream]:
    port = free_port()
    cmd = ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", "{data}"]
    with server_process("nats", cmd, port) as pid:
        yield JetStream(port, pid)


# --- RabbitMQ ---------------------------------------------------------------------


class RabbitChannel:
    def __init__(self, channel: Any, queue: Any, name: str) -> None:
        self.channel, self.queue, self.name = channel, queue, name

    def encode(self, record: bytes) -> Any:
        return record

    def send(self, value: Any) -> Awaitable[Any]:
        import aio_pika

        message = aio_pika.Message(value, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        return self.channel.default_exchange.publish(message, routing_key=self.name)  # type: ignore[no-any-return]

    async def send_batch(self, values: list[Any]) -> None:
        await asyncio.gather(*(self.send(value) for value in values))  # aio-pika has no batch

    @contextlib.asynccontextmanager
    async def consuming(
        self, on_record: Callable[[Any], None], calls: Calls
    ) -> AsyncIterator[None]:
        async def handle(message: Any) -> None:
            on_record(message.body)
            await message.ack()  # both modes: see the module's table

        tag = await self.queue.consume(handle)
        try:
            yield
        finally:
            await self.queue.cancel(tag)


class RabbitMQ:
    name = "RabbitMQ (durable, confirms)"

    def __init__(self, port: int, pid: int) -> None:
        self.port, self.pid = port, pid  # the script's pid: its Erlang VM is a child

    @contextlib.asynccontextmanager
    async def channel(self, payload: Payload) -> AsyncIterator[RabbitChannel]:
        import aio_pika

        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.port}/")
        publish = await connection.channel(publisher_confirms=True)
        consume = await connection.channel()
        await consume.set_qos(prefetch_count=WINDOW)
        name = f"q-{uuid.uuid4().hex[:8]}"
        queue = await consume.declare_queue(name, durable=True)
        try:
            yield RabbitChannel(publish, queue, name)
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await connection.close()


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


# name -> (the server's binary, what starts it)
SERVERS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[System]]]] = {
    "redis": ("redis-server", functools.partial(redis_server, "everysec")),
    "redis-always": ("redis-server", functools.partial(redis_server, "always")),
    "nats": ("nats-server", nats_server),
    "rabbitmq": ("/usr/lib/rabbitmq/bin/rabbitmq-server", rabbitmq_server),
}
