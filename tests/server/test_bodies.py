"""One rule for request bodies on every route (server/http.py; docs/protocol.md
"Requests"): no body (empty or whitespace) is the defaults where the body is optional
and bad_request elsewhere; JSON `null` is a body, refused where an object is expected."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.server import assert_problem

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def send(http: httpx.Client, method: str, path: str, text: str) -> httpx.Response:
    return http.request(method, path, content=text, headers={"content-type": "application/json"})


def test_a_null_body_is_refused_by_every_route_and_changes_nothing(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, sub, push = unique("t"), unique("s"), unique("p")
    assert http.put(f"/v1/subscriptions/{sub}", json={"topic": topic}).status_code == 201
    push_config = {"topic": topic, "push": {"url": "http://127.0.0.1:9/", "secret": SECRET}}
    assert http.put(f"/v1/subscriptions/{push}", json=push_config).status_code == 201
    fresh = unique("fresh")
    for method, path in (
        ("PUT", f"/v1/topics/{fresh}"),
        ("POST", f"/v1/topics/{fresh}/messages"),
        ("PUT", f"/v1/subscriptions/{unique('new')}"),
        ("POST", f"/v1/subscriptions/{sub}/seek"),
        ("POST", f"/v1/subscriptions/{sub}/redrive"),
        ("POST", f"/v1/subscriptions/{push}/push/rotate-secret"),
    ):
        problem = assert_problem(send(http, method, path, "null"), 400, "bad_request")
        assert "object" in problem["detail"], (path, problem)
    assert_problem(http.get(f"/v1/topics/{fresh}"), 404, "topic_not_found")


@pytest.mark.parametrize("empty", ["", "  \n"])
def test_no_body_is_the_defaults_where_the_body_is_optional(
    http: httpx.Client, unique: Callable[[str], str], empty: str
) -> None:
    topic = unique("t")
    created = send(http, "PUT", f"/v1/topics/{topic}", empty)
    assert created.status_code == 201, created.text
    assert created.json()["config"]["partitions"] == 1
    sub = unique("s")
    config = {"topic": topic, "dead_letter_topic": unique("dlq")}
    assert http.put(f"/v1/subscriptions/{sub}", json=config).status_code == 201
    # Redrive's body is optional too: it runs with its defaults, and so gets as far as
    # finding that its dead-letter topic was never written.
    redrive = send(http, "POST", f"/v1/subscriptions/{sub}/redrive", empty)
    assert_problem(redrive, 404, "topic_not_found")


@pytest.mark.parametrize("empty", ["", "  \n"])
def test_no_body_is_a_bad_request_where_a_body_is_required(
    http: httpx.Client, unique: Callable[[str], str], empty: str
) -> None:
    sub = unique("s")
    assert http.put(f"/v1/subscriptions/{sub}", json={"topic": unique("t")}).status_code == 201
    for method, path in (
        ("POST", f"/v1/topics/{unique('t')}/messages"),
        ("PUT", f"/v1/subscriptions/{unique('new')}"),
        ("POST", f"/v1/subscriptions/{sub}/seek"),
        ("POST", f"/v1/subscriptions/{sub}/push/rotate-secret"),
    ):
        problem = assert_problem(send(http, method, path, empty), 400, "bad_request")
        assert problem["detail"] == "a JSON body is required", path
