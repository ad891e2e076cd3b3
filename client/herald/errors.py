"""Errors the SDK raises, carrying the server's wire codes (PROTOCOL §2 problem JSON,
§3 close codes)."""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
import orjson

from herald.protocol.close_codes import TERMINAL
from herald.protocol.convert import from_model
from herald.protocol.errors import HeraldError

T = TypeVar("T")


class HeraldClientError(Exception):
    """An error answer of the server: problem JSON (RFC 9457) or a WebSocket close."""

    def __init__(
        self,
        code: str,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        problem: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.code = code
        self.status = status
        self.detail = detail
        self.title = title
        self.problem = problem or {}
        self.retry_after = retry_after  # seconds, from Retry-After (429, 503)

    @property
    def index(self) -> int | None:
        """The position of the first bad message of a rejected publish batch."""
        index = self.problem.get("index")
        return index if isinstance(index, int) and not isinstance(index, bool) else None

    @classmethod
    def from_response(cls, response: httpx.Response) -> HeraldClientError:
        return cls.from_answer(
            response.status_code, response.content, response.headers.get("retry-after")
        )

    @classmethod
    def from_answer(
        cls, status: int, content: bytes, retry_after: str | None = None
    ) -> HeraldClientError:
        """The error of an HTTP answer >= 400: its problem JSON if it has one."""
        try:
            problem = orjson.loads(content)
        except orjson.JSONDecodeError:
            problem = None
        if not isinstance(problem, dict):
            problem = {}
        code = problem.get("code")
        detail = problem.get("detail")
        return cls(
            code if isinstance(code, str) else f"http_{status}",
            status,
            detail if isinstance(detail, str) else content[:200].decode("utf-8", "replace"),
            title=problem.get("title") if isinstance(problem.get("title"), str) else None,
            problem=problem,
            retry_after=_retry_after(retry_after),
        )


def checked(body: dict[str, Any], model: type[T], what: str) -> T:
    """``body`` as the request ``model`` the server validates it with, or the
    HeraldClientError the server's 400 answer to it would raise: the same code and
    detail (the field's path), from the same conversion (herald/protocol/convert.py)."""
    try:
        return from_model(body, model, what)
    except HeraldError as refused:
        problem = {
            "status": refused.status,
            "title": refused.title,
            "code": refused.code,
            "detail": refused.detail,
        }
        raise HeraldClientError(
            refused.code, refused.status, refused.detail, title=refused.title, problem=problem
        ) from None


class HeraldConnectionError(HeraldClientError):
    """The server could not be reached, or what answered is not a Herald server (no
    connection, a refused or timed-out one, a handshake that is not Herald's). Raised at
    once when no connection to the server has succeeded yet; after one has, the SDK
    retries (the producer) or reconnects (the consumer) with backoff instead."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__("unreachable", 0, f"cannot reach {url}: {reason}")
        self.url = url


class ProducerBufferFullError(HeraldClientError):
    """`Producer.send` found `max_pending` records already waiting for an answer:
    await some of the futures first, or use `send_and_wait`, which waits for room."""

    def __init__(self, max_pending: int) -> None:
        super().__init__(
            "buffer_full", 0, f"{max_pending} records are waiting for an answer (max_pending)"
        )


class ConsumerClosedError(HeraldClientError):
    """The server closed a consumer for good (4400, 4401, 4403, 4404, 4409, 4410, 1008)."""

    CODES = TERMINAL  # the close code -> the code this error carries (PROTOCOL §3)

    def __init__(self, close_code: int, reason: str) -> None:
        super().__init__(self.CODES.get(close_code, "closed"), close_code, reason or "closed")
        self.close_code = close_code


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date; the exponential backoff applies instead
