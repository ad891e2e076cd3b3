"""Structured logs (text or one JSON object per line) and request ids.

Every HTTP request gets an id (the client's ``X-Request-Id`` if it sent a sane
one, else a fresh one), echoed in the response and attached to every log line
written while the request runs. Nothing here logs per record: at hundreds of
thousands of records a second that would cost more than the work itself.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import random
import re
import sys
import time
from collections.abc import Awaitable
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.tasks import at_task_end

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "herald_request_id", default=None
)

access_log = logging.getLogger("herald.access")

_REQUEST_ID_HEADER = b"x-request-id"
_MAX_CLIENT_ID = 128


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


# PROTOCOL §6: a token is never written to a log. uvicorn logs each WebSocket handshake
# with its query string at INFO, so ``?token=`` is cut from every line, whichever logger
# wrote it, and so is anything shaped like a token (its id stays: it names it).
_TOKEN_PARAM = re.compile(r"([?&;]token=)[^&\s\"']+", re.IGNORECASE)
_TOKEN = re.compile(r"\b(hrd_[0-9a-f]{8}_)[A-Za-z0-9_-]+|\bhrb_[A-Za-z0-9_.-]+")
REDACTED = "[redacted]"


def redact_tokens(text: str) -> str:
    """``text`` without the secret of any token or ``token=`` parameter in it."""
    if "token" not in text and "hrd_" not in text and "hrb_" not in text:
        return text
    text = _TOKEN_PARAM.sub(lambda m: m.group(1) + REDACTED, text)
    return _TOKEN.sub(lambda m: (m.group(1) or "hrb_") + REDACTED, text)


class _RedactTokensFilter(logging.Filter):
    """Rewrites a record whose message (or traceback) holds a token before any handler
    formats it."""

    _exceptions = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_tokens(message)
        if clean != message:
            record.msg, record.args = clean, None
            record.__dict__.pop("color_message", None)
        if record.exc_info and not record.exc_text:
            record.exc_text = self._exceptions.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_tokens(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    # color_message: uvicorn's ANSI-coloured duplicate of msg.
    _STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {
        "message",
        "request_id",
        "color_message",
    }

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        # `extra=` members become fields of their own, so they stay queryable.
        for key, value in record.__dict__.items():
            if key not in self._STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [req={request_id}]" if request_id else line


def configure_logging(log_format: str, level: str) -> None:
    """Route our loggers and uvicorn's through one handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_RedactTokensFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # uvicorn's own access log is off; ours (RequestContextMiddleware) has request ids.
    logging.getLogger("uvicorn.access").disabled = True
    # One INFO line per webhook POST from httpx would drown the server log.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def request_id_of(scope: Scope) -> str:
    """A request's id: the client's ``X-Request-Id`` if it sent a sane one, else a fresh
    one (the ASGI layer below and the publish route below ASGI, server/direct_publish.py).

    A fresh id names a request in logs; it is no secret, so it comes from ``random``
    rather than ``os.urandom``, whose ``getrandom`` call lets go of the GIL: the writer
    thread took it there in the middle of every publish, one more hand-off of the GIL
    each way per request (issue 27)."""
    return _client_request_id(scope) or f"{random.getrandbits(128):032x}"


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == _REQUEST_ID_HEADER:
            if 0 < len(value) <= _MAX_CLIENT_ID and value.isascii():
                text: str = value.decode("ascii")
                if text.isprintable():
                    return text
            return None
    return None


class RequestContextMiddleware:
    """Gives each HTTP request an id, echoes it, and optionally writes an access line."""

    def __init__(self, app: ASGIApp, *, access_log_enabled: bool = False) -> None:
        self.app = app
        self.access_log_enabled = access_log_enabled

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "http":
            return self._http(scope, receive, send)
        if scope["type"] == "websocket":
            # The id is the connection task's for its life (uvicorn gives each its own
            # task); the access line, if any, is written when that task ends. No frame
            # of this layer stays suspended while the socket is open (issue 27 §3).
            request_id_var.set(request_id_of(scope))
            if self.access_log_enabled:
                at_task_end(functools.partial(log_access, scope, time.perf_counter(), 0))
        return self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_id_of(scope)
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                headers.append(request_id_header(request_id))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log_enabled:
                log_access(scope, started, status)
            request_id_var.reset(token)


def request_id_header(request_id: str) -> tuple[bytes, bytes]:
    """The response header that echoes a request's id."""
    return _REQUEST_ID_HEADER, request_id.encode()


def log_access(scope: Scope, started: float, status: int, *_ended: object) -> None:
    """The access line of a request (``--access-log``)."""
    access_log.info(
        "%s %s %d %.1fms",
        scope.get("method", "WS"),
        scope.get("path"),
        status,
        (time.perf_counter() - started) * 1000,
    )
