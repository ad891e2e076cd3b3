"""The one error handler (server/errors.py): HeraldError -> problem JSON, anything else -> 500."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from herald.protocol.errors import BadRequest, RateLimited
from server.errors import EXCEPTION_HANDLERS, InternalErrorMiddleware
from tests.server import assert_problem


async def explode(request: Request) -> Response:
    raise RuntimeError("secret internals at /var/lib/herald")


async def bad_batch(request: Request) -> Response:
    raise BadRequest("message 3 is bad", index=3)


async def limited(request: Request) -> Response:
    raise RateLimited("slow down", retry_after=2)


def client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[Route("/explode", explode), Route("/bad", bad_batch), Route("/limited", limited)],
        middleware=[Middleware(InternalErrorMiddleware)],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://herald")


async def test_unexpected_exception_is_a_500_problem_without_internals() -> None:
    async with client() as http:
        response = await http.get("/explode")
    body = assert_problem(response, 500, "internal_error")
    assert "secret" not in response.text and "Traceback" not in response.text
    assert set(body) == {"status", "title", "code", "detail"}


async def test_herald_error_extras_become_problem_members() -> None:
    async with client() as http:
        body = assert_problem(await http.get("/bad"), 400, "bad_request")
    assert body["index"] == 3 and body["detail"] == "message 3 is bad"


async def test_rate_limited_carries_retry_after() -> None:
    async with client() as http:
        response = await http.get("/limited")
    assert_problem(response, 429, "rate_limited")
    assert response.headers["retry-after"] == "2"
    assert "retry_after" not in response.json()


async def test_a_client_gone_mid_body_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """A request whose client disconnects before its body is read: nothing to answer and
    nothing failed, so no 500 and no traceback in the log."""

    async def read_body(request: Request) -> Response:
        await request.body()
        return Response("read")

    app = Starlette(
        routes=[Route("/body", read_body, methods=["POST"])],
        middleware=[Middleware(InternalErrorMiddleware)],  # as server/app.py has it
    )
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/body", "raw_path": b"/body", "query_string": b"",
        "root_path": "", "headers": [(b"content-length", b"100")], "client": None,
        "server": None,
    }  # fmt: skip
    with caplog.at_level(logging.INFO, logger="herald.server"):
        await app(scope, receive, send)
    assert sent == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
