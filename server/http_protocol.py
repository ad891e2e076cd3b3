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
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The scope extension: () -> bool, True when the next receive() will not wait.
RECEIVE_READY = "herald.receive_ready"


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

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._headers_due = None
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
