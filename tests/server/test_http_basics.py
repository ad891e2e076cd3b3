"""Health, metrics, OpenAPI, unknown routes and methods (PROTOCOL §2, §5) on a real server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import httpx
import pytest
from starlette.routing import Route

from server.app import create_app
from tests.conftest import HeraldProcess
from tests.server import assert_problem


@pytest.fixture
def http(shared_herald: HeraldProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_herald.url, timeout=30) as client:
        yield client


def test_healthz(http: httpx.Client) -> None:
    response = http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "path", ["/", "/v1", "/v2/topics", "/v1/topics/a/b", "/v1/topics/t/partitions/0"]
)
def test_unknown_routes_are_not_found_problems(http: httpx.Client, path: str) -> None:
    assert_problem(http.get(path), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/v1/topics/t", {"GET", "HEAD", "PUT", "DELETE"}),
        ("POST", "/v1/subscriptions/s", {"GET", "HEAD", "PUT", "PATCH", "DELETE"}),
        ("GET", "/v1/topics/t/messages", {"POST"}),
        ("DELETE", "/v1/topics", {"GET", "HEAD"}),
        ("GET", "/v1/subscriptions/s/seek", {"POST"}),
        ("POST", "/healthz", {"GET", "HEAD"}),
    ],
)
def test_wrong_methods_are_method_not_allowed_problems(
    http: httpx.Client, method: str, path: str, allowed: set[str]
) -> None:
    response = http.request(method, path)
    assert_problem(response, 405, "method_not_allowed")
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed


def test_request_id_is_echoed_or_made(http: httpx.Client) -> None:
    assert (
        http.get("/healthz", headers={"x-request-id": "abc-123"}).headers["x-request-id"]
        == "abc-123"
    )
    made = [http.get("/healthz").headers["x-request-id"] for _ in range(20)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", made_id) for made_id in made)
    assert len(set(made)) == len(made)


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} not in metrics"
    return float(match.group(1))


def test_metrics_have_the_families_of_section_5_and_count(
    http: httpx.Client, unique: Callable[[str], str]
) -> None:
    topic, sub = unique("m"), unique("ms")
    http.put(f"/v1/subscriptions/{sub}", json={"topic": topic})
    before = http.get("/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain; version=0.0.4")
    count_before = _sample(before.text, "herald_publish_duration_seconds_count")
    http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"value": "abc"}, {"value": "d", "id": "x"}]},
    )
    http.post(
        f"/v1/topics/{topic}/messages", json={"messages": [{"value": "d", "id": "x"}]}
    )  # a duplicate
    text = http.get("/metrics").text
    label = f'{{topic="{topic}"}}'
    assert _sample(text, "herald_published_records_total", label) == 2
    assert _sample(text, "herald_published_bytes_total", label) == len('"abc"') + len('"d"')
    sub_label = f'{{subscription="{sub}"}}'
    for family in (
        "herald_delivered_records_total",
        "herald_acked_records_total",
        "herald_redelivered_records_total",
        "herald_dead_lettered_records_total",
        "herald_backlog_records",
        "herald_in_flight_records",
        "herald_consumers",
    ):
        assert f"# TYPE {family} " in text
        assert _sample(text, family, sub_label) >= 0
    assert "# TYPE herald_publish_duration_seconds histogram" in text
    assert _sample(text, "herald_publish_duration_seconds_count") == count_before + 2
    assert (
        _sample(text, "herald_publish_duration_seconds_bucket", '{le="+Inf"}') == count_before + 2
    )


def test_openapi_document_lists_exactly_the_routes(http: httpx.Client) -> None:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    documented = {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch")
    }
    served = {
        (route.path, method)
        for route in create_app().routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert documented == served
    # every $ref resolves
    schemas = document["components"]["schemas"]
    for ref in re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', response.text):
        assert ref in schemas
