"""POST /v1/topics/{topic}/messages (PROTOCOL §2 Publish) against a real server."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.helpers import wait_until_sync
from tests.server import assert_problem


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def read_all(http: httpx.Client, topic: str, partition: int = 0) -> list[dict[str, Any]]:
    response = http.get(
        f"/v1/topics/{topic}/partitions/{partition}/messages", params={"offset": 0, "limit": 10000}
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def end_offsets(http: httpx.Client, topic: str) -> list[int]:
    return [p["end_offset"] for p in http.get(f"/v1/topics/{topic}").json()["partitions"]]


def test_publish_auto_creates_and_answers_results_in_request_order(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("pub")
    response = http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": {"n": i}} for i in range(5)]},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "results": [{"partition": 0, "offset": i, "duplicate": False} for i in range(5)]
    }
    assert [m["value"] for m in read_all(http, topic)] == [{"n": i} for i in range(5)]


def test_records_come_back_in_the_form_they_were_published(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("forms")
    raw = bytes(range(256))
    messages = [
        {"value": None},
        {"value": "text", "key": "k1", "headers": {"h": "v", "é": "ü"}},
        {"value_b64": base64.b64encode(raw).decode()},
        {"value_b64": ""},
        {"value": [1.5, {"a": True}], "key": None},
    ]
    assert http.post(f"/v1/topics/{topic}/messages", json={"messages": messages}).status_code == 200
    records = read_all(http, topic)
    assert len(records) == 5
    for offset, record in enumerate(records):
        assert record["topic"] == topic
        assert record["id"] == f"0-{offset}"
        assert (record["partition"], record["offset"]) == (0, offset)
        assert isinstance(record["timestamp"], int)
    assert "value" in records[0] and records[0]["value"] is None and "value_b64" not in records[0]
    assert records[1]["key"] == "k1" and records[1]["headers"] == {"h": "v", "é": "ü"}
    assert records[0]["key"] is None and records[0]["headers"] == {}
    assert base64.b64decode(records[2]["value_b64"]) == raw and "value" not in records[2]
    assert records[3]["value_b64"] == ""
    assert records[4]["value"] == [1.5, {"a": True}]
    timestamps = [r["timestamp"] for r in records]
    assert timestamps == sorted(timestamps)


def test_partition_choice_explicit_and_by_key(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("parts")
    http.put(f"/v1/topics/{topic}", json={"partitions": 4})
    explicit = http.post(
        f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1, "partition": 3}]}
    ).json()["results"]
    assert explicit[0]["partition"] == 3
    keyed = http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": i, "key": f"k{i % 3}"} for i in range(30)]},
    ).json()["results"]
    by_key: dict[str, set[int]] = {}
    for i, result in enumerate(keyed):
        by_key.setdefault(f"k{i % 3}", set()).add(result["partition"])
    assert all(len(parts) == 1 for parts in by_key.values())
    again = http.post(
        f"/v1/topics/{topic}/messages", json={"messages": [{"value": 0, "key": "k0"}]}
    )
    assert {again.json()["results"][0]["partition"]} == by_key["k0"]


def test_keyless_batches_spread_over_partitions(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("spread")
    http.put(f"/v1/topics/{topic}", json={"partitions": 3})
    used = set()
    for _ in range(6):
        results = http.post(
            f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}]}
        ).json()["results"]
        used.add(results[0]["partition"])
    assert used == {0, 1, 2}


@pytest.mark.parametrize("acks", ["1", "all"])
def test_acks_1_and_all_answer_200_after_the_append(
    http: httpx.Client, unique: Callable[[str], str], acks: str
) -> None:
    topic = unique("acks")
    response = http.post(
        f"/v1/topics/{topic}/messages?acks={acks}", json={"messages": [{"value": 1}] * 3}
    )
    assert response.status_code == 200
    assert end_offsets(http, topic) == [3]


def test_acks_0_answers_202_with_an_empty_body_and_appends(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("acks0")
    response = http.post(
        f"/v1/topics/{topic}/messages?acks=0", json={"messages": [{"value": 1}] * 3}
    )
    assert response.status_code == 202
    assert response.content == b""
    wait_until_sync(lambda: end_offsets(http, topic) == [3], what="the acks=0 records appended")


def test_acks_0_still_validates(http: httpx.Client, unique: Callable[[str], str]) -> None:
    topic = unique("acks0bad")
    body = assert_problem(
        http.post(f"/v1/topics/{topic}/messages?acks=0", json={"messages": [{"value": 1}, {}]}),
        400,
        "bad_request",
    )
    assert body["index"] == 1
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


@pytest.mark.parametrize("acks", ["2", "ALL", "", "-1"])
def test_other_acks_values_are_bad_request(
    http: httpx.Client, unique: Callable[[str], str], acks: str
) -> None:
    topic = unique("badacks")
    assert_problem(
        http.post(
            f"/v1/topics/{topic}/messages", params={"acks": acks}, json={"messages": [{"value": 1}]}
        ),
        400,
        "bad_request",
    )
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_duplicate_ids_are_not_appended_again(
    http: httpx.Client, unique: Callable[[str], str], acks: str
) -> None:
    topic = unique("dedup")
    http.put(f"/v1/topics/{topic}")
    first = http.post(
        f"/v1/topics/{topic}/messages", json={"messages": [{"value": "a", "id": "m1"}]}
    )
    assert first.json()["results"] == [{"partition": 0, "offset": 0, "duplicate": False}]
    batch = {
        "messages": [
            {"value": "b", "id": "m2"},
            {"value": "a", "id": "m1"},
            {"value": "b", "id": "m2"},
        ]
    }
    response = http.post(f"/v1/topics/{topic}/messages?acks={acks}", json=batch)
    if acks == "0":
        assert response.status_code == 202
        wait_until_sync(lambda: end_offsets(http, topic) == [2], what="the records appended")
    else:
        assert response.json()["results"] == [
            {"partition": 0, "offset": 1, "duplicate": False},
            {"partition": 0, "offset": 0, "duplicate": True},
            {"partition": 0, "offset": 1, "duplicate": True},
        ]
    assert [m["value"] for m in read_all(http, topic)] == ["a", "b"]
    topic_body = http.get(f"/v1/topics/{topic}").json()
    assert topic_body["messages_total"] == 2  # duplicates are not counted as published


def _nested(depth: int) -> Any:
    """An array nested ``depth`` levels deep: [[…[]…]]."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


BAD_MESSAGES: list[tuple[Any, int, str]] = [
    ({}, 400, "bad_request"),
    ({"value": 1, "value_b64": "AA=="}, 400, "bad_request"),
    ({"value_b64": "%%%"}, 400, "bad_request"),
    ({"value": 1, "key": 1}, 400, "bad_request"),
    ({"value": 1, "headers": {"a": 1}}, 400, "bad_request"),
    ({"value": 1, "headers": "h"}, 400, "bad_request"),
    ({"value": 1, "partition": 1.5}, 400, "bad_request"),
    ({"value": 1, "partition": True}, 400, "bad_request"),
    ({"value": 1, "partition": -1}, 400, "validation_error"),
    # PROTOCOL §2: a partition the topic does not have is a number out of range.
    ({"value": 1, "partition": 1}, 400, "validation_error"),
    ({"value": 1, "partition": 1024}, 400, "validation_error"),
    # docs/protocol.md "Requests": what orjson cannot store exactly is refused.
    ({"value": _nested(255)}, 400, "validation_error"),
    ({"value": {"n": 2**64}}, 400, "validation_error"),
    ({"value": -(2**63) - 1}, 400, "validation_error"),
    ({"value": 1, "id": ""}, 400, "validation_error"),
    ({"value": 1, "id": "x" * 129}, 400, "validation_error"),
    ({"value": 1, "ttl": 5}, 400, "bad_request"),
    ({"value": "x" * (1024 * 1024)}, 413, "message_too_large"),
    (5, 400, "bad_request"),
]


@pytest.mark.parametrize(("message", "status", "code"), BAD_MESSAGES)
def test_one_bad_message_rejects_the_batch_with_its_index(
    http: httpx.Client, unique: Callable[[str], str], message: Any, status: int, code: str
) -> None:
    topic = unique("batch")
    http.put(f"/v1/topics/{topic}")
    http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": "before"}]})
    batch = {"messages": [{"value": 1}, {"value": 2}, message, {"value": {}}, {}]}
    body = assert_problem(http.post(f"/v1/topics/{topic}/messages", json=batch), status, code)
    assert body["index"] == 2
    assert [m["value"] for m in read_all(http, topic)] == [
        "before"
    ]  # nothing changed, nothing lost


def test_bad_message_on_a_missing_topic_creates_nothing(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("nocreate")
    for message, status, code in BAD_MESSAGES:
        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", json={"messages": [message]}), status, code
        )
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


def test_message_exactly_at_the_limit_is_accepted(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("limit")
    # 1 MiB = 2 quotes + payload + key + header name and value
    key, headers = "kk", {"h": "vv"}
    payload = "x" * (1024 * 1024 - 2 - 2 - 3)
    ok = http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": payload, "key": key, "headers": headers}]},
    )
    assert ok.status_code == 200
    over = http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": payload + "x", "key": key, "headers": headers}]},
    )
    assert_problem(over, 413, "message_too_large")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_request"),
        (b"", 400, "bad_request"),
        (b"[]", 400, "bad_request"),
        (b"{}", 400, "bad_request"),
        (b'{"messages":{}}', 400, "bad_request"),
        (b'{"messages":[]}', 400, "validation_error"),
        (b'{"messages":[{"value":1}],"acks":"all"}', 400, "bad_request"),
    ],
)
def test_malformed_batches(
    http: httpx.Client, unique: Callable[[str], str], body: bytes, status: int, code: str
) -> None:
    topic = unique("malformed")
    assert_problem(http.post(f"/v1/topics/{topic}/messages", content=body), status, code)
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


def test_batch_of_10001_is_validation_error_and_10000_is_fine(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("big")
    assert_problem(
        http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}] * 10001}),
        400,
        "validation_error",
    )
    response = http.post(
        f"/v1/topics/{topic}/messages?acks=1",
        json={"messages": [{"value": i} for i in range(10000)]},
    )
    assert response.status_code == 200
    assert [r["offset"] for r in response.json()["results"]] == list(range(10000))


def test_body_over_max_request_bytes_is_payload_too_large(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    server = herald_factory("--max-request-bytes", "1000")
    topic = unique("payload")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        small = {"messages": [{"value": "x" * 100}]}
        assert http.post(f"/v1/topics/{topic}/messages", json=small).status_code == 200
        big = {"messages": [{"value": "x" * 2000}]}
        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", json=big), 413, "payload_too_large"
        )

        # Chunked, no Content-Length: counted while streaming, refused past the cap.
        def chunks() -> Iterator[bytes]:
            yield b'{"messages":[{"value":"'
            for _ in range(100):
                yield b"x" * 100
            yield b'"}]}'

        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", content=chunks()), 413, "payload_too_large"
        )
        assert end_offsets(http, topic) == [1]


def test_no_auto_create_answers_topic_not_found(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    server = herald_factory("--no-auto-create")
    topic = unique("noauto")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}]}),
            404,
            "topic_not_found",
        )
        assert_problem(
            http.put(f"/v1/subscriptions/{unique('s')}", json={"topic": topic}),
            404,
            "topic_not_found",
        )
        assert http.get("/v1/topics").json()["topics"] == []
        assert http.put(f"/v1/topics/{topic}").status_code == 201
        assert (
            http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}]}).status_code
            == 200
        )


# The publish path is served ahead of Starlette's router (server/publish.py): the
# same ids, limits, errors and routing answers as every other route.


def test_publish_echoes_or_makes_a_request_id(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    path = f"/v1/topics/{unique('rid')}/messages"
    given = http.post(path, json={"messages": [{"value": 1}]}, headers={"x-request-id": "p-1"})
    assert given.status_code == 200
    assert given.headers["x-request-id"] == "p-1"
    made = http.post(path, json={"messages": [{"value": 2}]})
    assert len(made.headers["x-request-id"]) >= 16
    refused = http.post(path, json={"messages": []}, headers={"x-request-id": "p-2"})
    assert_problem(refused, 400, "validation_error")
    assert refused.headers["x-request-id"] == "p-2"


def test_publish_path_edges_go_to_the_router(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    body = {"messages": [{"value": 1}]}
    assert_problem(http.post("/v1/topics//messages", json=body), 404, "not_found")
    assert_problem(http.post("/v1/topics/a/b/messages", json=body), 404, "not_found")
    response = http.put(f"/v1/topics/{unique('edge')}/messages", json=body)
    assert_problem(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"


def test_percent_encoded_topic_names_are_decoded_then_checked(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic = unique("enc")
    encoded = topic.replace("-", "%2D")
    response = http.post(f"/v1/topics/{encoded}/messages", json={"messages": [{"value": 1}]})
    assert response.status_code == 200, response.text
    assert [m["value"] for m in read_all(http, topic)] == [1]
    bad = http.post("/v1/topics/a%20b/messages", json={"messages": [{"value": 1}]})
    assert_problem(bad, 400, "invalid_name")


def test_the_last_acks_parameter_wins(http: httpx.Client, unique: Callable[[str], str]) -> None:
    path = f"/v1/topics/{unique('acks')}/messages?acks=2&acks=0"
    response = http.post(path, json={"messages": [{"value": 1}]})
    assert response.status_code == 202
    assert response.content == b""
    assert response.headers["content-length"] == "0"


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("acks=1", 200),
        ("&&acks=1&", 200),  # empty parts are skipped
        ("acks=%61ll", 200),  # percent-encoded "all"
        ("trace=a+b&acks=0", 202),  # a "+" elsewhere: decoded as a space, still acks=0
        ("acks=0;acks=1", 400),  # ";" separates nothing: one value, "0;acks=1"
        ("acks", 400),  # no "=": a blank value, not one of 0, 1, all
        ("acks=", 400),
    ],
)
def test_the_acks_parameter_is_read_as_a_query_string_parser_reads_it(
    http: httpx.Client, unique: Callable[[str], str], query: str, status: int
) -> None:
    response = http.post(
        f"/v1/topics/{unique('query')}/messages?{query}", json={"messages": [{"value": 1}]}
    )
    if status == 400:
        assert_problem(response, 400, "bad_request")
    else:
        assert response.status_code == status, response.text
