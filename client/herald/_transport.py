"""The publish path's HTTP/1.1 client: keep-alive connections in a small pool, each an
asyncio Protocol parsing responses with httptools (chunked bodies included).

httpx costs the producer about 9 µs of CPU per 1 KiB record in its layers (anyio
streams, h11's buffer scans, its models); a publish needs one POST on a warm
connection and its answer, so this does only that: TLS, a bearer token, timeouts,
and a request retried once on a fresh connection when a reused one turns out to have
been closed by the server while idle (it never saw the request). Everything else
(status codes, Retry-After, retries and dedup) is the caller's, as with httpx.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# The server closes keep-alive connections idle for 5 s (server/security_cli.py);
# one idle longer than this is not reused, so that a request rarely meets a closing one.
MAX_IDLE_S = 4.0
MAX_IDLE_CONNECTIONS = 16
_SAFE_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110 token


class TransportError(ConnectionError):
    """No answer: the connection failed, was closed, or timed out."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # names in lower case; a repeated header keeps the last
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, answered in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._header_name = b""
        self.answered = 0  # responses received: a reused connection has answered before
        self.reusable = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(TransportError(f"bad HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost fails a waiting request

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(TransportError(f"connection closed{f': {exc}' if exc else ''}"))

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers = {}
        self._body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self.answered += 1
        self.reusable = self._parser.should_keep_alive()
        if not self.reusable and self._transport is not None:
            self._transport.close()
        if waiter is not None and not waiter.done():
            status = self._parser.get_status_code()
            waiter.set_result(Response(status, self._headers, b"".join(self._body)))

    # -- the request -------------------------------------------------------------------------

    async def request(self, head: bytes, body: bytes) -> Response:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise TransportError("connection closed")
        self.reusable = False  # until this answer says otherwise
        waiter: asyncio.Future[Response] = self._loop.create_future()
        self._waiter = waiter
        if body:
            transport.writelines((head, body))
        else:
            transport.write(head)
        return await waiter

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def _fail(self, exc: TransportError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()


class ConnectionPool:
    """Keep-alive connections to one origin (`http://` or `https://` URL)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = MAX_IDLE_CONNECTIONS,
        max_idle_s: float = MAX_IDLE_S,
        connect_timeout: float | None = None,
        max_connections: int | None = None,
    ) -> None:
        """``timeout``: for a whole request, connecting included; ``connect_timeout``, if
        given, for opening a connection alone. ``max_idle_s``: an idle connection older
        than this is not reused (keep it below the server's keep-alive timeout).
        ``max_connections``: at most this many requests at once (each on a connection of
        its own), the others waiting their turn within their timeout; None: no bound."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.max_idle_s = max_idle_s
        authority = parts.netloc.rpartition("@")[2]
        fixed = f"host: {authority}\r\nuser-agent: herald-client\r\n"
        if token:
            fixed += f"authorization: Bearer {token}\r\n"
        self._fixed_headers = fixed
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()
        self._closed = False
        self._turns = asyncio.Semaphore(max_connections) if max_connections else None

    async def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One request; TransportError when no answer came (the caller decides to retry).
        ``headers``: more headers for this request alone."""
        if self._closed:
            raise TransportError("the connection pool is closed")
        extra = ""
        if headers:
            for name, value in headers.items():
                if not _SAFE_HEADER.fullmatch(name) or "\r" in value or "\n" in value:
                    raise ValueError(f"not a header line: {name!r}: {value!r}")
                extra += f"{name}: {value}\r\n"
        head = (
            f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._fixed_headers}{extra}"
            + (f"content-type: {content_type}\r\n" if content_type else "")
            + f"content-length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        try:
            async with asyncio.timeout(self.timeout):
                if self._turns is None:
                    return await self._exchange(head, body)
                async with self._turns:
                    return await self._exchange(head, body)
        except TimeoutError:
            raise TransportError(f"no answer within {self.timeout:g} s") from None

    async def _exchange(self, head: bytes, body: bytes) -> Response:
        while True:
            connection = await self._acquire()
            try:
                response = await connection.request(head, body)
            except TransportError:
                self._discard(connection)
                if connection.answered:
                    continue  # closed by the server while idle: a fresh one
                raise
            except BaseException:
                self._discard(connection)  # cancelled or timed out mid-request
                raise
            self._release(connection)
            return response

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    async def _acquire(self) -> _Connection:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle:
            connection = self._idle.pop()  # the most recently used: warmest
            if connection.reusable and now - connection.idle_since < self.max_idle_s:
                return connection
            self._discard(connection)
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise TransportError(
                f"could not connect to {self.host}:{self.port} within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise TransportError(str(exc) or type(exc).__name__) from exc
        self._open.add(connection)
        return connection

    def _release(self, connection: _Connection) -> None:
        if not connection.reusable or self._closed or len(self._idle) >= self.max_idle:
            self._discard(connection)
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.append(connection)

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)
