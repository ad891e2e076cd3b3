"""PUT/GET/DELETE /v1/topics (PROTOCOL §2) against a real server."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.server import assert_problem

DEFAULT_CONFIG = {
    "partitions": 1,
    "retention_ms": 1209600000,
    "retention_bytes": None,
    "dedup_window_ms": 120000,
    "replication_factor": 1,  # PROTOCOL §7: a single node shows them as 1
    "min_insync_replicas": 1,
}


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def test_create_topic_with_defaults_answers_201_with_the_get_body(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    name = unique("t")
    created = http.put(f"/v1/topics/{name}")
    assert created.status_code == 201
    body = created.json()
    assert body == {
        "name": name,
        "config": DEFAULT_CONFIG,
        "partitions": [
            {
                "partition": 0,
                "start_offset": 0,
                "end_offset": 0,
                "bytes": body["partitions"][0]["bytes"],
                "leader": "local",  # PROTOCOL §7: a single node leads all, alone
                "epoch": 0,
                "replicas": ["local"],
                "isr": ["local"],
            }
        ],
        "messages_total": 0,
        "bytes_total": 0,
        "auto_created": False,  # docs/protocol.md: made by a PUT, not a publish
    }
    assert http.get(f"/v1/topics/{name}").json() == body


def test_put_again_is_200_when_given_fields_match_and_409_otherwise(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    name = unique("t")
    config = {
        "partitions": 3,
        "retention_ms": None,
        "retention_bytes": 2097152,
        "dedup_window_ms": 5000,
    }
    assert http.put(f"/v1/topics/{name}", json=config).status_code == 201
    assert http.put(f"/v1/topics/{name}", json=config).status_code == 200
    assert http.put(f"/v1/topics/{name}", json={"partitions": 3}).status_code == 200
    assert http.put(f"/v1/topics/{name}").status_code == 200  # nothing given, nothing differs
    assert http.put(f"/v1/topics/{name}", json={}).status_code == 200
    assert (
        http.put(f"/v1/topics/{name}", json={"partitions": None}).status_code == 200
    )  # null == absent
    assert_problem(http.put(f"/v1/topics/{name}", json={"partitions": 4}), 409, "topic_conflict")
    # retention null means unlimited, so it is compared
    assert_problem(
        http.put(f"/v1/topics/{name}", json={"retention_bytes": None}), 409, "topic_conflict"
    )
    single_node = {"replication_factor": 1, "min_insync_replicas": 1}
    assert http.get(f"/v1/topics/{name}").json()["config"] == {**config, **single_node}


def test_list_topics(http: httpx.Client, unique: Callable[[str], str]) -> None:
    names = sorted(unique("list") for _ in range(3))
    for name in names:
        http.put(f"/v1/topics/{name}", json={"partitions": 2})
    listed = {t["name"]: t["config"] for t in http.get("/v1/topics").json()["topics"]}
    for name in names:
        assert listed[name] == {**DEFAULT_CONFIG, "partitions": 2}


def test_delete_topic_answers_204_and_deletes_its_subscriptions(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    name, sub = unique("t"), unique("s")
    http.put(f"/v1/topics/{name}")
    assert http.put(f"/v1/subscriptions/{sub}", json={"topic": name}).status_code == 201
    assert http.delete(f"/v1/topics/{name}").status_code == 204
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "topic_not_found")
    assert_problem(http.get(f"/v1/subscriptions/{sub}"), 404, "subscription_not_found")
    assert_problem(http.delete(f"/v1/topics/{name}"), 404, "topic_not_found")
    # the name is free again, and the new topic starts empty
    assert http.put(f"/v1/topics/{name}").status_code == 201
    assert http.get(f"/v1/topics/{name}").json()["partitions"][0]["end_offset"] == 0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{", 400, "bad_request"),
        (b"[]", 400, "bad_request"),
        (b'"x"', 400, "bad_request"),
        (b'{"partitions":"2"}', 400, "bad_request"),
        (b'{"partitions":1.5}', 400, "bad_request"),
        (b'{"partitions":true}', 400, "bad_request"),
        (b'{"partitions":0}', 400, "validation_error"),
        (b'{"partitions":1025}', 400, "validation_error"),
        (b'{"retention_ms":999}', 400, "validation_error"),
        (b'{"retention_bytes":1048575}', 400, "validation_error"),
        (b'{"dedup_window_ms":604800001}', 400, "validation_error"),
        (b'{"dedup_window_ms":999}', 400, "validation_error"),
        (b'{"partitons":2}', 400, "bad_request"),
    ],
)
def test_bad_topic_configs_are_refused_and_create_nothing(
    http: httpx.Client, unique: Callable[[str], str], body: bytes, status: int, code: str
) -> None:
    name = unique("bad")
    assert_problem(http.put(f"/v1/topics/{name}", content=body), status, code)
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "topic_not_found")


@pytest.mark.parametrize("name", [".dot", "-dash", "a%20b", "x" * 250, "%C3%A9"])
def test_bad_topic_names_are_invalid_name(http: httpx.Client, name: str) -> None:
    assert_problem(http.put(f"/v1/topics/{name}"), 400, "invalid_name")
    assert_problem(http.get(f"/v1/topics/{name}"), 400, "invalid_name")
    assert_problem(
        http.post(f"/v1/topics/{name}/messages", json={"messages": [{"value": 1}]}),
        400,
        "invalid_name",
    )


def test_longest_valid_name_works(http: httpx.Client) -> None:
    name = "L" + "x" * 248
    assert http.put(f"/v1/topics/{name}").status_code in (200, 201)
    assert http.get(f"/v1/topics/{name}").json()["name"] == name


def test_missing_topic_is_topic_not_found(http: httpx.Client, unique: Callable[[str], str]) -> None:
    name = unique("missing")
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "topic_not_found")
    assert_problem(http.get(f"/v1/topics/{name}/partitions/0/messages"), 404, "topic_not_found")
    assert_problem(http.delete(f"/v1/topics/{name}"), 404, "topic_not_found")
    # reading never auto-creates
    assert_problem(http.get(f"/v1/topics/{name}"), 404, "topic_not_found")
