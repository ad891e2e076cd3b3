"""Watching an etcd key or prefix through the gateway's streamed ``/v3/watch``.

``async with etcd.watch(prefix, prefix=True, start_revision=r) as watch:`` opens the
stream (the watch exists when ``__aenter__`` returns, so nothing written afterwards is
missed), then ``async for event in watch`` yields every change in revision order.

The stream is one HTTP response of JSON lines, read by a task the ``Watch`` owns and
cancels on exit, into a bounded queue (backpressure reaches etcd through TCP).

- The stream breaks (etcd killed, connection lost): it is reopened — on the next
  endpoint if that one fails — from the revision after the last event read, so no event
  is lost or repeated. When no endpoint answers within the client's timeout, iterating
  raises :class:`EtcdUnavailable`; ``watch.next_revision`` is where a new watch resumes.
- The stream goes quiet: a quiet stream and a frozen etcd look alike, so after
  ``idle_probe_s`` without a line the reader asks the same endpoint for a linearizable
  read (which needs a live member with a leader). If that fails the stream is
  abandoned and reopened elsewhere. (The gateway speaks HTTP/1.1, half duplex: the
  watch's own progress requests cannot be sent on the stream.)
- The start revision was compacted: :class:`WatchCompacted`, the caller re-reads.
"""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import httpx
import orjson

from cluster.etcd_access import EtcdAuthenticator, token_refused
from cluster.etcd_errors import (
    REQUIRE_LEADER,
    SERVER_SIDE_CODES,
    EtcdError,
    EtcdUnavailable,
    Retryable,
    WatchCompacted,
)
from cluster.etcd_model import KeyValue, b64, header_revision, parse_kv

T = TypeVar("T")

QUEUE_BATCHES = 16  # watch responses buffered between the stream and the consumer
REOPEN_PAUSE_S = 0.05  # between a broken stream and the next (no hot loop on a flapping member)


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    kv: KeyValue  # for a DELETE: the key and the deletion's revision, no value

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class _Batch:
    events: tuple[WatchEvent, ...]
    next_revision: int  # where a watch resumes once these events are consumed


class _StreamBroken(Exception):
    """The stream must be reopened (ended, failed, or its endpoint stopped answering)."""


_Stream = tuple[str, httpx.Response, AsyncGenerator[str, None]]


class WatchTransport(Protocol):
    """What a watch needs of the client (:class:`cluster.etcd.EtcdClient`): its
    endpoints with failover, the pool streams are opened with, etcd's user token, a
    probe and a clock."""

    @property
    def streams(self) -> httpx.AsyncClient: ...

    @property
    def auth(self) -> EtcdAuthenticator: ...

    async def auth_headers(self, endpoint: str, attempt_timeout: float) -> dict[str, str]: ...

    def clock(self) -> float: ...

    def endpoint_failed(self, endpoint: str) -> None: ...

    async def probe(self, endpoint: str, key: bytes = b"\0") -> bool: ...

    async def with_failover(
        self, attempt: Callable[[str, float], Awaitable[T]], *, within_s: float | None = None
    ) -> T: ...


class Watch:
    def __init__(
        self,
        client: WatchTransport,
        key: bytes,
        range_end: bytes,
        start_revision: int,
        idle_probe_s: float,
    ) -> None:
        self._client = client
        self._key = key
        self._range_end = range_end
        self._resume = start_revision  # the reader's position: 0 until etcd names "now"
        self._idle_probe_s = idle_probe_s
        self._queue: asyncio.Queue[_Batch] = asyncio.Queue(QUEUE_BATCHES)
        self._pending: deque[WatchEvent] = deque()
        self._batch_end = start_revision
        self._ready = asyncio.Event()
        self._established = False
        self._created_seen = False  # of the stream being opened
        self._terminal: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_heard = client.clock()
        self._token_sent: str | None = None  # etcd's auth token the stream was opened with
        self.next_revision = start_revision
        """The revision a new watch starts from to continue exactly after what was read."""

    async def __aenter__(self) -> Watch:
        self._task = asyncio.create_task(self._run(), name=f"etcd-watch {self._key!r}")
        try:
            await self._ready.wait()
        except BaseException:
            await self._stop()
            raise
        if not self._established:
            await self._stop()
            raise self._terminal or EtcdUnavailable("the watch could not be created")
        self.next_revision = self._batch_end = self._resume
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # The reader's own CancelledError is its result; ours (if we are being
            # cancelled) still propagates out of gather.
            await asyncio.gather(self._task, return_exceptions=True)

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            self.next_revision = self._batch_end
            if self._terminal is not None and self._queue.empty():
                raise self._terminal
            batch = await self._queue.get()
            self._pending.extend(batch.events)
            self._batch_end = batch.next_revision
        event = self._pending.popleft()
        # Events of one transaction share a revision: resume at it until all are read.
        same_revision_left = bool(self._pending) and self._pending[0].revision == event.revision
        self.next_revision = event.revision if same_revision_left else event.revision + 1
        return event

    # ------------------------------------------------------------------ the reader

    async def _run(self) -> None:
        try:
            while True:
                endpoint, response, lines = await self._client.with_failover(self._open)
                try:
                    finished = await self._follow(endpoint, lines)
                finally:
                    await lines.aclose()
                    await response.aclose()
                if finished:
                    return
        except (EtcdError, EtcdUnavailable) as exc:
            self._terminal = exc
        except Exception as exc:  # a bug: end the iteration loudly rather than hang it
            self._terminal = exc
        finally:
            self._ready.set()
            # Wake a consumer blocked on an empty queue so it sees the terminal error.
            if self._terminal is not None and self._queue.empty():
                self._queue.put_nowait(_Batch((), self._resume))

    async def _open(self, endpoint: str, attempt_timeout: float) -> _Stream:
        create: dict[str, Any] = {"key": b64(self._key)}
        if self._range_end:
            create["range_end"] = b64(self._range_end)
        if self._resume:
            create["start_revision"] = str(self._resume)
        http = self._client.streams
        auth = await self._client.auth_headers(endpoint, attempt_timeout)
        self._token_sent = auth.get("Authorization")
        request = http.build_request(
            "POST",
            endpoint + "/v3/watch",
            content=orjson.dumps({"create_request": create}),
            headers={**REQUIRE_LEADER, **auth},
            # No read timeout on a stream that may rightly be quiet for hours: the
            # idle probe decides whether its endpoint is still alive.
            timeout=httpx.Timeout(attempt_timeout, read=None),
        )
        try:
            async with asyncio.timeout(attempt_timeout):
                response = await http.send(request, stream=True)
        except (httpx.TransportError, ssl.SSLError, TimeoutError) as exc:
            raise Retryable(f"{endpoint}: watch: {exc!r}") from exc
        lines = cast(AsyncGenerator[str, None], response.aiter_lines())
        try:
            if response.status_code != 200:
                body = (await response.aread())[:200].decode(errors="replace")
                if token_refused(body):
                    self._client.auth.forget(self._token_sent)
                raise _StreamBroken(f"HTTP {response.status_code}: {body}")
            self._created_seen = False
            async with asyncio.timeout(attempt_timeout):
                while not self._created_seen:
                    if await self._handle(await anext(lines)):
                        break
        except (httpx.TransportError, TimeoutError, StopAsyncIteration, _StreamBroken) as exc:
            await lines.aclose()
            await response.aclose()
            raise Retryable(f"{endpoint}: watch: {exc!r}") from exc
        except BaseException:
            await lines.aclose()
            await response.aclose()
            raise
        if self._terminal is not None:  # refused as it was created
            await lines.aclose()
            await response.aclose()
            raise self._terminal
        self._established = True
        self._ready.set()
        return endpoint, response, lines

    async def _follow(self, endpoint: str, lines: AsyncGenerator[str, None]) -> bool:
        """Read the stream until it ends or breaks: True when the watch is over for good."""
        finished = False
        try:
            async with asyncio.TaskGroup() as tg:
                probe = tg.create_task(self._probe_while_quiet(endpoint))
                async for line in lines:
                    if await self._handle(line):
                        finished = True
                        break
                probe.cancel()
        except* (httpx.TransportError, _StreamBroken):
            pass  # the stream broke: _run reopens it from self._resume
        if not finished:  # etcd never ends a watch stream on its own: that endpoint failed
            self._client.endpoint_failed(endpoint)
            await asyncio.sleep(REOPEN_PAUSE_S)
        return finished

    async def _probe_while_quiet(self, endpoint: str) -> None:
        clock = self._client.clock
        while True:
            await asyncio.sleep(self._idle_probe_s)
            if clock() - self._last_heard >= self._idle_probe_s:
                if not await self._client.probe(endpoint, self._key):
                    raise _StreamBroken(f"{endpoint} stopped answering")
                self._last_heard = clock()

    def _stream_error(self, error: dict[str, Any]) -> EtcdError:
        """The error that ends the watch for good; raises _StreamBroken for one a reopened
        stream gets past (etcd away, an expired token)."""
        code = int(error.get("grpc_code", error.get("code", 0)))
        if code in SERVER_SIDE_CODES:
            raise _StreamBroken(str(error.get("message")))
        if self._client.auth.enabled and token_refused(str(error.get("message"))):
            self._client.auth.forget(self._token_sent)  # reopened with a new token
            raise _StreamBroken(str(error.get("message")))
        return EtcdError(code, str(error.get("message")))

    def _cancellation(self, result: dict[str, Any]) -> EtcdError:
        """Why etcd canceled the watch, for good; raises _StreamBroken when a reopened
        stream gets past it (no leader, an expired token)."""
        compacted = int(result.get("compact_revision", 0))
        reason = str(result.get("cancel_reason", ""))
        if compacted:
            return WatchCompacted(compacted)
        if "no leader" in reason:
            raise _StreamBroken(reason)
        if self._client.auth.enabled and token_refused(reason):
            self._client.auth.forget(self._token_sent)  # reopened with a new token
            raise _StreamBroken(reason)
        return EtcdError(0, f"watch canceled: {reason or 'no reason given'}")

    async def _handle(self, line: str) -> bool:
        """Take one JSON line of the stream; True when the watch is over for good."""
        if not line.strip():
            return False
        self._last_heard = self._client.clock()
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _StreamBroken(f"not JSON: {line[:200]!r}") from exc
        if "error" in message:  # the gateway's way of ending a stream on a gRPC error
            self._terminal = self._stream_error(message["error"])
            return True
        result = message.get("result", {})
        if result.get("canceled"):
            self._terminal = self._cancellation(result)
            return True
        if result.get("created"):
            self._created_seen = True
            if not self._resume:  # PROTOCOL §7 membership: "from now" is named by etcd
                self._resume = header_revision(result) + 1
            return False
        events = tuple(
            WatchEvent(EventType(event.get("type", "PUT")), parse_kv(event.get("kv", {})))
            for event in result.get("events", ())
        )
        if events:
            self._resume = events[-1].revision + 1
        else:  # a progress notification: every event up to its revision was sent
            self._resume = max(self._resume, header_revision(result) + 1)
        await self._queue.put(_Batch(events, self._resume))
        return False
