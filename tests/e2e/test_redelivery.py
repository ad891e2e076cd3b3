"""Credit, deadlines, nack, extend, dead letters and ordering (PROTOCOL §2 config, §3)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import websockets

from tests.conftest import HeraldProcess
from tests.e2e import ack, stats
from tests.helpers import wait_until
from tests.subscribers import (
    make_subscription,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)

FAST_BACKOFF = {"min_ms": 50, "max_ms": 50}


def consumer(server: HeraldProcess, name: str, credit: int) -> websockets.connect:
    return websockets.connect(ws_url(server.url, f"/v1/subscriptions/{name}/ws?credit={credit}"))


async def one_record(ws: Any, within: float = 10.0) -> dict[str, Any]:
    [record] = await receive_records(ws, 1, within)
    return record


async def test_credit_is_never_exceeded_across_many_frames(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("cr"), unique("crs")
    await make_subscription(http, name, topic)
    await publish(http, topic, list(range(200)))
    granted, received = 0, 0
    async with consumer(shared_herald, name, 0) as ws:
        await recv_json(ws)
        for n in (1, 2, 3, 5, 8, 13, 21, 34, 55):
            await send_json(ws, {"type": "credit", "n": n})
            granted += n
            while received < granted:
                frame = await recv_json(ws)
                assert frame["type"] == "deliver"
                received += len(frame["messages"])
                assert received <= granted, "PROTOCOL §3: never more than the credit"
            assert await nothing_arrives(ws, 0.1)
    assert received == granted == 142


async def test_unacked_record_is_redelivered_after_the_deadline_with_attempt_2(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("dl"), unique("dls")
    await make_subscription(http, name, topic, ack_deadline_ms=200, retry_backoff=FAST_BACKOFF)
    await publish(http, topic, ["late"])
    # Before the connection: the first send, whenever this client reads it, comes after.
    connecting = time.monotonic()
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        first = await one_record(ws)
        again = await one_record(ws)
        assert time.monotonic() - connecting >= 0.2 - 0.02, "not before the ack deadline"
        assert (again["id"], first["attempt"], again["attempt"]) == (first["id"], 1, 2)
        # This attempt has 200 ms too: an ack later than that (a loaded host) is
        # answered unknown and the record comes again; that one is acked.
        await ack_until_ok(ws, again)
        assert await nothing_arrives(ws, 0.5), "an acked record is not redelivered"


async def ack_until_ok(ws: Any, record: dict[str, Any], attempts: int = 20) -> dict[str, Any]:
    """Ack ``record``; if its deadline passed first, ack its next delivery. -> the attempt
    acked."""
    for _ in range(attempts):
        if (await ack(ws, [record["id"]]))["ok"] == [record["id"]]:
            return record
        record = await one_record(ws)
    raise AssertionError(f"{record['id']} was never acked within its deadline")


async def test_nack_with_delay_is_not_redelivered_before_the_delay(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("nd"), unique("nds")
    await make_subscription(http, name, topic, ack_deadline_ms=60_000)
    await publish(http, topic, ["n"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        first = await one_record(ws)
        nacked = time.monotonic()
        await send_json(ws, {"type": "nack", "ids": [first["id"]], "delay_ms": 600})
        again = await one_record(ws)
        assert time.monotonic() - nacked >= 0.6 - 0.02
        assert (again["id"], again["attempt"]) == (first["id"], 2)


async def test_nack_without_delay_waits_for_the_backoff(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("nb"), unique("nbs")
    backoff = {"min_ms": 400, "max_ms": 400}  # jittered within [320, 400] ms
    await make_subscription(http, name, topic, ack_deadline_ms=60_000, retry_backoff=backoff)
    await publish(http, topic, ["n"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        first = await one_record(ws)
        nacked = time.monotonic()
        await send_json(ws, {"type": "nack", "ids": [first["id"]]})
        again = await one_record(ws)
        assert time.monotonic() - nacked >= 0.32 - 0.02
        assert (again["id"], again["attempt"]) == (first["id"], 2)


async def test_extend_postpones_redelivery(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ex"), unique("exs")
    # The extend must come within the first deadline, on a loaded host too: 1.5 s.
    await make_subscription(http, name, topic, ack_deadline_ms=1500, retry_backoff=FAST_BACKOFF)
    await publish(http, topic, ["x"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        first = await one_record(ws)
        extended = time.monotonic()
        await send_json(ws, {"type": "extend", "ids": [first["id"], "7-7", "junk"], "ms": 3000})
        assert await nothing_arrives(ws, 2.0), "the old 1.5 s deadline no longer applies"
        again = await one_record(ws)
        assert time.monotonic() - extended >= 3.0 - 0.02
        assert (again["id"], again["attempt"]) == (first["id"], 2)


async def test_record_is_dead_lettered_after_max_deliveries_with_source_headers(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name, dead = unique("dq"), unique("dqs"), unique("dead")
    await make_subscription(http, name, topic, max_deliveries=2, dead_letter_topic=dead)
    reply = await http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": {"a": 1}, "key": "k", "headers": {"h": "v"}}]},
    )
    [result] = reply.json()["results"]
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        for attempt in (1, 2):
            record = await one_record(ws)
            assert record["attempt"] == attempt
            await send_json(ws, {"type": "nack", "ids": [record["id"]], "delay_ms": 0})
        assert await nothing_arrives(ws, 0.3), "no third delivery"
        read = await http.get(
            f"/v1/topics/{dead}/partitions/0/messages", params={"offset": 0, "wait_ms": 10_000}
        )
        assert read.status_code == 200, read.text
        [letter] = read.json()["messages"]
        assert letter["value"] == {"a": 1} and letter["key"] == "k"
        assert letter["headers"] == {
            "h": "v",
            "herald-source-topic": topic,
            "herald-source-partition": str(result["partition"]),
            "herald-source-offset": str(result["offset"]),
            "herald-source-deliveries": "2",
            "herald-source-reason": "max_deliveries",
            "herald-source-subscription": name,  # PROTOCOL §8
            "herald-source-last-error": "nack",
        }
        ack_reply = await ack(ws, [record["id"]])
        assert ack_reply["unknown"] == [record["id"]], "dead-lettered records are not in flight"

    # The dead letter is readable once written but counted once its acks=all publish is
    # fsynced (docs/protocol.md), so the count may trail the read by one fsync.
    async def counted() -> bool:
        return (await stats(http, name))["dead_lettered_total"] == 1

    await wait_until(counted, what="dead_lettered_total == 1")
    current = await stats(http, name)
    assert (current["backlog"], current["in_flight"]) == (0, 0)
    assert current["partitions"] == [{"partition": 0, "ack_floor": 1}]


async def test_without_dead_letter_topic_the_record_is_dropped_and_counted(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("dr"), unique("drs")
    await make_subscription(
        http, name, topic, max_deliveries=1, dead_letter_topic=None, ack_deadline_ms=60_000,
        retry_backoff=FAST_BACKOFF,
    )  # fmt: skip
    await publish(http, topic, ["drop me", "keep me"])
    async with consumer(shared_herald, name, 5) as ws:
        await recv_json(ws)
        records = await receive_records(ws, 2)
        assert (await ack(ws, [records[1]["id"]]))["ok"] == [records[1]["id"]]
        # The first one is nacked: one delivery was all it had.
        await send_json(ws, {"type": "nack", "ids": [records[0]["id"]], "delay_ms": 0})
        assert await nothing_arrives(ws, 0.8)

    async def dropped() -> bool:
        return (await stats(http, name))["dead_lettered_total"] == 1

    await wait_until(dropped, what="dead_lettered_total == 1")
    current = await stats(http, name)
    assert (current["backlog"], current["in_flight"], current["acked_total"]) == (0, 0, 1)
    assert current["partitions"] == [{"partition": 0, "ack_floor": 2}]
    topics = (await http.get("/v1/topics")).json()["topics"]
    assert [t["name"] for t in topics if t["name"].startswith(name)] == [], "no topic made"


async def test_max_in_flight_holds_across_consumers(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("mf"), unique("mfs")
    await make_subscription(http, name, topic, max_in_flight=3)
    async with consumer(shared_herald, name, 10) as one, consumer(shared_herald, name, 10) as two:
        await recv_json(one)
        await recv_json(two)
        await publish(http, topic, list(range(10)))
        got: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}

        async def gather_until(count: int, into: dict[str, list[dict[str, Any]]]) -> None:
            """Until ``count`` records came in all (however slowly), then a quiet 0.5 s
            on both: more than ``count`` would show then."""
            async with asyncio.timeout(30):
                while sum(map(len, into.values())) < count:
                    for label, ws in (("one", one), ("two", two)):
                        await nothing_arrives_into(ws, into[label], 0.1)
            for label, ws in (("one", one), ("two", two)):
                while not await nothing_arrives_into(ws, into[label], 0.5):
                    pass

        await gather_until(3, got)
        held = got["one"] + got["two"]
        assert len(held) == 3, "PROTOCOL §3: never more than max_in_flight unacked"
        owner = one if got["one"] else two
        mine = got["one"] if got["one"] else got["two"]
        await ack(owner, [mine[0]["id"]])
        more: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
        await gather_until(1, more)
        assert len(more["one"] + more["two"]) == 1, "one ack frees one slot"
        assert (await stats(http, name))["in_flight"] == 3


async def nothing_arrives_into(ws: Any, into: list[dict[str, Any]], seconds: float = 0.4) -> bool:
    """True if nothing arrives within `seconds`; else add the delivered records to `into`."""
    try:
        frame = await recv_json(ws, seconds)
    except TimeoutError:
        return True
    if frame["type"] == "deliver":
        into.extend(frame["messages"])
    return False


async def test_ordered_by_key_keeps_one_in_flight_per_key_and_order_across_redelivery(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("ok"), unique("oks")
    await make_subscription(http, name, topic, ordered_by_key=True, ack_deadline_ms=60_000)
    messages = [
        {"value": "a0", "key": "a"}, {"value": "a1", "key": "a"}, {"value": "a2", "key": "a"},
        {"value": "b0", "key": "b"}, {"value": "b1", "key": "b"},
        {"value": "n0", "key": None}, {"value": "n1", "key": None},
    ]  # fmt: skip
    reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert reply.status_code == 200
    async with consumer(shared_herald, name, 100) as ws:
        await recv_json(ws)
        first = await receive_records(ws, 4)
        # One per key; keyless records are never held back.
        assert sorted(r["value"] for r in first) == ["a0", "b0", "n0", "n1"]
        assert await nothing_arrives(ws), "a1 and b1 wait for their key"
        by_value = {r["value"]: r for r in first}
        await send_json(ws, {"type": "nack", "ids": [by_value["a0"]["id"]], "delay_ms": 0})
        again = await one_record(ws)
        assert (again["value"], again["attempt"]) == ("a0", 2), "a0 again before a1"
        await ack(ws, [by_value["b0"]["id"]])
        assert (await one_record(ws))["value"] == "b1", "key b is not held back by key a"
        order = ["a0"]
        while order[-1] != "a2":
            record = await one_record(ws) if len(order) > 1 else None
            if record is None:
                await ack(ws, [again["id"]], req="a0")
                record = await one_record(ws)
            order.append(record["value"])
            assert await nothing_arrives(ws, 0.2), "one in flight per key"
            if record["value"] != "a2":
                await ack(ws, [record["id"]], req=record["value"])
        assert order == ["a0", "a1", "a2"]


async def test_ack_nack_and_extend_apply_whichever_consumer_holds_the_record(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic, name = unique("xc"), unique("xcs")
    # A deadline `other`'s three frames meet on a loaded host too.
    await make_subscription(http, name, topic, ack_deadline_ms=2000, retry_backoff=FAST_BACKOFF)
    async with (
        consumer(shared_herald, name, 10) as holder,
        consumer(shared_herald, name, 0) as other,
    ):
        await recv_json(holder)
        await recv_json(other)
        await publish(http, topic, ["acked", "nacked", "extended"])
        held = {r["value"]: r for r in await receive_records(holder, 3)}
        # `other` holds nothing and has no credit, yet its frames act on holder's records.
        await send_json(other, {"type": "extend", "ids": [held["extended"]["id"]], "ms": 60_000})
        await send_json(other, {"type": "nack", "ids": [held["nacked"]["id"]], "delay_ms": 0})
        answer = await ack(other, [held["acked"]["id"]])
        assert answer["ok"] == [held["acked"]["id"]]
        [again] = await receive_records(holder, 1)
        assert (again["value"], again["attempt"]) == ("nacked", 2)
        await ack(holder, [again["id"]])
        # "extended" outlives its 2 s deadline; "acked" never comes back.
        assert await nothing_arrives(holder, 2.5)
        assert await nothing_arrives(other, 0.1)
    current = await stats(http, name)
    assert (current["acked_total"], current["redelivered_total"]) == (2, 1)


async def test_dead_letter_topic_is_created_even_with_auto_create_off(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    server = herald_factory("--no-auto-create")
    topic, name, dead = unique("na"), unique("nas"), unique("nad")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.put(f"/v1/topics/{topic}")).status_code == 201
        await make_subscription(http, name, topic, max_deliveries=1, dead_letter_topic=dead)
        assert (await http.get(f"/v1/topics/{dead}")).status_code == 404
        await publish(http, topic, ["poison"])
        async with consumer(server, name, 1) as ws:
            await recv_json(ws)
            record = await one_record(ws)
            await send_json(ws, {"type": "nack", "ids": [record["id"]], "delay_ms": 0})

            async def dead_lettered() -> bool:
                return (await stats(http, name))["dead_lettered_total"] == 1

            await wait_until(dead_lettered, what="the dead letter")
        read = await http.get(f"/v1/topics/{dead}/partitions/0/messages")
        assert [m["value"] for m in read.json()["messages"]] == ["poison"]
