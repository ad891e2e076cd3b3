"""End-to-end tests of the HTTP API (PROTOCOL §2, §5) against a real server."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import schemathesis

from server.route_table import openapi_document

# The document a single node serves: its paths come from the endpoint table.
_DOCUMENT = schemathesis.openapi.from_dict(orjson.loads(openapi_document(cluster=False)))


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is RFC 9457 problem JSON with this status and code; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code, body
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def conformance(response: httpx.Response) -> str | None:
    """Why ``response`` disagrees with the server's OpenAPI document, or None. Only
    answers of the API (/v1/...) whose body was read, to a request whose body can be read
    again, are checked; a path the document does not have is the route tests' concern (a
    404 problem), not this one's."""
    request = response.request
    if not request.url.path.startswith("/v1/") or not response.is_closed:
        return None
    try:
        request.read()  # schemathesis reads the request's bytes too
    except httpx.StreamConsumed:  # a streamed upload (a generator): gone once sent
        return None
    operation = _DOCUMENT.find_operation_by_path(request.method, request.url.path)
    if operation is None:
        return None
    try:
        operation.validate_response(response)
    except AssertionError as exc:  # schemathesis' failures are AssertionErrors
        return f"{request.method} {request.url.path} -> {response.status_code}: {exc}"
    return None
