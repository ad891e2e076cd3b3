"""Consumer and tail sockets in msgpack (docs/protocol.md "MessagePack"), against a real
server over real sockets: a client offering `herald.msgpack` gets it selected and every
frame as a msgpack map in a binary frame; one that does not still speaks JSON."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest
import websockets
from msgspec import UNSET
from websockets.asyncio.client import ClientConnection

from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from herald.protocol.frames import (
    AckedFrame,
    ErrorFrame,
    PackedConsumerFrame,
    PackedDeliverFrame,
    PackedTailDeliverFrame,
    PackedTailFrame,
    ReadyFrame,
)
from herald.protocol.records import PackedDeliveredRecord, PackedTailRecord
from tests.conftest import HeraldProcess
from tests.subscribers import (
    close_code,
    make_subscription,
    nothing_arrives,
    publish,
    receive_records,
    recv_json,
    send_json,
    ws_url,
)

CONSUMER = msgspec.msgpack.Decoder(PackedConsumerFrame)
TAIL = msgspec.msgpack.Decoder(PackedTailFrame)
pack = msgspec.msgpack.encode


@pytest.fixture
async def sub(http: httpx.AsyncClient, unique: Callable[[str], str]) -> tuple[str, str]:
    """(topic, subscription) starting at the earliest record."""
    topic, name = unique("mpt"), unique("mps")
    assert (await http.put(f"/v1/topics/{topic}", json={})).status_code == 201
    await make_subscription(http, name, topic)
    return topic, name


def consumer_url(server: HeraldProcess, name: str, query: str = "") -> str:
    return ws_url(server.url, f"/v1/subscriptions/{name}/ws{query}")


def tail_url(server: HeraldProcess, topic: str, query: str = "") -> str:
    return ws_url(server.url, f"/v1/topics/{topic}/ws{query}")


def packed_socket(url: str, *offered: str) -> websockets.connect:
    return websockets.connect(url, subprotocols=[*(offered or (MSGPACK_SUBPROTOCOL,))])  # type: ignore[list-item]


async def recv_packed(
    ws: ClientConnection, decoder: msgspec.msgpack.Decoder[Any] = CONSUMER, within: float = 10.0
) -> Any:
    frame = await asyncio.wait_for(ws.recv(), within)
    assert isinstance(frame, bytes), "a msgpack socket writes binary frames"
    return decoder.decode(frame)


async def receive_packed(
    ws: ClientConnection,
    count: int,
    decoder: msgspec.msgpack.Decoder[Any] = CONSUMER,
    within: float = 10.0,
) -> list[Any]:
    """`count` delivered records, no frame holding more than is still expected."""
    records: list[Any] = []
    async with asyncio.timeout(within):
        while len(records) < count:
            frame = await recv_packed(ws, decoder)
            if not isinstance(frame, PackedDeliverFrame | PackedTailDeliverFrame):
                continue
            assert 1 <= len(frame.messages) <= count - len(records)
            records.extend(frame.messages)
    return records


async def recv_acked(ws: ClientConnection) -> AckedFrame:
    async with asyncio.timeout(10):
        while True:
            frame = await recv_packed(ws)
            if isinstance(frame, AckedFrame):
                return frame


async def publish_raw(http: httpx.AsyncClient, topic: str, body: bytes) -> None:
    reply = await http.post(
        f"/v1/topics/{topic}/messages",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    "offered",
    [
        (MSGPACK_SUBPROTOCOL,),
        (MSGPACK_SUBPROTOCOL, "herald.v1"),
        ("herald.v1", MSGPACK_SUBPROTOCOL),
    ],
)
async def test_offering_msgpack_selects_it_and_ready_is_binary(
    shared_herald: HeraldProcess, sub: tuple[str, str], offered: tuple[str, ...]
) -> None:
    async with packed_socket(consumer_url(shared_herald, sub[1], "?credit=5"), *offered) as ws:
        assert ws.subprotocol == MSGPACK_SUBPROTOCOL
        ready = await recv_packed(ws)
        assert isinstance(ready, ReadyFrame)
        assert (ready.subscription, ready.credit) == (sub[1], 5) and ready.consumer


async def test_records_arrive_as_msgpack_with_bytes_as_bin_and_json_as_text(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    raw = bytes(range(256))
    body = (
        b'{"messages": [{"value": {"a": [1, 2.5, null], "b": "caf\\u00e9"}, "partition": 0},'
        b' {"value_b64": "' + base64.b64encode(raw) + b'", "key": "k", "headers": {"h": "v"},'
        b' "partition": 0}, {"value": 7, "delay_ms": 1, "partition": 0}]}'
    )
    await publish_raw(http, topic, body)
    async with packed_socket(consumer_url(shared_herald, name, "?credit=3")) as ws:
        assert isinstance(await recv_packed(ws), ReadyFrame)
        records = await receive_packed(ws, 3)
    records.sort(key=lambda r: r.offset)
    assert all(isinstance(r, PackedDeliveredRecord) for r in records)
    first, second, third = records
    assert first.value_json == '{"a":[1,2.5,null],"b":"café"}' and first.value is UNSET
    assert (first.topic, first.subscription, first.attempt) == (topic, name, 1)
    assert (first.id, first.partition, first.key, first.headers) == ("0-0", 0, None, {})
    assert first.deliver_at is UNSET
    assert second.value == raw and second.value_json is UNSET
    assert (second.key, second.headers) == ("k", {"h": "v"})
    assert third.value_json == "7" and third.deliver_at == third.timestamp + 1


async def test_acks_are_answered_in_msgpack_with_req_as_sent(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["a", "b", "c"], partition=0)
    async with packed_socket(consumer_url(shared_herald, name, "?credit=3")) as ws:
        await recv_packed(ws)
        ids = sorted((r.id for r in await receive_packed(ws, 3)), key=lambda i: int(i[2:]))
        # A msgpack ack: its req, msgpack's own types included, comes back as sent.
        req = {"n": 1, "tags": ["x", None], "blob": b"\x00\xff", "f": 1.5}
        await ws.send(pack({"type": "ack", "ids": [ids[0], "0-999", "junk"], "req": req}))
        acked = await recv_acked(ws)
        assert acked.ok == [ids[0]] and sorted(acked.unknown) == ["0-999", "junk"]
        assert msgspec.msgpack.decode(acked.req) == req
        # A JSON ack on the same socket: answered in msgpack, its req converted.
        await send_json(ws, {"type": "ack", "ids": [ids[1]], "req": {"k": [1, "two", None]}})
        acked = await recv_acked(ws)
        assert acked.ok == [ids[1]] and acked.unknown == []
        assert msgspec.msgpack.decode(acked.req) == {"k": [1, "two", None]}
        # Without req, no answer.
        await ws.send(pack({"type": "ack", "ids": [ids[2]]}))
        assert await nothing_arrives(ws)
        await ws.send(pack({"type": "ack", "ids": [ids[2]], "req": 5}))
        acked = await recv_acked(ws)
        assert (acked.ok, acked.unknown, msgspec.msgpack.decode(acked.req)) == ([], [ids[2]], 5)


BAD_BINARY_FRAMES: list[tuple[bytes, str]] = [
    (b"\xc1", "bad_frame"),  # not msgpack
    (b'{"type":"credit","n":1}', "bad_frame"),  # JSON in a binary frame
    (pack([1, 2]), "bad_frame"),  # not a map
    (pack("credit"), "bad_frame"),
    (pack({"type": "credit", "n": 1}) + b"\x00", "bad_frame"),  # trailing bytes
    (pack({"n": 1}), "bad_frame"),
    (pack({"type": 5}), "bad_frame"),
    (pack({"type": "subscribe"}), "unknown_type"),
    (pack({"type": "credit", "n": 1.0}), "bad_frame"),  # integers are msgpack integers
    (pack({"type": "credit", "n": "3"}), "bad_frame"),
    (pack({"type": "credit", "n": 0}), "bad_frame"),
    (pack({"type": "credit", "n": 1_000_001}), "bad_frame"),
    (pack({"type": "ack", "ids": [b"0-0"]}), "bad_frame"),
    (pack({"type": "nack", "ids": ["0-0"], "delay_ms": 600_001}), "bad_frame"),
    (pack({"type": "extend", "ids": ["0-0"], "ms": 99}), "bad_frame"),
]


async def test_bad_frames_are_answered_in_msgpack_and_the_connection_survives(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["kept"])
    async with packed_socket(consumer_url(shared_herald, name)) as ws:
        await recv_packed(ws)
        frames: list[tuple[str | bytes, str]] = [*BAD_BINARY_FRAMES, ("not json", "bad_frame")]
        for frame, code in frames:
            await ws.send(frame)
            error = await recv_packed(ws)
            assert isinstance(error, ErrorFrame), frame
            assert error.code == code, (frame, error.message)
        # Nothing changed: no credit was granted by the bad credit frames.
        assert await nothing_arrives(ws)
        await ws.send(pack({"type": "credit", "n": 1, "unknown": "ignored"}))
        [record] = await receive_packed(ws, 1)
        assert record.value_json == '"kept"'


async def test_hundred_bad_binary_frames_close_1008(
    shared_herald: HeraldProcess, sub: tuple[str, str]
) -> None:
    async with packed_socket(consumer_url(shared_herald, sub[1])) as ws:
        await recv_packed(ws)
        for _ in range(99):
            await ws.send(b"\xc1")
        for _ in range(99):
            assert isinstance(await recv_packed(ws), ErrorFrame)
        assert ws.close_code is None, "99 bad frames are tolerated"
        await ws.send(pack([]))
        assert await close_code(ws) == 1008


async def test_credit_is_respected(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    async with packed_socket(consumer_url(shared_herald, name)) as ws:
        ready = await recv_packed(ws)
        assert isinstance(ready, ReadyFrame) and ready.credit == 0
        await ws.send(pack({"type": "credit", "n": 2}))
        await publish(http, topic, list(range(5)), partition=0)
        first = await receive_packed(ws, 2)
        assert await nothing_arrives(ws), "no record beyond the credit granted"
        await ws.send(pack({"type": "credit", "n": 3}))
        rest = await receive_packed(ws, 3)
        assert await nothing_arrives(ws)
    assert sorted(r.value_json for r in first + rest) == [str(i) for i in range(5)]


async def test_nack_in_msgpack_redelivers_with_next_attempt(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["n"])
    async with packed_socket(consumer_url(shared_herald, name, "?credit=2")) as ws:
        await recv_packed(ws)
        [first] = await receive_packed(ws, 1)
        await ws.send(pack({"type": "nack", "ids": [first.id, "9-9", "junk"], "delay_ms": 0}))
        [again] = await receive_packed(ws, 1)
        assert (again.id, again.attempt) == (first.id, 2)


async def test_a_msgpack_tail_and_a_json_tail_of_the_same_records(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic = unique("mptail")
    assert (await http.put(f"/v1/topics/{topic}", json={"partitions": 2})).status_code == 201
    await publish(http, topic, [0, 1], partition=0)
    raw = b"\x00\x01\xfe"
    b64 = base64.b64encode(raw).decode()
    async with (
        packed_socket(tail_url(shared_herald, topic, "?from=earliest&credit=100")) as packed,
        websockets.connect(tail_url(shared_herald, topic, "?from=earliest&credit=100")) as text,
    ):
        assert packed.subprotocol == MSGPACK_SUBPROTOCOL and text.subprotocol is None
        ready = await recv_packed(packed, TAIL)
        assert isinstance(ready, ReadyFrame) and ready.subscription is None
        assert (await recv_json(text))["type"] == "ready"
        old_packed, old_text = await asyncio.gather(
            receive_packed(packed, 2, TAIL), receive_records(text, 2)
        )
        # New records, which both tails send from the same shared records.
        messages = [{"value": {"x": 1}, "partition": 1}, {"value_b64": b64, "partition": 1}]
        reply = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
        assert reply.status_code == 200, reply.text
        new_packed, new_text = await asyncio.gather(
            receive_packed(packed, 2, TAIL), receive_records(text, 2)
        )
        assert await nothing_arrives(packed) and await nothing_arrives(text)
    for record in old_packed + new_packed:
        assert isinstance(record, PackedTailRecord) and record.attempt == 1
        assert record.topic == topic
    assert sorted(r.value_json for r in old_packed) == ["0", "1"]
    assert sorted(r["value"] for r in old_text) == [0, 1]
    new_packed.sort(key=lambda r: r.offset)
    assert new_packed[0].value_json == '{"x":1}' and new_packed[1].value == raw
    new_text.sort(key=lambda r: r["offset"])
    assert new_text[0]["value"] == {"x": 1} and new_text[1]["value_b64"] == b64
    assert all(r["attempt"] == 1 and "subscription" not in r for r in old_text + new_text)


async def test_a_msgpack_tail_has_no_subscription_and_says_its_positions(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic = unique("mppos")
    assert (await http.put(f"/v1/topics/{topic}", json={"partitions": 2})).status_code == 201
    await publish(http, topic, ["p"], partition=1)
    query = "?from=earliest&credit=10&positions=true"
    async with packed_socket(tail_url(shared_herald, topic, query)) as ws:
        ready = await recv_packed(ws, TAIL)
        assert isinstance(ready, ReadyFrame) and ready.positions == {0: 0, 1: 0}
        frame = await asyncio.wait_for(ws.recv(), 10)
    assert isinstance(frame, bytes)
    [record] = msgspec.msgpack.decode(frame)["messages"]
    assert "subscription" not in record and record["attempt"] == 1
    assert record["value_json"] == '"p"' and "value" not in record


async def test_a_tail_reads_credit_in_msgpack_and_refuses_bad_frames(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic = unique("mpcred")
    assert (await http.put(f"/v1/topics/{topic}", json={})).status_code == 201
    await publish(http, topic, [1, 2, 3])
    async with packed_socket(tail_url(shared_herald, topic, "?from=earliest")) as ws:
        await recv_packed(ws, TAIL)
        await ws.send(pack({"type": "credit", "n": 1.0}))
        error = await recv_packed(ws, TAIL)
        assert isinstance(error, ErrorFrame) and error.code == "bad_frame"
        await ws.send(pack({"type": "credit", "n": 2}))
        assert len(await receive_packed(ws, 2, TAIL)) == 2
        assert await nothing_arrives(ws)


async def test_without_the_subprotocol_the_socket_stays_json(
    shared_herald: HeraldProcess, http: httpx.AsyncClient, sub: tuple[str, str]
) -> None:
    topic, name = sub
    await publish(http, topic, ["j"])
    async with websockets.connect(consumer_url(shared_herald, name, "?credit=1")) as ws:
        assert ws.subprotocol is None
        assert (await recv_json(ws))["type"] == "ready"
        [record] = await receive_records(ws, 1)
        assert record["value"] == "j"
        await ws.send(pack({"type": "credit", "n": 1}))
        error = await recv_json(ws)
        assert (error["type"], error["code"]) == ("error", "bad_frame")
    # The browser's subprotocol alone still selects herald.v1, and JSON.
    async with websockets.connect(
        consumer_url(shared_herald, name),
        subprotocols=["herald.v1"],  # type: ignore[list-item]
    ) as ws:
        assert ws.subprotocol == "herald.v1"
        assert (await recv_json(ws))["type"] == "ready"


async def test_refusals_keep_their_close_codes(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    async with packed_socket(consumer_url(shared_herald, unique("nosuch"), "?credit=1")) as ws:
        assert await close_code(ws) == 4404
    async with packed_socket(tail_url(shared_herald, unique("nosuch"), "?from=x")) as ws:
        assert await close_code(ws) == 4400
