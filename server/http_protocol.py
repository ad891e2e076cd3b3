"""uvicorn's httptools protocol with a deadline for request headers (slow-loris).

uvicorn times out idle keep-alive connections but not a client that opens a
connection and then trickles its request line and headers a byte at a time;
such a client could hold a socket and a parser for ever. Here each request's
headers must be complete within ``header_timeout_s`` of the connection opening
or of the previous response, else the connection is closed. Bodies have their
own deadline in the app (server/limits.py).

It tells the app, through the scope extension ``RECEIVE_READY`` (a function), whether
the request's next ``receive()`` answers at once — the body, or the part of it that
came, is here already — so that the body's deadline (server/limits.py) need not
schedule and cancel a loop timer for a receive that cannot wait.

It also sends each response's head and the start of its body in one write: uvicorn
writes the status line and headers at ``http.response.start`` and the body at
``http.response.body``, two ``send()`` calls for every small response (a publish's
answer) where one does.

And it serves some requests below ASGI (issue 27 §2: uvicorn's request cycle and the
ASGI layers cost a one-record publish about as much CPU as Herald's own work on it). An
app with a ``direct_route`` (server/direct_publish.py) is asked, once a request's headers
are in, whether it serves that request itself. If it does, the protocol starts no ASGI
cycle: it gathers the body and, once the whole request is here, runs the app's handler
with a :class:`DirectRequest`, which writes the answer. A request whose body has not all
come with the read that completed its headers (a large body, a slow client, ``Expect:
100-continue``) goes the ASGI way after all, its body so far handed on, so that the body
deadlines, the flow control and everything else of a streamed body stay the ASGI layers'.
So do pipelined requests, HTTP/1.0 and upgrades.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

# The scope extension: () -> bool, True when the next receive() will not wait.
RECEIVE_READY = "herald.receive_ready"

log = logging.getLogger("herald.server")

_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class, with a deadline of ``header_timeout_s``."""
    return type(
        "HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s}
    )


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s: float  # set by guarded_protocol
    # When the awaited headers are due (loop time), None while none are awaited.
    # One timer per connection checks it lazily: arming and disarming per request
    # only set this field, instead of scheduling and cancelling a TimerHandle each.
    _headers_due: float | None = None
    _header_timer: asyncio.TimerHandle | None = None

    # The app's handler of requests served below ASGI, if it has one (read once).
    _direct_route: DirectRoute | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._direct_route = getattr(self.app, "direct_route", None)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if type(cycle) is DirectRequest and cycle.more_body and not self.transport.is_closing():
            # The body did not all come with its headers: served the ASGI way after all.
            self._start_asgi(cycle)

    def on_headers_complete(self) -> None:
        self._headers_due = None
        if self._direct_route is not None and self._direct():
            return
        self._start_cycle()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is DirectRequest:
            cycle.body += body
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is DirectRequest:
            cycle.more_body = False
            # Needed only to go the ASGI way, which it no longer can: kept, each request
            # of a keep-alive connection would hold the one before it, and so all of them.
            cycle.previous = None
            task = self.loop.create_task(cycle.run())
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # uvicorn's shutdown waits for them, as for ASGI cycles
        else:
            super().on_message_complete()

    def _direct(self) -> bool:
        """Whether the app serves this request itself (headers just complete): then the
        request is a :class:`DirectRequest`, its body still to come."""
        previous = self.cycle
        if (
            (previous is not None and not previous.response_complete)
            or self.pipeline
            or self.expect_100_continue
            or self.root_path
            or self.limit_concurrency is not None
            or self.parser.get_http_version() != "1.1"
            or self.parser.should_upgrade()
        ):
            return False
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        if b"%" in raw_path or not raw_path.isascii():
            return False  # uvicorn's unquoting, kept in one place: the ASGI way
        scope: Any = self.scope
        scope["method"] = self.parser.get_method().decode("ascii")
        scope["path"] = raw_path.decode("ascii")
        scope["raw_path"] = raw_path
        scope["query_string"] = parsed.query or b""
        assert self._direct_route is not None
        handler = self._direct_route(scope)
        if handler is None:
            return False
        self.cycle = DirectRequest(self, scope, handler, previous)  # type: ignore[assignment]
        return True

    def _start_asgi(self, request: DirectRequest) -> None:
        """A request begun as a DirectRequest, served the ASGI way with its body so far."""
        self.cycle = request.previous
        self._start_cycle()
        if request.body:
            self.cycle.body += request.body
            self.cycle.message_event.set()

    def _start_cycle(self) -> None:
        """uvicorn's: an ASGI request cycle for the request whose headers are in."""
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
            # uvicorn's receive() waits only while this event is clear.
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[RECEIVE_READY] = cycle.message_event.is_set

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers (keep-alive) have the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        # The connection is the WebSocket protocol's now, and nothing reads this one
        # again. Its parser's callbacks are its bound methods (a reference cycle), and
        # its header timer kept it on the loop: it lived on as garbage only a full
        # collection frees, which a server holding many long-lived objects seldom
        # runs: about 5 KiB per open WebSocket (issue 27 §3). Let go, it is freed now.
        self._disarm()
        self.parser = None  # type: ignore[assignment]

    def _disarm(self) -> None:
        self._headers_due = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _arm(self) -> None:
        self._headers_due = self.loop.time() + self.header_timeout_s
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(self._headers_due, self._check)

    def _check(self) -> None:
        self._header_timer = None
        due = self._headers_due
        if due is None:
            return  # no headers awaited; the next _arm starts a timer again
        if self.loop.time() < due:
            self._header_timer = self.loop.call_at(due, self._check)
            return
        self._headers_due = None
        # Only a connection between requests (no cycle running) is cut.
        if (self.cycle is None or self.cycle.response_complete) and not (
            self.transport.is_closing()
        ):
            self.transport.close()


class _HeadWithBody:
    """A response cycle's view of the transport: the response head is held until the
    body's first write, which normally follows in the same step of the request's task,
    and both go out as one write. If no body write comes in that step (a streamed
    response waiting for its first chunk), the head goes out on the loop's next turn."""

    __slots__ = ("_head_seen", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._head_seen or data.startswith(b"HTTP/1.1 100 "):
            self._transport.write(data)  # the body, or an interim "100 Continue"
        else:
            self._head_seen = True
            self._held = data
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()


# A request's handler below ASGI: it answers through ``DirectRequest.respond``.
DirectHandler = Callable[["DirectRequest"], Awaitable[None]]
# The app's choice, given a request's scope (its headers in, its body not yet): the
# handler that serves it below ASGI, or None for the ASGI way.
DirectRoute = Callable[[dict[str, Any]], DirectHandler | None]


class _NoWaiter:
    """A request cycle's ``message_event`` that no one waits on: a DirectRequest's body is
    all here before its handler runs."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_WAITER = _NoWaiter()


class DirectRequest:
    """A request served below ASGI: the body gathered by the protocol, the answer written
    by :meth:`respond`. It stands where uvicorn's request cycle stands in the protocol
    (``self.cycle``), with the members uvicorn's protocol reads of one: a pipelined
    request behind it waits for ``response_complete``, a shutdown clears
    ``keep_alive``, a lost connection sets ``disconnected``."""

    __slots__ = (
        "body",
        "disconnected",
        "handler",
        "keep_alive",
        "message_event",
        "more_body",
        "previous",
        "protocol",
        "response_complete",
        "scope",
    )

    def __init__(
        self,
        protocol: HeaderDeadlineProtocol,
        scope: dict[str, Any],
        handler: DirectHandler,
        previous: Any,
    ) -> None:
        self.protocol = protocol
        self.scope = scope
        self.handler = handler
        self.previous = previous  # the connection's cycle before this request
        self.body = bytearray()
        self.more_body = True
        self.keep_alive = protocol.parser.should_keep_alive()
        self.disconnected = False
        self.response_complete = False
        self.message_event = _NO_WAITER  # what uvicorn's protocol sets on a lost connection

    async def run(self) -> None:
        try:
            await self.handler(self)
        except Exception:  # the handler answers its own errors: this is a bug's net
            log.exception("unhandled error in %s %s", self.scope["method"], self.scope["path"])
            if not self.response_complete:
                self.response_complete = True
                transport = self.protocol.transport
                if not transport.is_closing():
                    transport.write(_INTERNAL_ERROR)
                    transport.close()
        finally:
            # The protocol holds its last request (``cycle``) until the next one: no cycle
            # through this one back to it, for the collector to find.
            self.handler = self.protocol = None  # type: ignore[assignment]

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Writes the answer (``headers`` are the response's own, with its content-length;
        uvicorn's default headers go first, as it writes them) and ends the request."""
        protocol = self.protocol
        if protocol.flow.write_paused and not self.disconnected:
            await protocol.flow.drain()
        self.response_complete = True
        transport = protocol.transport
        if self.disconnected or transport.is_closing():
            return
        head = [STATUS_LINE[status]]
        for name, value in protocol.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", body)
        transport.write(b"".join(head))
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()
