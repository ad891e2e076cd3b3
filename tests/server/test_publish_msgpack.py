"""Publishing with a msgpack body (docs/protocol.md "MessagePack"), over HTTP to a real
server: the records are the ones the same messages in JSON make (a bin `value` is a
bytes record, `value_json` a JSON value stored compact), every problem of PROTOCOL §2
holds with its code and `index`, a refused body appends nothing, and the answer stays
JSON."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from herald.protocol.limits import MAX_VALUE_DEPTH

MSGPACK = {"content-type": "application/vnd.msgpack"}
pack = msgspec.msgpack.encode


async def _read(http: httpx.AsyncClient, topic: str, partition: int = 0) -> list[dict[str, Any]]:
    answer = await http.get(
        f"/v1/topics/{topic}/partitions/{partition}/messages", params={"offset": 0}
    )
    assert answer.status_code == 200, answer.text
    messages: list[dict[str, Any]] = answer.json()["messages"]
    return messages


def _stored(record: dict[str, Any]) -> dict[str, Any]:
    """What a record holds, without where and when it was appended."""
    return {k: v for k, v in record.items() if k not in ("id", "offset", "timestamp", "topic")}


async def test_a_msgpack_body_makes_the_records_its_json_twin_makes(
    http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    payload = bytes(range(256)) * 4
    packed = [
        {"value": payload, "key": "k", "headers": {"h": "v"}},
        {"value_json": '{ "a" : [1, 2.5, null, "é"], "big": 18446744073709551615 }'},
        {"value_json": "null", "partition": 0, "id": "dedup-1"},
        {"value": b""},
        {"value_json": '"text"', "delay_ms": 0},
    ]
    as_json = [
        {"value_b64": base64.b64encode(payload).decode(), "key": "k", "headers": {"h": "v"}},
        {"value": {"a": [1, 2.5, None, "é"], "big": 18446744073709551615}},
        {"value": None, "partition": 0, "id": "dedup-2"},
        {"value_b64": ""},
        {"value": "text", "delay_ms": 0},
    ]
    packed_topic, json_topic = unique("mp"), unique("mp")
    answer = await http.post(
        f"/v1/topics/{packed_topic}/messages", content=pack({"messages": packed}), headers=MSGPACK
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert [r["offset"] for r in answer.json()["results"]] == [0, 1, 2, 3, 4]
    answer = await http.post(f"/v1/topics/{json_topic}/messages", json={"messages": as_json})
    assert answer.status_code == 200, answer.text

    stored = [_stored(r) for r in await _read(http, packed_topic)]
    assert stored == [_stored(r) for r in await _read(http, json_topic)]
    assert base64.b64decode(stored[0]["value_b64"]) == payload
    assert stored[1]["value"] == {"a": [1, 2.5, None, "é"], "big": 18446744073709551615}


@pytest.mark.parametrize(
    "content_type",
    ["application/msgpack", "application/x-msgpack", "Application/VND.MsgPack; charset=binary"],
)
async def test_each_msgpack_media_type_is_read_as_msgpack(
    http: httpx.AsyncClient, unique: Callable[[str], str], content_type: str
) -> None:
    topic = unique("mp")
    body = pack({"messages": [{"value": b"\x00\xff"}]})
    answer = await http.post(
        f"/v1/topics/{topic}/messages", content=body, headers={"content-type": content_type}
    )
    assert answer.status_code == 200, answer.text
    [record] = await _read(http, topic)
    assert record["value_b64"] == "AP8="


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


REFUSED: list[tuple[str, bytes, int, str, int | None]] = [
    # (what, body, status, code, index)
    ("not msgpack", b"\xc1", 400, "bad_request", None),
    ("empty", b"", 400, "bad_request", None),
    ("trailing bytes", pack({"messages": [{"value": b"x"}]}) + b"\x00", 400, "bad_request", None),
    ("JSON text", b'{"messages":[{"value":1}]}', 400, "bad_request", None),
    ("nested past any depth", b"\x81\xa8messages" + b"\x91" * 100_000 + b"\xc0", 400, "bad_request", None),
    ("not a map", pack([1]), 400, "bad_request", None),
    ("no messages", pack({"messages": []}), 400, "validation_error", None),
    ("an unknown member", pack({"messages": [{"value": b"x"}], "colour": 1}), 400, "bad_request", None),
    ("value as str", pack({"messages": [{"value": b"x"}, {"value": "x"}]}), 400, "bad_request", 1),
    ("value as a map", pack({"messages": [{"value": {"a": 1}}]}), 400, "bad_request", 0),
    ("value_json as bin", pack({"messages": [{"value_json": b"1"}]}), 400, "bad_request", 0),
    ("both", pack({"messages": [{"value": b"x", "value_json": "1"}]}), 400, "bad_request", 0),
    ("neither", pack({"messages": [{"value": b"x"}, {"key": "k"}]}), 400, "bad_request", 1),
    ("value_json not JSON", pack({"messages": [{"value_json": "{"}]}), 400, "bad_request", 0),
    ("value_json NaN", pack({"messages": [{"value_json": "NaN"}]}), 400, "bad_request", 0),
    (
        "value_json too deep",
        pack({"messages": [{"value_json": _deep_json(MAX_VALUE_DEPTH + 1)}]}),
        400,
        "validation_error",
        0,
    ),
    ("an integer past 64 bits", pack({"messages": [{"value_json": str(2**70)}]}), 400, "validation_error", 0),
    ("a float partition", pack({"messages": [{"value": b"x", "partition": 0.0}]}), 400, "bad_request", 0),
    ("a partition it lacks", pack({"messages": [{"value": b"x"}, {"value": b"x", "partition": 7}]}), 400, "validation_error", 1),
    ("a header not a str", pack({"messages": [{"value": b"x", "headers": {"h": 1}}]}), 400, "bad_request", 0),
    ("a negative delay", pack({"messages": [{"value": b"x", "delay_ms": -1}]}), 400, "validation_error", 0),
    ("a timestamp extension", b"\x81\xa8messages\x91\x81\xa5value\xd6\xff\x00\x00\x00\x00", 400, "bad_request", 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "body", "status", "code", "index"), REFUSED, ids=[r[0] for r in REFUSED]
)
async def test_a_bad_msgpack_body_is_refused_with_its_problem_and_appends_nothing(
    http: httpx.AsyncClient,
    unique: Callable[[str], str],
    what: str,
    body: bytes,
    status: int,
    code: str,
    index: int | None,
) -> None:
    topic = unique("mp")
    created = await http.put(f"/v1/topics/{topic}", json={"partitions": 1})
    assert created.status_code in (200, 201), created.text
    answer = await http.post(f"/v1/topics/{topic}/messages", content=body, headers=MSGPACK)
    assert answer.status_code == status, (what, answer.text)
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == code, (what, problem)
    assert problem.get("index") == index, (what, problem)
    assert await _read(http, topic) == []


async def test_a_message_over_max_message_bytes_is_413_at_its_index(
    http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    topic = unique("mp")
    limit = 1024 * 1024  # the default max_message_bytes (PROTOCOL §2)
    body = pack({"messages": [{"value": b"x"}, {"value": b"x" * (limit + 1)}]})
    answer = await http.post(f"/v1/topics/{topic}/messages", content=body, headers=MSGPACK)
    assert answer.status_code == 413, answer.text
    assert answer.json()["code"] == "message_too_large"
    assert answer.json()["index"] == 1


async def test_a_msgpack_body_sent_as_json_is_not_json(
    http: httpx.AsyncClient, unique: Callable[[str], str]
) -> None:
    """Only the Content-Type makes a body msgpack: without it the body is read as JSON."""
    topic = unique("mp")
    body = pack({"messages": [{"value_json": "1"}]})
    for headers in ({}, {"content-type": "application/json"}):
        answer = await http.post(f"/v1/topics/{topic}/messages", content=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "bad_request"
    json_answer = await http.post(
        f"/v1/topics/{topic}/messages", content=orjson.dumps({"messages": [{"value": 1}]})
    )
    assert json_answer.status_code == 200, json_answer.text
