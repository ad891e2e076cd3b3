"""The Python SDK (herald, built from client/) against a real server: producer, consumer, admin."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from herald import (
    Admin,
    Consumer,
    ConsumerClosedError,
    HeraldClientError,
    HeraldConnectionError,
    Message,
    Producer,
    ProducerBufferFullError,
)
from tests.conftest import HeraldProcess, free_port
from tests.helpers import wait_until


async def take(consumer: Consumer, count: int, within: float = 15.0) -> list[Message]:
    messages: list[Message] = []
    async with asyncio.timeout(within):
        async for message in consumer:
            messages.append(message)
            if len(messages) == count:
                break
    return messages


async def test_producer_batches_concurrent_sends_and_consumer_acks(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sdk"), unique("sdks")
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=1)
        await admin.create_subscription(name, topic, start="earliest")
        async with Producer(shared_herald.url, linger_ms=20) as producer:
            results = await asyncio.gather(
                *(
                    producer.send(topic, {"n": i}, key="k", headers={"h": str(i)})
                    for i in range(50)
                ),
                producer.send(topic, b"\x00raw", id="raw-1"),
                producer.send(topic, b"\x00raw", id="raw-1"),
            )
        assert all(r is not None for r in results)
        offsets = [r.offset for r in results[:51] if r is not None]
        assert sorted(offsets) == list(range(51))
        duplicate = results[51]
        assert (
            duplicate is not None and duplicate.duplicate and duplicate.offset == results[50].offset
        )  # type: ignore[union-attr]

        async with Consumer(shared_herald.url, name, credit=8, ack_interval_ms=5) as consumer:
            messages = await take(consumer, 51)
            for message in messages:
                await message.ack()
        assert [m.value for m in messages[:50]] == [{"n": i} for i in range(50)]
        assert messages[0].headers == {"h": "0"} and messages[0].key == "k"
        assert messages[50].is_bytes and messages[50].value == b"\x00raw"

        # The acks left before the close frame, so the server has applied them.
        stats = (await admin.get_subscription(name))["stats"]
        assert stats["backlog"] == 0
        assert stats["acked_total"] == 51 and stats["in_flight"] == 0


async def publish_requests(url: str) -> int:
    """How many publish requests the server has answered (its /metrics)."""
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    match = re.search(r"^herald_publish_duration_seconds_count (\S+)$", text, re.M)
    assert match is not None
    return int(float(match.group(1)))


async def test_lone_sends_go_at_once_and_sends_gather_while_requests_are_out(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, url = unique("sdkb"), shared_herald.url
    async with Producer(url, max_in_flight=1) as producer:
        await producer.send(topic, "creates the topic")
        before = await publish_requests(url)
        for n in range(3):  # one after another: each its own request, no timer to wait for
            await asyncio.wait_for(producer.send(topic, n), 5)
        assert await publish_requests(url) == before + 3

        # One request out (max_in_flight=1); sends made meanwhile, one per loop turn,
        # gather and go together when it is answered. Without the cap each would go
        # alone (10 requests); with it, one or two (three if the host stalls us).
        first = asyncio.ensure_future(producer.send(topic, "first"))
        await asyncio.sleep(0)  # its dispatch runs after this turn
        await asyncio.sleep(0)
        rest = []
        for n in range(10):
            rest.append(asyncio.ensure_future(producer.send(topic, n)))
            await asyncio.sleep(0)
        results = await asyncio.gather(first, *rest)
        assert before + 3 + 2 <= await publish_requests(url) <= before + 3 + 1 + 3
        offsets = [r.offset for r in results if r is not None]
        assert offsets == sorted(offsets) and len(set(offsets)) == 11


async def test_take_batch_takes_what_has_arrived_in_order_and_keeps_credit_flowing(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sdkb"), unique("sdkbs")
    async with Admin(shared_herald.url) as admin, Producer(shared_herald.url) as producer:
        await admin.create_topic(topic, partitions=1)
        await admin.create_subscription(name, topic, start="earliest")
        await asyncio.gather(*(producer.send(topic, {"n": i}) for i in range(30)))
    # Uncompressed frames, a window of 10: 30 records need credit given back twice.
    async with Consumer(shared_herald.url, name, credit=10, compression=None) as consumer:
        taken: list[Message] = []
        async with asyncio.timeout(15):
            while len(taken) < 30:
                batch = await consumer.take_batch(4)
                assert 1 <= len(batch) <= 4
                taken.extend(batch)
        for message in taken:
            await message.ack()
    assert [m.value for m in taken] == [{"n": i} for i in range(30)]
    assert await consumer.take_batch(4) == []  # closed


async def test_unacked_messages_come_back_to_the_next_consumer(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sdkr"), unique("sdkrs")
    async with Admin(shared_herald.url) as admin, Producer(shared_herald.url) as producer:
        await admin.create_subscription(name, topic, start="earliest", ack_deadline_ms=600_000)
        await producer.send(topic, "once")
    async with Consumer(shared_herald.url, name, credit=1) as consumer:
        [first] = await take(consumer, 1)  # not acked
    async with Consumer(shared_herald.url, name, credit=1) as consumer:
        [again] = await take(consumer, 1)
        await again.ack()
    assert (again.id, again.attempt) == (first.id, 2)


async def test_problem_json_is_raised_as_a_typed_error(shared_herald: HeraldProcess) -> None:
    async with Producer(shared_herald.url) as producer:
        with pytest.raises(HeraldClientError) as caught:
            await producer.send("bad name!", 1)
    assert caught.value.status == 400 and caught.value.code == "invalid_name"
    async with Admin(shared_herald.url) as admin:
        with pytest.raises(HeraldClientError) as missing:
            await admin.get_subscription("no-such-subscription-here")
    assert (missing.value.status, missing.value.code) == (404, "subscription_not_found")


async def test_one_bad_record_fails_only_its_own_send(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("sdkb")
    async with Producer(shared_herald.url, linger_ms=50) as producer:
        good, bad = await asyncio.gather(
            producer.send(topic, "fine"),
            producer.send(topic, "x", partition=99),
            return_exceptions=True,
        )
    assert not isinstance(good, BaseException) and good is not None and good.offset == 0
    assert isinstance(bad, HeraldClientError) and bad.status in (400, 404)


async def test_admin_manages_topics_and_subscriptions(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("adm"), unique("adms")
    async with Admin(shared_herald.url) as admin, Producer(shared_herald.url) as producer:
        created = await admin.create_topic(topic, partitions=2, retention_ms=None)
        assert created["config"]["partitions"] == 2 and created["config"]["retention_ms"] is None
        assert topic in [t["name"] for t in await admin.list_topics()]
        await producer.send(topic, "a", partition=1)
        await producer.send(topic, "b", partition=1)
        page = await admin.read_messages(topic, 1, offset=1)
        assert [m["value"] for m in page["messages"]] == ["b"] and page["next_offset"] == 2
        assert (await admin.get_topic(topic))["partitions"][1]["end_offset"] == 2

        sub = await admin.create_subscription(name, topic, max_deliveries=3)
        assert sub["config"]["max_deliveries"] == 3
        assert name in [s["name"] for s in await admin.list_subscriptions()]
        seeked = await admin.seek(name, offsets={1: 1})
        assert seeked["name"] == name
        await admin.seek(name, to="earliest")
        async with Consumer(shared_herald.url, name, credit=2) as consumer:
            assert sorted(m.value for m in await take(consumer, 2)) == ["a", "b"]
        await admin.delete_subscription(name)
        await admin.delete_topic(topic)
        with pytest.raises(HeraldClientError) as gone:
            await admin.get_topic(topic)
        assert gone.value.code == "topic_not_found"


async def test_consumer_of_a_missing_subscription_raises(shared_herald: HeraldProcess) -> None:
    consumer = Consumer(shared_herald.url, "never-created-subscription")
    with pytest.raises(ConsumerClosedError) as caught:
        await take(consumer, 1)
    assert caught.value.close_code == 4404
    await consumer.close()


async def test_every_task_iterating_a_consumer_stops_when_it_closes(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sdkw"), unique("sdkws")
    async with Admin(shared_herald.url) as admin, Producer(shared_herald.url) as producer:
        await admin.create_subscription(name, topic, start="earliest")
        await producer.send(topic, "only")
    consumer = Consumer(shared_herald.url, name, credit=10)
    seen: list[str] = []
    got_one = asyncio.Event()

    async def worker() -> None:  # several workers sharing one consumer, all waiting
        async for message in consumer:
            seen.append(message.value)
            await message.ack()
            got_one.set()

    workers = [asyncio.ensure_future(worker()) for _ in range(3)]
    await asyncio.wait_for(got_one.wait(), 15)
    for _ in range(20):  # every worker has had its turns to end wrongly
        await asyncio.sleep(0)
    assert not any(w.done() for w in workers)
    await consumer.close()
    async with asyncio.timeout(10):
        await asyncio.gather(*workers)  # each one ended its loop; none is left waiting
    assert seen == ["only"]


async def test_a_waiting_reader_gets_the_error_that_ends_the_consumer(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("sdke"), unique("sdkes")
    async with Admin(shared_herald.url) as admin:
        await admin.create_subscription(name, topic, start="earliest")
        async with Consumer(shared_herald.url, name) as consumer:
            reader = asyncio.ensure_future(take(consumer, 1))
            await wait_until(lambda: consumer.connections > 0, what="consumer ready")
            await admin.delete_subscription(name)  # PROTOCOL §3: its consumers are closed
            with pytest.raises(ConsumerClosedError):
                await asyncio.wait_for(reader, 15)


async def test_consumer_reconnects_after_a_server_restart(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("rs"), unique("rss")
    async with Admin(herald_server.url) as admin:
        await admin.create_subscription(name, topic, start="earliest")
    async with Producer(herald_server.url) as producer:
        await producer.send(topic, "before")
    consumer = Consumer(herald_server.url, name, credit=5, max_backoff=0.5)
    try:
        [before] = await take(consumer, 1)
        await before.ack()

        async def acked() -> bool:
            async with Admin(herald_server.url) as admin:
                stats = (await admin.get_subscription(name))["stats"]
            return bool(stats["acked_total"] == 1)

        await wait_until(acked, what="the ack applied")  # then SIGTERM persists it
        await asyncio.to_thread(herald_server.terminate)
        await asyncio.to_thread(herald_server.restart)
        async with Producer(herald_server.url) as producer:
            await producer.send(topic, "after")
        [after] = await take(consumer, 1, within=30)
        await after.ack()
        assert after.value == "after"
        assert consumer.connections >= 2
    finally:
        await consumer.close()


# -- a dead or wrong server: the SDK's own error, in bounded time (#20.5) ------------------


@contextlib.contextmanager
def wrong_http_server(tmp: Path) -> Iterator[str]:
    """A real HTTP server that is not Herald (it serves files: every API path is 404)."""

    class Files(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

    handler = functools.partial(Files, directory=str(tmp))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """Accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


async def test_consumer_of_a_dead_server_raises_at_once() -> None:
    consumer = Consumer(f"http://127.0.0.1:{free_port()}", "anything")
    with pytest.raises(HeraldConnectionError, match="cannot reach") as caught:
        await take(consumer, 1, within=10)  # before: retried forever, no output
    assert caught.value.code == "unreachable"
    await consumer.close()


async def test_consumer_of_a_wrong_server_raises_its_answer(tmp_path: Path) -> None:
    with wrong_http_server(tmp_path) as url:
        consumer = Consumer(url, "anything")
        with pytest.raises(HeraldClientError) as caught:
            await take(consumer, 1, within=10)
        assert caught.value.status == 404
        await consumer.close()


async def test_consumer_of_a_server_that_never_answers_times_out() -> None:
    async with silent_server() as url:
        consumer = Consumer(url, "anything", open_timeout=1.0)
        with pytest.raises(HeraldConnectionError):
            await take(consumer, 1, within=10)
        await consumer.close()


async def test_producer_and_admin_of_a_dead_server_raise_the_sdk_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with Producer(url) as producer:
        with pytest.raises(HeraldConnectionError):  # before: httpx.ConnectError, retried
            await asyncio.wait_for(producer.send_and_wait("t", 1), 5)
    async with Admin(url) as admin:
        with pytest.raises(HeraldConnectionError):
            await asyncio.wait_for(admin.list_topics(), 5)


async def test_producer_of_a_server_that_never_answers_times_out() -> None:
    async with silent_server() as url, Producer(url, timeout=1.0) as producer:
        with pytest.raises(HeraldConnectionError):
            await asyncio.wait_for(producer.send("t", 1), 10)


async def test_producer_of_a_wrong_server_raises_its_answer(tmp_path: Path) -> None:
    with wrong_http_server(tmp_path) as url:
        async with Producer(url) as producer:
            with pytest.raises(HeraldClientError) as caught:
                await asyncio.wait_for(producer.send("t", 1), 10)
    assert caught.value.status in (404, 501)  # http.server answers POST with 501


async def test_consumer_reconnects_only_after_a_first_connection_and_logs_it(
    herald_server: HeraldProcess, unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    topic, name = unique("rl"), unique("rls")
    async with Admin(herald_server.url) as admin:
        await admin.create_subscription(name, topic, start="earliest")
    consumer = Consumer(herald_server.url, name, credit=5, max_backoff=0.5)
    try:
        reader = asyncio.ensure_future(take(consumer, 1, within=60))
        await wait_until(lambda: consumer.connections > 0, what="consumer ready")
        await asyncio.to_thread(herald_server.terminate)
        await wait_until(lambda: "reconnecting in" in caplog.text, what="a reconnect logged")
        assert not reader.done()  # down, not failed: it was connected once
        await asyncio.to_thread(herald_server.restart)
        async with Producer(herald_server.url) as producer:
            await producer.send_and_wait(topic, "after")
        [after] = await reader
        assert after.value == "after"
    finally:
        await consumer.close()
    assert any(
        r.levelname == "WARNING" and "lost its connection" in r.getMessage() for r in caplog.records
    )


# -- send() returns a future, send_and_wait() waits (#20.5) --------------------------------


async def test_send_returns_a_future_without_waiting_and_send_and_wait_waits(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("fut")
    async with Producer(shared_herald.url) as producer:
        futures = [producer.send(topic, {"n": i}) for i in range(50)]
        assert all(isinstance(f, asyncio.Future) and not f.done() for f in futures)
        results = await asyncio.gather(*futures)  # sent together as one batch
        assert sorted(r.offset for r in results if r is not None) == list(range(50))
        waited = await producer.send_and_wait(topic, "last")
        assert waited is not None and waited.offset == 50


async def test_send_many_publishes_a_list_behind_one_future_in_order(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, name = unique("many"), unique("manys")
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=2)
        await admin.create_subscription(name, topic, start="earliest")
    before = await publish_requests(shared_herald.url)
    # max_batch 1000: 2,500 records go as three requests (none waits for another).
    async with Producer(shared_herald.url) as producer:
        pending = producer.send_many(topic, ({"n": i} for i in range(2500)), key="k")
        assert isinstance(pending, asyncio.Future) and not pending.done()
        results = await asyncio.wait_for(pending, 30)
        # ids make a retry idempotent, record by record, as with send(id=...).
        again = await producer.send_many(topic, ["a", "b"], ids=["m-1", "m-2"])
        repeat = await producer.send_many(topic, ["a", "b"], ids=["m-1", "m-2"])
        assert await producer.send_many(topic, []) == []
        with pytest.raises(ValueError, match="1 ids for 2 values"):
            producer.send_many(topic, ["a", "b"], ids=["m-3"])
    assert await publish_requests(shared_herald.url) == before + 5
    partition = results[0].partition if results[0] is not None else -1
    # One key: one partition, every record once. The three requests go side by side, so
    # which of them lands first is not promised (the Producer's docstring says so).
    assert {r.partition for r in results if r is not None} == {partition}
    assert sorted(r.offset for r in results if r is not None) == list(range(2500))
    assert [r.duplicate for r in again if r is not None] == [False, False]
    assert [(r.offset, r.duplicate) for r in repeat if r is not None] == [
        (r.offset, True) for r in again if r is not None
    ]
    # A consumer working in batches acks each batch with one call; nothing comes back.
    async with Consumer(shared_herald.url, name, credit=500) as consumer:
        taken: list[Message] = []
        async with asyncio.timeout(30):
            while len(taken) < 2502:
                batch = await consumer.take_batch(500)
                taken.extend(batch)
                await consumer.ack_many(batch)
    assert sorted(m.value["n"] for m in taken if isinstance(m.value, dict)) == list(range(2500))
    async with Admin(shared_herald.url) as admin:

        async def all_acked() -> bool:
            stats = (await admin.get_subscription(name))["stats"]
            return bool(stats["backlog"] == 0 and stats["in_flight"] == 0)

        await wait_until(all_acked, within=15, what="every record acked")


async def test_send_many_fails_with_the_first_bad_record_and_publishes_the_rest(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("manyb")
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=1)
    async with Producer(shared_herald.url) as producer:
        with pytest.raises(HeraldClientError) as caught:
            await producer.send_many(topic, ["fine", "also fine"], partition=7)
        assert caught.value.status == 400
        with pytest.raises(HeraldClientError):
            # The second record is too big for the server: it alone is refused.
            await producer.send_many(topic, ["one", "x" * 2_000_000, "three"])
        assert (await producer.send_and_wait(topic, "last")) is not None
    async with httpx.AsyncClient(base_url=shared_herald.url) as http:
        read = await http.get(f"/v1/topics/{topic}/partitions/0/messages", params={"offset": 0})
    assert [m["value"] for m in read.json()["messages"]] == ["one", "three", "last"]


async def test_send_refuses_past_max_pending_and_send_and_wait_waits_for_room(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("room")
    async with Producer(shared_herald.url, max_pending=2) as producer:
        first, second = producer.send(topic, 1), producer.send(topic, 2)
        with pytest.raises(ProducerBufferFullError):
            producer.send(topic, 3)
        third = await asyncio.wait_for(producer.send_and_wait(topic, 3), 15)
        assert first.done() and second.done()
        assert third is not None and third.offset == 2


async def test_producer_given_several_urls_goes_on_at_the_next_when_one_is_unreachable(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    # PROTOCOL §7: any node of a cluster takes any publish, so a producer given the
    # nodes' URLs goes on with the next one when the one it used cannot be reached.
    topic = unique("urls")
    dead = f"http://127.0.0.1:{free_port()}"
    async with Producer([dead, shared_herald.url]) as producer:
        first = await producer.send_and_wait(topic, "one")
        second = await producer.send_and_wait(topic, "two")
    assert first is not None and second is not None
    assert (first.offset, second.offset) == (0, 1)
    async with Producer([dead, f"http://127.0.0.1:{free_port()}"]) as producer:
        with pytest.raises(HeraldConnectionError):
            await producer.send_and_wait(topic, "three")
