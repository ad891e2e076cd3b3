"""The one place where errors become RFC 9457 problem JSON or a WebSocket close (STYLE
principle 5).

``HeraldError`` (herald/protocol/errors.py) carries its problem code, status and close
code. A route raises it and the app's handler answers; a layer that answers before the
router (access, limits) calls :func:`refuse`; a WebSocket endpoint that ends with an
error calls :func:`close_socket`. Nothing else writes a refusal by hand. Starlette's
routing errors (unknown path, wrong method) are mapped to the ``not_found`` /
``method_not_allowed`` codes of PROTOCOL §2; anything else is a 500 whose body
says nothing about the server's internals (the traceback goes to the log).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketState

from herald.protocol.close_codes import CloseCode
from herald.protocol.errors import RETRY_AFTER_S, HeraldError
from storage.errors import resource_exhausted

PROBLEM_TYPE = "application/problem+json"

log = logging.getLogger("herald.server")


class ServiceStopping(HeraldError):
    """The server is shutting down and no longer serves this request."""

    code, status, title = "storage_unavailable", 503, "Service Unavailable"


class InvalidFrame(HeraldError):
    """A node sent a frame that is not a message of cluster/wire.py."""

    code, status, title = "bad_request", 400, "Bad Request"
    close_code = CloseCode.INVALID_DATA


# Members of a problem object that ``extra`` may never overwrite.
_RESERVED = frozenset({"status", "title", "detail", "code", "type"})


def problem_body(status: int, title: str, code: str, detail: str, **extra: Any) -> bytes:
    body: dict[str, Any] = {"status": status, "title": title, "code": code, "detail": detail}
    body.update({k: v for k, v in extra.items() if k not in _RESERVED})
    return orjson.dumps(body)


def problem_response(
    status: int,
    title: str,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    return Response(
        problem_body(status, title, code, detail, **extra),
        status_code=status,
        media_type=PROBLEM_TYPE,
        headers=headers,
    )


def herald_error_response(exc: HeraldError) -> Response:
    headers = None
    retry_after = exc.extra.get("retry_after")
    if retry_after is None and exc.status == 503:
        retry_after = RETRY_AFTER_S  # every 503 says when to come back
    if retry_after is not None:  # PROTOCOL §6: 429 carries Retry-After
        headers = {"Retry-After": str(retry_after)}
    extra = {k: v for k, v in exc.extra.items() if k != "retry_after"}
    return problem_response(exc.status, exc.title, exc.code, exc.detail, headers=headers, **extra)


def close_message(exc: HeraldError, reason: str | None = None) -> Message:
    """The close a WebSocket gets for ``exc`` (``HeraldError.close_frame``: its close
    code, and ``reason``, else the error's detail)."""
    code, text = exc.close_frame(reason)
    return {"type": "websocket.close", "code": code, "reason": text}


async def refuse(
    scope: Scope, receive: Receive, send: Send, exc: HeraldError, *, reason: str | None = None
) -> None:
    """Answers a request no endpoint will see: problem JSON for HTTP; a WebSocket is
    accepted, then closed with the error's close code (PROTOCOL §3: the server accepts the
    upgrade, then speaks; a close before it would be an HTTP 403, which says nothing)."""
    if scope["type"] == "http":
        await herald_error_response(exc)(scope, receive, send)
        return
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client went away first
    await send({"type": "websocket.accept"})
    await send(close_message(exc, reason))


async def close_socket(
    websocket: WebSocket, exc: HeraldError, *, reason: str | None = None
) -> None:
    """Ends a WebSocket endpoint's connection for ``exc`` (accepted first if it is not yet,
    as :func:`refuse` does). A client that went away meanwhile has nothing to close."""
    try:
        if websocket.application_state is WebSocketState.CONNECTING:
            await websocket.accept()
        await websocket.send(close_message(exc, reason))
    except OSError:  # uvicorn's ClientDisconnected: the client left first
        log.debug("closing a WebSocket for %s: the client had gone", exc.code)


def log_server_error(method: str, path: str, exc: HeraldError) -> None:
    """A 5xx the server chose to answer (storage unavailable...) is worth a log line."""
    if exc.status >= 500:
        log.warning("%s %s -> %d %s: %s", method, path, exc.status, exc.code, exc.detail)


async def handle_herald_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HeraldError)
    log_server_error(request.method, request.url.path, exc)
    return herald_error_response(exc)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette raises these for unknown routes (404) and methods (405)."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 404:
        return problem_response(
            404, "Not Found", "not_found", f"no route for {request.url.path}", headers=headers
        )
    if exc.status_code == 405:
        return problem_response(
            405,
            "Method Not Allowed",
            "method_not_allowed",
            f"{request.method} is not allowed on {request.url.path}",
            headers=headers,
        )
    code = "bad_request" if exc.status_code == 400 else "internal_error"
    return problem_response(exc.status_code, "Error", code, str(exc.detail), headers=headers)


EXCEPTION_HANDLERS = {
    HeraldError: handle_herald_error,
    HTTPException: handle_http_exception,
}


class InternalErrorMiddleware:
    """Turns any exception nobody handled into a 500 problem, logged with its traceback.

    A plain ASGI middleware (not ``BaseHTTPMiddleware``) so the hot routes pay
    nothing for it. It sits inside Starlette's ``ServerErrorMiddleware``, so the
    exception is swallowed here instead of being printed a second time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            # The next layer's own coroutine: no frame of this one is held for as long
            # as a WebSocket stays open (issue 27 §3: memory per idle consumer).
            return self.app(scope, receive, send)
        return self._guarded(scope, receive, send)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except ClientDisconnect:
            # Gone before its request was read: there is no one to answer, and nothing
            # failed on our side (the nemesis saw these logged as unhandled errors).
            log.info(
                "%s %s: the client went away mid-request", scope.get("method"), scope.get("path")
            )
        except Exception as exc:
            if started:
                log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
                raise  # half a response is out; only closing the connection is left
            await unhandled_error_response(scope, exc)(scope, receive, send)


def unhandled_error_response(scope: Scope, exc: Exception) -> Response:
    """The answer to an exception no route handled, logged here: a resource running out
    (a full disk, too many open files) as its problem, anything else a 500 whose body says
    nothing of the server's internals. InternalErrorMiddleware's answer, and the publish
    route's below ASGI (server/direct_publish.py)."""
    exhausted = resource_exhausted(exc)
    if exhausted is not None:
        log_server_error(scope.get("method", ""), scope.get("path", ""), exhausted)
        return herald_error_response(exhausted)
    log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
    return problem_response(
        500, "Internal Server Error", "internal_error", "the server failed to handle this request"
    )
