"""The SDK's msgpack encoding (docs/protocol.md "MessagePack"): a producer sends a request
that carries bytes as msgpack (and only such a request), a consumer and a tail ask for
msgpack frames, and what the application sees is the same as over JSON, against a real
server; `encoding="json"` keeps everything JSON."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from herald import Admin, Consumer, HeraldClientError, Message, Producer, Tail
from tests.conftest import HeraldProcess


class PublishRecorder:
    """A loopback HTTP/1.1 listener that answers every publish as Herald would (results
    for each message) and keeps what each request carried: its Content-Type and body."""

    def __init__(self, reads_msgpack: bool = True) -> None:
        self.requests: list[tuple[str, bytes]] = []
        self.url = ""
        # False: answer a msgpack body as a Herald from before msgpack did (not JSON).
        self.reads_msgpack = reads_msgpack

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(
                    line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
                )
                fields = {k.lower(): v for k, v in headers.items()}
                body = await reader.readexactly(int(fields["content-length"]))
                content_type = fields["content-type"]
                self.requests.append((content_type, body))
                packed = "msgpack" in content_type
                if packed and not self.reads_msgpack:
                    status = b"400 Bad Request"
                    answer = orjson.dumps(
                        {
                            "status": 400,
                            "title": "Bad Request",
                            "code": "bad_request",
                            "detail": "the request body is not valid JSON",
                        }
                    )
                else:
                    decode = msgspec.msgpack.decode if packed else msgspec.json.decode
                    count = len(decode(body)["messages"])
                    status = b"200 OK"
                    answer = orjson.dumps(
                        {
                            "results": [
                                {"partition": 0, "offset": i, "duplicate": False}
                                for i in range(count)
                            ]
                        }
                    )
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (status, len(answer), answer)
                )
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def recorder(reads_msgpack: bool = True) -> AsyncIterator[PublishRecorder]:
    made = PublishRecorder(reads_msgpack)
    server = await asyncio.start_server(made._serve, "127.0.0.1", 0)
    made.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield made


async def test_a_request_carrying_bytes_goes_as_msgpack_and_one_without_as_json() -> None:
    async with recorder() as seen, Producer(seen.url) as producer:
        await producer.send("t", {"n": 1})
        await producer.send_many("t", [b"\x00\x01", b"raw"])
        await producer.send_many("t", [b"\xff", {"mixed": True}, "text"], key="k")
    (json_type, json_body), (packed_type, packed_body), (mixed_type, mixed_body) = seen.requests
    assert json_type == "application/json"
    assert orjson.loads(json_body) == {"messages": [{"value": {"n": 1}}]}
    assert packed_type == mixed_type == "application/vnd.msgpack"
    assert msgspec.msgpack.decode(packed_body) == {
        "messages": [{"value": b"\x00\x01"}, {"value": b"raw"}]
    }
    assert msgspec.msgpack.decode(mixed_body) == {
        "messages": [
            {"value": b"\xff", "key": "k"},
            {"value_json": '{"mixed":true}', "key": "k"},
            {"value_json": '"text"', "key": "k"},
        ]
    }


async def test_encoding_json_sends_bytes_as_base64() -> None:
    async with recorder() as seen, Producer(seen.url, encoding="json") as producer:
        await producer.send("t", b"\x00\x01", headers={"h": "v"})
    [(content_type, body)] = seen.requests
    assert content_type == "application/json"
    assert orjson.loads(body) == {"messages": [{"value_b64": "AAE=", "headers": {"h": "v"}}]}


async def test_a_server_that_reads_no_msgpack_gets_json_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Herald from before msgpack answers a msgpack body 400 (not JSON): the producer
    sends that request again as JSON, and every later one as JSON at once."""
    async with recorder(reads_msgpack=False) as seen, Producer(seen.url) as producer:
        first = await producer.send_many("t", [b"\x00\x01", {"n": 1}], key="k")
        second = await producer.send("t", b"raw", headers={"h": "v"})
    assert [r.offset for r in first if r is not None] == [0, 1]
    assert second is not None and second.offset == 0
    kinds = [content_type for content_type, _ in seen.requests]
    assert kinds == ["application/vnd.msgpack", "application/json", "application/json"]
    assert orjson.loads(seen.requests[1][1]) == {
        "messages": [{"value_b64": "AAE=", "key": "k"}, {"value": {"n": 1}, "key": "k"}]
    }
    assert orjson.loads(seen.requests[2][1]) == {
        "messages": [{"value_b64": "cmF3", "headers": {"h": "v"}}]
    }
    assert "reads no msgpack" in caplog.text


def test_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="encoding"):
        Producer("http://127.0.0.1:1", encoding="msgpack-please")


async def _read_all(url: str, topic: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        answer = await http.get(f"/v1/topics/{topic}/partitions/0/messages", params={"offset": 0})
    assert answer.status_code == 200, answer.text
    messages: list[dict[str, Any]] = answer.json()["messages"]
    return messages


@pytest.mark.parametrize("encoding", ["auto", "json"])
async def test_bytes_and_json_records_are_stored_alike_in_either_encoding(
    shared_herald: HeraldProcess, unique: Callable[[str], str], encoding: str
) -> None:
    topic = unique("sdkmp")
    values: list[Any] = [b"\x00" * 300, {"a": [1, 2.5]}, b"", None, "s", bytearray(b"ba")]
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=1)
    async with Producer(shared_herald.url, encoding=encoding) as producer:
        results = await producer.send_many(topic, values, key="k", headers={"h": "1"})
        alone = await producer.send(topic, memoryview(b"mv"), id="once")
        again = await producer.send(topic, memoryview(b"mv"), id="once")
    assert [r.offset for r in results if r is not None] == list(range(len(values)))
    assert alone is not None and again is not None and again.duplicate
    assert again.offset == alone.offset
    records = await _read_all(shared_herald.url, topic)
    assert [r.get("value_b64") for r in records] == [
        "AA" * 200,
        None,
        "",
        None,
        None,
        "YmE=",
        "bXY=",
    ]
    assert [r.get("value") for r in records] == [None, {"a": [1, 2.5]}, None, None, "s", None, None]
    assert all(r["key"] == "k" for r in records[: len(values)])


async def test_a_bad_bytes_record_fails_only_its_own_send(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    """The server names the bad message of a msgpack body by its index, as of a JSON one."""
    topic = unique("sdkmpb")
    async with Producer(shared_herald.url, linger_ms=50) as producer:
        good, bad, text = await asyncio.gather(
            producer.send(topic, b"fine"),
            producer.send(topic, b"x", partition=99),
            producer.send(topic, "fine too"),
            return_exceptions=True,
        )
    assert not isinstance(good, BaseException) and good is not None
    assert not isinstance(text, BaseException) and text is not None
    assert sorted([good.offset, text.offset]) == [0, 1]
    assert isinstance(bad, HeraldClientError) and bad.status in (400, 404)


VALUES: list[Any] = [b"\x00\xffraw" * 100, {"n": 1, "s": "é"}, b"", None, [1, 2.5], "text"]


async def _consume(consumer: Consumer, count: int) -> list[Message]:
    taken: list[Message] = []
    async with asyncio.timeout(30):
        while len(taken) < count:
            taken += await consumer.take_batch(count - len(taken))
    return taken


async def test_a_consumer_gets_msgpack_frames_and_the_same_messages_as_over_json(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, packed_name, json_name = unique("sdkmp"), unique("mpsub"), unique("jsonsub")
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=1)
        for name in (packed_name, json_name):
            await admin.create_subscription(name, topic, start="earliest")
        async with Producer(shared_herald.url) as producer:
            await producer.send_many(topic, VALUES, key="k", headers={"h": "v"})
        async with (
            Consumer(shared_herald.url, packed_name, credit=4) as packed,
            Consumer(shared_herald.url, json_name, credit=4, encoding="json") as plain,
        ):
            over_msgpack = await _consume(packed, len(VALUES))
            over_json = await _consume(plain, len(VALUES))
            assert packed.frame_encoding == "msgpack" and plain.frame_encoding == "json"
            assert [m.value for m in over_msgpack] == VALUES
            assert [m.is_bytes for m in over_msgpack] == [True, False, True, False, False, False]
            assert [m.to_json() | {"subscription": None} for m in over_msgpack] == [
                m.to_json() | {"subscription": None} for m in over_json
            ]
            # Answered over msgpack: a nack comes back with attempt 2, acks are applied.
            await over_msgpack[0].nack(delay_ms=0)
            await packed.ack_many(over_msgpack[1:])
            [again] = await _consume(packed, 1)
            assert again.id == over_msgpack[0].id and again.attempt == 2
            assert again.value == VALUES[0]
            await again.ack()
            await plain.ack_many(over_json)
        for name in (packed_name, json_name):
            stats = (await admin.get_subscription(name))["stats"]
            assert stats["backlog"] == 0 and stats["in_flight"] == 0, (name, stats)


async def test_a_tail_gets_msgpack_frames_and_the_same_messages_as_over_json(
    shared_herald: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("sdkmpt")
    async with Admin(shared_herald.url) as admin:
        await admin.create_topic(topic, partitions=1)
    async with Producer(shared_herald.url) as producer:
        await producer.send_many(topic, VALUES)
    taken: dict[str, list[Message]] = {}
    frames: dict[str, str] = {}
    for encoding in ("auto", "json"):
        async with Tail(
            shared_herald.url, topic, start="earliest", limit=len(VALUES), encoding=encoding
        ) as tail:
            taken[encoding] = [m async for m in tail]
            frames[encoding] = tail.frame_encoding
    assert frames == {"auto": "msgpack", "json": "json"}
    assert [m.value for m in taken["auto"]] == VALUES
    assert taken["auto"] == taken["json"]  # Message equality: the record as JSON shows it
