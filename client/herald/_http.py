"""What every HTTP call of the SDK shares: the base URL (or a cluster's node URLs),
bearer token, problem JSON errors, and retries of 429 / 503 / connection failures
honouring Retry-After.

A connection failure is retried only once the server has answered this client at
least once: a wrong URL or a server that is down fails at once with
HeraldConnectionError instead of retrying for a minute (or leaking httpx's errors)."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
import msgspec
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from herald.errors import HeraldClientError, HeraldConnectionError

log = logging.getLogger("herald")

DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_STATUSES = frozenset({429, 503})  # PROTOCOL §2 rate_limited, storage_unavailable
# PROTOCOL §7: this node cannot reach etcd; another node of the cluster may.
NODE_UNAVAILABLE = "cluster_unavailable"
T = TypeVar("T")


def node_urls(url: str | Sequence[str]) -> list[str]:
    """One server's URL, or the URLs of a cluster's nodes (PROTOCOL §7: any node serves
    every route), as base URLs without a trailing slash."""
    urls = [url] if isinstance(url, str) else list(url)
    urls = [u.strip().rstrip("/") for u in urls]
    if not urls or not all(urls):
        raise ValueError("url must name at least one server")
    return urls


def ws_ssl(ws_url: str, ssl_context: ssl.SSLContext | None) -> dict[str, Any]:
    """`websockets.connect`'s ssl argument: a private CA's context for a wss:// URL (a
    ws:// URL takes none; a wss:// one without it uses the system's CAs)."""
    if ssl_context is None or not ws_url.startswith("wss://"):
        return {}
    return {"ssl": ssl_context}


class Nodes:
    """The HTTP side of an SDK object: one httpx client and the node URLs its requests
    go to, the current one until it cannot be reached (then the next, in turn)."""

    __slots__ = ("current", "http", "urls")

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.urls = node_urls(url)
        self.current = 0
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # ssl_context: a private CA's (https:// nodes); None: the system's CAs.
        verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.http = httpx.AsyncClient(headers=headers, timeout=timeout, verify=verify)

    @property
    def url(self) -> str:
        return self.urls[self.current]

    def advance(self) -> None:
        self.current = (self.current + 1) % len(self.urls)

    async def aclose(self) -> None:
        await self.http.aclose()


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
    delay = min(maximum, initial * 2.0 ** (attempt - 1))
    return delay * random.uniform(0.5, 1.0)


async def with_retries(
    call: Callable[[], Awaitable[T]], attempts: int, max_wait: float, reach: Reachability
) -> T:
    """Run `call`, retrying (tenacity) what is worth retrying after Retry-After when the
    server gave one, else a jittered exponential backoff; the last error is raised as
    is. The first try runs outside tenacity: on every publish it costs only the call."""
    try:
        return await call()
    except Exception as exc:
        if attempts <= 1 or not reach.is_retryable(exc):
            raise
        await asyncio.sleep(_retry_delay(exc, 1, max_wait))

    def wait(state: RetryCallState) -> float:
        assert state.outcome is not None
        failure = state.outcome.exception()
        assert failure is not None
        return _retry_delay(failure, state.attempt_number + 1, max_wait)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts - 1),  # the first try was made above
        wait=wait,
        retry=retry_if_exception(reach.is_retryable),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity reraises the last failure")


def _retry_delay(exc: BaseException, attempt: int, max_wait: float) -> float:
    if isinstance(exc, HeraldClientError) and exc.retry_after is not None:
        return exc.retry_after  # the server knows best when to come back
    return backoff_delay(attempt, 0.05, max_wait)


async def request_json(
    nodes: Nodes,
    reach: Reachability,
    method: str,
    path: str,
    *,
    body: Any = None,
    params: dict[str, Any] | None = None,
    attempts: int = 5,
    max_wait: float = 10.0,
    answer: type[Any] | None = None,
) -> Any:
    """One JSON call; returns the parsed body (None for an empty one), decoded into
    ``answer`` when given (a model of herald.protocol). ``body``: a model of
    herald.protocol, encoded by msgspec, or plain JSON. Each attempt tries every node
    once, in turn from the current one, while they cannot be reached or answer 503
    `cluster_unavailable` (as Producer does: PROTOCOL §7)."""
    if body is None:
        content = None
    elif isinstance(body, msgspec.Struct):
        content = msgspec.json.encode(body)
    else:
        content = orjson.dumps(body)
    headers = {"content-type": "application/json"} if content is not None else None

    async def call() -> Any:
        last = len(nodes.urls) - 1
        for tried in range(len(nodes.urls)):
            url = nodes.url
            try:
                response = await nodes.http.request(
                    method, url + path, content=content, params=params, headers=headers
                )
            except httpx.TransportError as exc:
                nodes.advance()
                if tried == last:
                    reach.url = url
                    raise reach.unreachable(exc) from exc
                continue
            reach.answered = True
            if response.status_code >= 400:
                error = HeraldClientError.from_response(response)
                if error.code == NODE_UNAVAILABLE and tried < last:
                    nodes.advance()
                    continue
                raise error
            break
        if answer is not None:
            try:
                return msgspec.json.decode(response.content, type=answer)
            except msgspec.DecodeError:  # a ValidationError too: not the model's shape
                raise HeraldConnectionError(url, "the answer is not Herald's") from None
        try:
            return orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            raise HeraldConnectionError(url, "the answer is not JSON") from None

    return await with_retries(call, attempts, max_wait, reach)
