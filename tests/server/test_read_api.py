"""GET /v1/topics/{topic}/partitions/{p}/messages (PROTOCOL §2 Read) against a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.server import assert_problem


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=60) as client:
        yield client


@pytest.fixture
def topic(http: httpx.Client, unique: Callable[[str], str]) -> str:
    """A two-partition topic with records 0..9 in partition 0 and none in partition 1."""
    name = unique("read")
    http.put(f"/v1/topics/{name}", json={"partitions": 2})
    messages = [{"value": i, "partition": 0} for i in range(10)]
    assert http.post(f"/v1/topics/{name}/messages", json={"messages": messages}).status_code == 200
    return name


def read(http: httpx.Client, topic: str, partition: int = 0, **params: object) -> httpx.Response:
    return http.get(f"/v1/topics/{topic}/partitions/{partition}/messages", params=params)


def test_read_from_start_by_default(http: httpx.Client, topic: str) -> None:
    body = read(http, topic).json()
    assert [m["value"] for m in body["messages"]] == list(range(10))
    assert body["next_offset"] == 10


def test_read_by_offset_and_limit(http: httpx.Client, topic: str) -> None:
    body = read(http, topic, offset=3, limit=4).json()
    assert [m["offset"] for m in body["messages"]] == [3, 4, 5, 6]
    assert body["next_offset"] == 7
    assert [m["id"] for m in body["messages"]] == ["0-3", "0-4", "0-5", "0-6"]


def test_read_at_the_end_is_empty_with_next_offset_the_end(http: httpx.Client, topic: str) -> None:
    assert read(http, topic, offset=10).json() == {"messages": [], "next_offset": 10}
    assert read(http, topic, 1).json() == {"messages": [], "next_offset": 0}


def test_read_by_timestamp(http: httpx.Client, topic: str) -> None:
    time.sleep(0.01)
    cutoff = int(time.time() * 1000) + 1
    time.sleep(0.01)
    http.post(
        f"/v1/topics/{topic}/messages", json={"messages": [{"value": "late", "partition": 0}]}
    )
    body = read(http, topic, timestamp=cutoff).json()
    assert [m["value"] for m in body["messages"]] == ["late"]
    assert body["next_offset"] == 11
    assert len(read(http, topic, timestamp=0).json()["messages"]) == 11
    assert read(http, topic, timestamp=cutoff + 10**9).json() == {"messages": [], "next_offset": 11}


async def test_long_poll_returns_when_a_record_arrives(
    shared_herald: HeraldProcess, topic: str
) -> None:
    async with httpx.AsyncClient(base_url=shared_herald.url, timeout=60) as client:
        started = time.monotonic()
        poll = asyncio.create_task(
            client.get(
                f"/v1/topics/{topic}/partitions/1/messages", params={"offset": 0, "wait_ms": 20000}
            )
        )
        await asyncio.sleep(0.3)
        assert not poll.done()
        await client.post(
            f"/v1/topics/{topic}/messages", json={"messages": [{"value": "now", "partition": 1}]}
        )
        body = (await poll).json()
        assert [m["value"] for m in body["messages"]] == ["now"]
        assert time.monotonic() - started < 10


def test_long_poll_times_out_empty(http: httpx.Client, topic: str) -> None:
    started = time.monotonic()
    assert read(http, topic, 1, wait_ms=300).json() == {"messages": [], "next_offset": 0}
    assert time.monotonic() - started >= 0.25  # it waited (no bound on a loaded host)


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"offset": "abc"}, "bad_request"),
        ({"offset": "1.5"}, "bad_request"),
        ({"offset": 1, "timestamp": 1}, "bad_request"),
        ({"offset": -1}, "validation_error"),
        ({"limit": 0}, "validation_error"),
        ({"limit": 10001}, "validation_error"),
        ({"limit": "x"}, "bad_request"),
        ({"wait_ms": 30001}, "validation_error"),
        ({"wait_ms": -1}, "validation_error"),
        ({"timestamp": "yesterday"}, "bad_request"),
        ({"offset": 11}, "offset_out_of_range"),
    ],
)
def test_bad_read_parameters(
    http: httpx.Client, topic: str, params: dict[str, object], code: str
) -> None:
    assert_problem(read(http, topic, **params), 400, code)


def test_missing_partition_is_partition_not_found(http: httpx.Client, topic: str) -> None:
    assert_problem(read(http, topic, 2), 404, "partition_not_found")
    assert_problem(
        http.get(f"/v1/topics/{topic}/partitions/-1/messages"), 404, "partition_not_found"
    )
    assert_problem(http.get(f"/v1/topics/{topic}/partitions/x/messages"), 400, "bad_request")


def test_read_limit_10000(http: httpx.Client, unique: Callable[[str], str]) -> None:
    name = unique("many")
    http.post(
        f"/v1/topics/{name}/messages?acks=1",
        json={"messages": [{"value": i} for i in range(10000)]},
    )
    body = read(http, name, limit=10000).json()
    assert len(body["messages"]) == 10000 and body["next_offset"] == 10000
