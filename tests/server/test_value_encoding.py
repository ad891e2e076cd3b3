"""A published `value` is stored exactly or refused, never changed and never a 500
(PROTOCOL §1, §2; docs/protocol.md "Requests": depth and 64-bit integers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from herald.protocol.limits import MAX_VALUE_DEPTH, MAX_VALUE_INT, MIN_VALUE_INT
from tests.conftest import HeraldProcess
from tests.server import assert_problem


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def nested(depth: int) -> str:
    """JSON text of arrays nested ``depth`` levels deep, with a 1 in the innermost."""
    return "[" * depth + "1" + "]" * depth


def publish_text(http: httpx.Client, topic: str, messages: list[str]) -> httpx.Response:
    body = '{"messages":[' + ",".join(messages) + "]}"
    return http.post(
        f"/v1/topics/{topic}/messages", content=body, headers={"content-type": "application/json"}
    )


def read_values(http: httpx.Client, topic: str) -> list[Any]:
    response = http.get(f"/v1/topics/{topic}/partitions/0/messages", params={"offset": 0})
    assert response.status_code == 200, response.text
    # The standard library reads every integer exactly (httpx's .json() does too).
    return [m["value"] for m in json.loads(response.text)["messages"]]


def test_a_value_nested_to_the_limit_is_stored_and_read_back_equal(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("deep")
    assert MAX_VALUE_DEPTH == 254
    deepest = nested(MAX_VALUE_DEPTH)
    response = publish_text(http, topic, [f'{{"value":{deepest}}}'])
    assert response.status_code == 200, response.text
    assert read_values(http, topic) == [json.loads(deepest)]


@pytest.mark.parametrize("depth", [255, 256, 1000, 1021])
def test_a_value_nested_deeper_is_refused_with_its_index_and_nothing_is_appended(
    http: httpx.Client, unique: Callable[[str], str], depth: int
) -> None:
    topic = unique("deeper")
    assert publish_text(http, topic, ['{"value":"before"}']).status_code == 200
    response = publish_text(
        http, topic, ['{"value":1}', f'{{"value":{nested(depth)},"key":"k"}}', '{"value":2}']
    )
    body = assert_problem(response, 400, "validation_error")
    assert body["index"] == 1
    assert str(MAX_VALUE_DEPTH) in body["detail"]
    assert read_values(http, topic) == ["before"]


@pytest.mark.parametrize("value", [nested(5000), "9" * 5000, "1e400"])
def test_a_body_the_json_parser_cannot_read_is_a_bad_request(
    http: httpx.Client, unique: Callable[[str], str], value: str
) -> None:
    """Deeper than 1024 levels, or a number past a double's range: not JSON to the server."""
    topic = unique("unreadable")
    response = publish_text(http, topic, [f'{{"value":{value}}}'])
    assert_problem(response, 400, "bad_request")
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


def test_integers_at_the_64_bit_bounds_are_kept_exact(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("ints")
    values = [MIN_VALUE_INT, MAX_VALUE_INT, 2**63, {"a": [MAX_VALUE_INT]}]
    response = publish_text(http, topic, [json.dumps({"value": v}) for v in values])
    assert response.status_code == 200, response.text
    assert read_values(http, topic) == values


@pytest.mark.parametrize(
    "text",
    [
        str(MAX_VALUE_INT + 1),
        str(MIN_VALUE_INT - 1),
        '{"big":[' + str(10**30) + "]}",
        "9" * 300,
        "-" + "9" * 25,
    ],
)
def test_integers_beyond_64_bits_are_refused_not_rounded(
    http: httpx.Client, unique: Callable[[str], str], text: str
) -> None:
    topic = unique("bigint")
    assert publish_text(http, topic, ['{"value":"before"}']).status_code == 200
    response = publish_text(http, topic, ['{"value":1.5}', f'{{"value":{text}}}'])
    body = assert_problem(response, 400, "validation_error")
    assert body["index"] == 1
    assert read_values(http, topic) == ["before"]


def test_large_floats_and_look_alike_strings_are_still_stored(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    """The check that rereads a body exactly must not refuse real floats or strings."""
    topic = unique("floats")
    messages = [
        '{"value":1e19}',
        '{"value":-2.5e300}',
        '{"value":"9e+19 and 1e+400"}',
        '{"value":[1.8446744073709552e19, 12]}',
    ]
    response = publish_text(http, topic, messages)
    assert response.status_code == 200, response.text
    assert read_values(http, topic) == [
        1e19,
        -2.5e300,
        "9e+19 and 1e+400",
        [1.8446744073709552e19, 12],
    ]
