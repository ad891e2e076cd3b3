"""What every HTTP call of the SDK shares: base URL, bearer token, problem JSON
errors, and retries of 429 / 503 / connection failures honouring Retry-After.

A connection failure is retried only once the server has answered this client at
least once: a wrong URL or a server that is down fails at once with
HeraldConnectionError instead of retrying for a minute (or leaking httpx's errors)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import orjson

from herald.errors import HeraldClientError, HeraldConnectionError

log = logging.getLogger("herald")

DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_STATUSES = frozenset({429, 503})  # PROTOCOL §2 rate_limited, storage_unavailable
T = TypeVar("T")


def make_http(url: str, token: str | None, timeout: float) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout)


class Reachability:
    """Whether the server has answered this client yet: until it has, a connection
    failure is final (HeraldConnectionError); after, it is retried with backoff."""

    __slots__ = ("answered", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.answered = False

    def is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, HeraldConnectionError):
            return self.answered
        if isinstance(exc, HeraldClientError):
            return exc.status in RETRY_STATUSES
        return False

    def unreachable(self, exc: Exception) -> HeraldConnectionError:
        error = HeraldConnectionError(self.url, str(exc) or type(exc).__name__)
        if self.answered:
            log.warning("herald: %s; retrying with backoff", error.detail)
        return error


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """Wait n: min(maximum, initial·2^(n-1)), jittered within [0.5·d, d] so that
    clients cut off together do not come back together."""
    delay = min(maximum, initial * 2 ** (attempt - 1))
    return delay * random.uniform(0.5, 1.0)


async def with_retries(
    call: Callable[[], Awaitable[T]], attempts: int, max_wait: float, reach: Reachability
) -> T:
    """Run `call`, retrying what is worth retrying after Retry-After when the server gave
    one, else a jittered exponential backoff; the last error is raised as is. A plain
    loop: the first try, on every publish, costs nothing but the call."""
    attempt = 1
    while True:
        try:
            return await call()
        except Exception as exc:
            if attempt >= attempts or not reach.is_retryable(exc):
                raise
            if isinstance(exc, HeraldClientError) and exc.retry_after is not None:
                delay = exc.retry_after  # the server knows best when to come back
            else:
                delay = backoff_delay(attempt, 0.05, max_wait)
        await asyncio.sleep(delay)
        attempt += 1


async def request_json(
    http: httpx.AsyncClient,
    reach: Reachability,
    method: str,
    path: str,
    *,
    body: Any = None,
    params: dict[str, Any] | None = None,
    attempts: int = 5,
    max_wait: float = 10.0,
) -> Any:
    """One JSON call; returns the parsed body (None for an empty one)."""
    content = None if body is None else orjson.dumps(body)
    headers = {"content-type": "application/json"} if content is not None else None

    async def call() -> Any:
        try:
            response = await http.request(
                method, path, content=content, params=params, headers=headers
            )
        except httpx.TransportError as exc:
            raise reach.unreachable(exc) from exc
        reach.answered = True
        if response.status_code >= 400:
            raise HeraldClientError.from_response(response)
        try:
            return orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            raise HeraldConnectionError(reach.url, "the answer is not JSON") from None

    return await with_retries(call, attempts, max_wait, reach)
