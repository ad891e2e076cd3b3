"""PUT/GET/DELETE /v1/subscriptions and seek (PROTOCOL §2, §5 stats) against a real server."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.server import assert_problem

DEFAULT_CONFIG = {
    "start": "latest",
    "delivery": "at_least_once",
    "ack_deadline_ms": 30000,
    "max_in_flight": 1000,
    "max_deliveries": 5,
    "retry_backoff": {"min_ms": 100, "max_ms": 60000},
    "dead_letter_topic": None,
    "ordered_by_key": False,
    "push": None,
    "filter": None,  # PROTOCOL §8
}
STATS_KEYS = {
    "backlog",
    "in_flight",
    "consumers",
    "delivered_total",
    "redelivered_total",
    "acked_total",
    "dead_lettered_total",
    "expired_total",
    "filtered_total",
    "delayed",  # PROTOCOL §8 delayed delivery
    "partitions",
}
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef").decode()


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def test_create_fills_defaults_and_shows_stats(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, name = unique("t"), unique("s")
    http.put(f"/v1/topics/{topic}", json={"partitions": 2})
    created = http.put(f"/v1/subscriptions/{name}", json={"topic": topic})
    assert created.status_code == 201
    body = created.json()
    assert body["name"] == name
    assert body["config"] == {"topic": topic, **DEFAULT_CONFIG}
    assert set(body["stats"]) >= STATS_KEYS
    got = http.get(f"/v1/subscriptions/{name}").json()
    assert got["config"] == body["config"]
    assert sorted(p["partition"] for p in got["stats"]["partitions"]) == [0, 1]


def test_create_auto_creates_the_topic(http: httpx.Client, unique: Callable[[str], str]) -> None:
    topic, name = unique("t"), unique("s")
    assert http.put(f"/v1/subscriptions/{name}", json={"topic": topic}).status_code == 201
    assert http.get(f"/v1/topics/{topic}").status_code == 200


def test_put_again_compares_only_the_fields_given_and_never_start(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, name = unique("t"), unique("s")
    config = {
        "topic": topic,
        "start": "earliest",
        "ack_deadline_ms": 5000,
        "max_deliveries": 0,
        "retry_backoff": {"min_ms": 10, "max_ms": 1000},
        "dead_letter_topic": unique("dlq"),
        "ordered_by_key": True,
    }
    assert http.put(f"/v1/subscriptions/{name}", json=config).status_code == 201
    assert http.put(f"/v1/subscriptions/{name}", json=config).status_code == 200
    assert http.put(f"/v1/subscriptions/{name}", json={"topic": topic}).status_code == 200
    assert (
        http.put(f"/v1/subscriptions/{name}", json={**config, "start": "latest"}).status_code == 200
    )
    assert (
        http.put(f"/v1/subscriptions/{name}", json={"topic": topic, "push": None}).status_code
        == 200
    )
    for change in (
        {"ack_deadline_ms": 5001},
        {"ordered_by_key": False},
        {"delivery": "at_most_once"},
        {"retry_backoff": {"min_ms": 10}},
        {"topic": unique("other")},
    ):
        assert_problem(
            http.put(f"/v1/subscriptions/{name}", json={**config, **change}),
            409,
            "subscription_conflict",
        )
    got = http.get(f"/v1/subscriptions/{name}").json()["config"]
    assert got["start"] == "earliest" and got["ack_deadline_ms"] == 5000


def test_conflict_on_another_topic_creates_no_topic(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, other, name = unique("t"), unique("t"), unique("s")
    http.put(f"/v1/subscriptions/{name}", json={"topic": topic})
    assert_problem(
        http.put(f"/v1/subscriptions/{name}", json={"topic": other}), 409, "subscription_conflict"
    )
    assert_problem(http.get(f"/v1/topics/{other}"), 404, "topic_not_found")


def test_push_config_is_shown_without_its_secret(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, name = unique("t"), unique("s")
    push = {"url": "http://127.0.0.1:9/hook", "secret": SECRET}
    body = http.put(f"/v1/subscriptions/{name}", json={"topic": topic, "push": push}).json()
    assert body["config"]["push"] == {
        "url": "http://127.0.0.1:9/hook",
        "max_in_flight": 16,
        "timeout_ms": 10000,
        "breaker": {"failures": 5, "open_ms": 1000, "max_open_ms": 60000},
        "batch": {"max_records": 1, "max_wait_ms": 0},  # PROTOCOL §8 defaults
        "payload": "envelope",
    }
    assert SECRET not in http.get(f"/v1/subscriptions/{name}").text
    assert SECRET not in http.get("/v1/subscriptions").text


def test_list_subscriptions(http: httpx.Client, unique: Callable[[str], str]) -> None:
    topic = unique("t")
    names = [unique("s") for _ in range(3)]
    for name in names:
        http.put(f"/v1/subscriptions/{name}", json={"topic": topic})
    listed = {s["name"]: s["config"] for s in http.get("/v1/subscriptions").json()["subscriptions"]}
    for name in names:
        assert listed[name] == {"topic": topic, **DEFAULT_CONFIG}


def test_delete_subscription(http: httpx.Client, unique: Callable[[str], str]) -> None:
    name = unique("s")
    http.put(f"/v1/subscriptions/{name}", json={"topic": unique("t")})
    assert http.delete(f"/v1/subscriptions/{name}").status_code == 204
    assert_problem(http.get(f"/v1/subscriptions/{name}"), 404, "subscription_not_found")
    assert_problem(http.delete(f"/v1/subscriptions/{name}"), 404, "subscription_not_found")
    assert name not in {s["name"] for s in http.get("/v1/subscriptions").json()["subscriptions"]}


BAD_CONFIGS: list[tuple[Any, int, str]] = [
    (None, 400, "bad_request"),
    ([], 400, "bad_request"),
    ({}, 400, "bad_request"),
    ({"topic": 5}, 400, "bad_request"),
    ({"topic": "bad name"}, 400, "invalid_name"),
    ({"topic": "T", "start": "middle"}, 400, "bad_request"),
    ({"topic": "T", "start": {"timestamp": 1.5}}, 400, "bad_request"),
    ({"topic": "T", "delivery": "exactly_once"}, 400, "bad_request"),
    ({"topic": "T", "ack_deadline_ms": 99}, 400, "validation_error"),
    ({"topic": "T", "ack_deadline_ms": 600001}, 400, "validation_error"),
    ({"topic": "T", "max_in_flight": 0}, 400, "validation_error"),
    ({"topic": "T", "max_deliveries": 1001}, 400, "validation_error"),
    ({"topic": "T", "max_deliveries": "5"}, 400, "bad_request"),
    ({"topic": "T", "retry_backoff": {"min_ms": 200, "max_ms": 100}}, 400, "validation_error"),
    ({"topic": "T", "retry_backoff": {"max_ms": 3600001}}, 400, "validation_error"),
    ({"topic": "T", "retry_backoff": 5}, 400, "bad_request"),
    ({"topic": "T", "dead_letter_topic": "a/b"}, 400, "invalid_name"),
    ({"topic": "T", "ordered_by_key": "yes"}, 400, "bad_request"),
    ({"topic": "T", "push": {"url": "http://x"}}, 400, "bad_request"),
    ({"topic": "T", "push": {"url": "http://x", "secret": "nope"}}, 400, "bad_request"),
    (
        {"topic": "T", "push": {"url": "http://x", "secret": SECRET, "max_in_flight": 1001}},
        400,
        "validation_error",
    ),
    (
        {"topic": "T", "push": {"url": "http://x", "secret": SECRET, "retries": 1}},
        400,
        "bad_request",
    ),
    ({"topic": "T", "colour": "red"}, 400, "bad_request"),
    # A push URL is read by the parser that sends (httpx): one it cannot POST to is
    # refused here, never stored to fail at delivery (and never a 500).
    *[
        ({"topic": "T", "push": {"url": url, "secret": SECRET}}, 400, code)
        for url, code in (
            ("http://[::1", "bad_request"),
            ("http://a:b:c/", "bad_request"),
            ("http://exa\u0000mple.com/", "bad_request"),
            ("http://\ud7ff\uffff.com/", "bad_request"),
            ("http://ex ample.com/", "bad_request"),
            ("ftp://example.com/", "bad_request"),
            ("http:///path", "bad_request"),
            ("http://example.com:99999/", "validation_error"),
            ("http://example.com:0/", "validation_error"),
            ("http://a/" + "x" * 2048, "validation_error"),
        )
    ],
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_CONFIGS)
def test_bad_configs_are_refused_and_change_nothing(
    http: httpx.Client, unique: Callable[[str], str], body: Any, status: int, code: str
) -> None:
    name, topic = unique("s"), unique("t")
    if isinstance(body, dict) and body.get("topic") == "T":
        body = {**body, "topic": topic}
    content = b"" if body is None else httpx.Request("PUT", "/", json=body).content
    assert_problem(http.put(f"/v1/subscriptions/{name}", content=content), status, code)
    assert_problem(http.get(f"/v1/subscriptions/{name}"), 404, "subscription_not_found")
    assert_problem(http.get(f"/v1/topics/{topic}"), 404, "topic_not_found")


def test_bad_subscription_name(http: httpx.Client) -> None:
    assert_problem(http.put("/v1/subscriptions/.x", json={"topic": "t"}), 400, "invalid_name")
    assert_problem(http.get("/v1/subscriptions/.x"), 400, "invalid_name")


# ------------------------------------------------------------------ seek


@pytest.fixture
def subscription(http: httpx.Client, unique: Callable[[str], str]) -> str:
    topic, name = unique("t"), unique("s")
    http.put(f"/v1/topics/{topic}", json={"partitions": 2})
    http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": i, "partition": 0} for i in range(5)]},
    )
    assert (
        http.put(
            f"/v1/subscriptions/{name}", json={"topic": topic, "start": "earliest"}
        ).status_code
        == 201
    )
    return name


@pytest.mark.parametrize(
    "body",
    [
        {"to": "earliest"},
        {"to": "latest"},
        {"timestamp": 0},
        {"offsets": {"0": 3}},
        {"offsets": {"1": 99}},
    ],
)
def test_seek_forms_answer_200_with_the_get_body(
    http: httpx.Client, subscription: str, body: Any
) -> None:
    response = http.post(f"/v1/subscriptions/{subscription}/seek", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["name"] == subscription
    assert set(response.json()["stats"]) >= STATS_KEYS


def test_seek_to_latest_moves_the_ack_floor_to_the_end(
    http: httpx.Client, subscription: str
) -> None:
    body = http.post(f"/v1/subscriptions/{subscription}/seek", json={"to": "latest"}).json()
    floors = {p["partition"]: p["ack_floor"] for p in body["stats"]["partitions"]}
    assert floors == {0: 5, 1: 0}
    assert body["stats"]["backlog"] == 0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 400, "bad_request"),
        ({"to": "earliest", "timestamp": 5}, 400, "bad_request"),
        ({"to": "earliest", "offsets": {"0": 1}}, 400, "bad_request"),
        ({"to": "start"}, 400, "bad_request"),
        ({"timestamp": "now"}, 400, "bad_request"),
        ({"timestamp": 1.5}, 400, "bad_request"),
        ({"offsets": {"zero": 1}}, 400, "bad_request"),
        ({"offsets": {"0": -1}}, 400, "validation_error"),
        ({"offsets": [1]}, 400, "bad_request"),
        ({"offsets": {"2": 0}}, 404, "partition_not_found"),
        ({"whence": 1}, 400, "bad_request"),
    ],
)
def test_bad_seeks(
    http: httpx.Client, subscription: str, body: Any, status: int, code: str
) -> None:
    before = http.get(f"/v1/subscriptions/{subscription}").json()["stats"]["partitions"]
    assert_problem(http.post(f"/v1/subscriptions/{subscription}/seek", json=body), status, code)
    assert http.get(f"/v1/subscriptions/{subscription}").json()["stats"]["partitions"] == before


def test_seek_on_a_missing_subscription(http: httpx.Client, unique: Callable[[str], str]) -> None:
    assert_problem(
        http.post(f"/v1/subscriptions/{unique('s')}/seek", json={"to": "earliest"}),
        404,
        "subscription_not_found",
    )
