"""End-to-end tests of the HTTP API (PROTOCOL §2, §5) against a real server."""

from __future__ import annotations

from typing import Any

import httpx


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
