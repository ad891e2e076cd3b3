"""The SDK given several node URLs (PROTOCOL §7: any node of a cluster serves every
route): Consumer, Admin, Puller, Tail and the CLI go on at the next node when one cannot
be reached or drops them, and a Consumer resumes after its node stops — records in
flight redelivered, nothing acked redelivered, nothing handed over twice.

Real single-node servers on loopback stand in for a cluster's nodes here; the
cluster's own failover is tested in tests/cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from herald import Admin, Consumer, HeraldConnectionError, Message, Producer, Puller, Tail
from tests.client.test_cli import herald, lines
from tests.conftest import HeraldProcess, free_port
from tests.helpers import wait_until

SERVICE_RESTART = 1012  # PROTOCOL §7 / RFC 6455: a coordinator died


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


async def take(consumer: Consumer, count: int, within: float = 30.0) -> list[Message]:
    messages: list[Message] = []
    async with asyncio.timeout(within):
        async for message in consumer:
            messages.append(message)
            if len(messages) == count:
                break
    return messages


async def publish(url: str, topic: str, values: list[object]) -> None:
    async with Producer(url) as producer:
        await asyncio.gather(*(producer.send(topic, value) for value in values))


async def acked_total(url: str, name: str) -> int:
    async with Admin(url) as admin:
        return int((await admin.get_subscription(name))["stats"]["acked_total"])


def acked(url: str, name: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        return await acked_total(url, name) == count

    return condition


async def test_consumer_given_a_dead_and_a_live_url_consumes_from_the_live_one(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("nu"), unique("nus")
    live = shared_herald.url
    async with Admin([dead_url(), live]) as admin:
        await admin.create_subscription(name, topic, start="earliest")
    await publish(live, topic, [1, 2, 3])
    async with Consumer([dead_url(), live], name, credit=10, max_backoff=0.2) as consumer:
        got = await take(consumer, 3)
        for message in got:
            await message.ack()
        assert [m.value for m in got] == [1, 2, 3]
        assert consumer.url == live and consumer.connections == 1
    assert await acked_total(live, name) == 3


async def test_consumer_never_connected_fails_after_trying_every_url() -> None:
    consumer = Consumer([dead_url(), dead_url()], "s", max_backoff=0.2)
    try:
        with pytest.raises(HeraldConnectionError):
            await asyncio.wait_for(take(consumer, 1), 20)
        assert consumer.connections == 0
    finally:
        await consumer.close()


@contextlib.asynccontextmanager
async def node_restarting_consumers() -> AsyncIterator[str]:
    """A real WebSocket endpoint that does what a Herald node does when a subscription's
    coordinator dies (PROTOCOL §7): it says `ready`, then closes with 1012."""

    async def handler(ws: ServerConnection) -> None:
        ready = {"type": "ready", "subscription": "s", "consumer": "c-1", "credit": 0}
        await ws.send(orjson.dumps(ready).decode())
        await ws.close(SERVICE_RESTART, "service restart")

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


async def test_consumer_closed_with_service_restart_reconnects_to_the_next_node(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("nr"), unique("nrs")
    async with Admin(shared_herald.url) as admin:
        await admin.create_subscription(name, topic, start="earliest")
    await publish(shared_herald.url, topic, ["a", "b"])
    async with node_restarting_consumers() as restarting:
        consumer = Consumer([restarting, shared_herald.url], name, credit=10, max_backoff=0.2)
        async with consumer:
            got = await take(consumer, 2)
            for message in got:
                await message.ack()
            assert [m.value for m in got] == ["a", "b"]
            assert consumer.url == shared_herald.url
            assert consumer.connections == 2  # the 1012 one, then the live node


async def test_consumer_never_ready_keeps_coming_back_while_told_service_restart() -> None:
    # A node that accepts the socket and closes it with 1012 before `ready` (its
    # subscription's coordinator is moving) asks the consumer to come back: unlike an
    # unreachable URL, that is retried even before a first connection.
    attempts: list[int] = []

    async def handler(ws: ServerConnection) -> None:
        attempts.append(1)
        await ws.close(SERVICE_RESTART, "the subscription's coordinator is unreachable")

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        consumer = Consumer(f"http://127.0.0.1:{port}", "s", min_backoff=0.01, max_backoff=0.05)
        reader = asyncio.ensure_future(take(consumer, 1, within=60))
        try:
            await wait_until(lambda: len(attempts) >= 4 or reader.done(), what="4 attempts")
            assert not reader.done(), reader
            assert consumer.connections == 0
        finally:
            await consumer.close()
            await asyncio.wait((reader,))


async def test_consumer_whose_node_stops_goes_on_at_the_next_node(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    # Two single nodes with the same subscription: once the first shuts down (SIGTERM
    # closes its consumers with 1001), the consumer carries on from the second.
    first, second = herald_factory(), herald_factory()
    topic, name = unique("ns"), unique("nss")
    for node in (first, second):
        async with Admin(node.url) as admin:
            await admin.create_subscription(name, topic, start="earliest")
    await publish(first.url, topic, ["first"])
    await publish(second.url, topic, ["second"])
    async with Consumer([first.url, second.url], name, credit=10, max_backoff=0.2) as consumer:
        [one] = await take(consumer, 1)
        assert one.value == "first" and consumer.url == first.url
        await one.ack()
        await wait_until(acked(first.url, name, 1), what="the ack applied")
        await asyncio.to_thread(first.terminate)
        [two] = await take(consumer, 1)
        assert two.value == "second" and consumer.url == second.url
        await two.ack()
    await wait_until(acked(second.url, name, 1), what="the ack applied")


@pytest.mark.parametrize("stop", ["sigterm", "kill"])
async def test_consumer_resumes_after_its_node_restarts_without_losing_or_repeating(
    herald_server: HeraldProcess,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    stop: str,
) -> None:
    topic, name = unique("rr"), unique("rrs")
    node = herald_server.url
    async with Admin(node) as admin:
        await admin.create_subscription(name, topic, start="earliest")
    await publish(node, topic, list(range(10)))
    urls = [dead_url(), node]  # the consumer's list: a dead node first, on every reconnect
    consumer = Consumer(urls, name, credit=10, max_backoff=0.5)
    try:
        taken = await take(consumer, 6)
        for message in taken[:4]:
            await message.ack()
        await wait_until(acked(node, name, 4), what="four acks applied")
        held = taken[4:]  # taken, not acked: in flight at the stop, like 6..9 (unread)
        if stop == "kill":
            await asyncio.sleep(1.2)  # PROTOCOL §3: acks older than 1 s survive kill -9
            await asyncio.to_thread(herald_server.kill)
        else:
            await asyncio.to_thread(herald_server.terminate)  # consumers closed with 1001
        await asyncio.to_thread(herald_server.restart)  # same port and data dir
        await publish(node, topic, ["after"])
        seen: list[Message] = []
        async with asyncio.timeout(60):
            async for message in consumer:
                seen.append(message)
                await message.ack()
                if {m.offset for m in seen} >= set(range(4, 11)):
                    break
        # Redelivered: everything in flight at the stop, taken or not; never an acked
        # record, and each record once.
        offsets = [m.offset for m in seen]
        assert sorted(offsets) == list(range(4, 11)), offsets
        assert consumer.connections >= 2
        if stop == "sigterm":  # attempt counts survive a graceful restart (PROTOCOL §3)
            assert all(m.attempt >= 2 for m in seen if m.offset < 10)
        # A nack of a record of the lost connection names a record the server already
        # gave back: it is dropped, not sent to take the record from its new holder.
        with caplog.at_level(logging.DEBUG, logger="herald.consumer"):
            await held[0].nack(delay_ms=0)
        assert "nack of a lost connection's record dropped" in caplog.text

        async def all_acked() -> bool:
            async with Admin(node) as admin:
                stats = (await admin.get_subscription(name))["stats"]
            return bool(stats["backlog"] == 0 and stats["in_flight"] == 0)

        await wait_until(all_acked, within=30, what="every record acked")
    finally:
        await consumer.close()


async def test_admin_and_puller_go_on_at_the_next_node(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("np"), unique("nps")
    urls = [dead_url(), shared_herald.url]
    async with Admin(urls) as admin:
        await admin.create_subscription(name, topic, start="earliest")
        await publish(shared_herald.url, topic, ["x", "y"])
        async with Puller(urls, name, wait_ms=5000, limit=2) as puller:
            pulled = [message async for message in puller]
            for message in pulled:
                await message.ack()
        assert [m.value for m in pulled] == ["x", "y"]
        stats = (await admin.get_subscription(name))["stats"]
        assert stats["acked_total"] == 2
    async with Admin([dead_url(), dead_url()]) as admin:
        with pytest.raises(HeraldConnectionError):
            await asyncio.wait_for(admin.list_topics(), 20)


async def test_tail_opens_at_the_first_node_it_can_reach(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("nt")
    await publish(shared_herald.url, topic, ["t"])
    async with Tail([dead_url(), shared_herald.url], topic, start="earliest", limit=1) as tail:
        got = [message async for message in tail]
    assert [m.value for m in got] == ["t"]
    with pytest.raises(HeraldConnectionError):
        async with Tail([dead_url(), dead_url()], topic):
            pass


def test_cli_takes_a_cluster_as_repeated_or_comma_separated_urls(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("nc"), unique("ncs")
    urls = f"{dead_url()},{shared_herald.url}"
    created = herald("subscriptions", "create", name, "--topic", topic, "--start", "earliest",
                     url=urls)  # fmt: skip
    assert created.returncode == 0, created.stderr
    published = herald("publish", topic, "1", "2", "--url", dead_url(), url=shared_herald.url)
    assert published.returncode == 0, published.stderr
    consumed = herald("consume", name, "--count", "2", url=urls)
    assert consumed.returncode == 0, consumed.stderr
    assert [m["value"] for m in lines(consumed.stdout)] == [1, 2]
    down = herald("topics", "list", url=f"{dead_url()},{dead_url()}")
    assert down.returncode == 1 and "cannot reach" in down.stderr
