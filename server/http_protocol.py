"""uvicorn's httptools protocol with a deadline for request headers (slow-loris).

uvicorn times out idle keep-alive connections but not a client that opens a
connection and then trickles its request line and headers a byte at a time;
such a client could hold a socket and a parser for ever. Here each request's
headers must be complete within ``header_timeout_s`` of the connection opening
or of the previous response, else the connection is closed. Bodies have their
own deadline in the app (server/limits.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers (keep-alive) have the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _expired(self) -> None:
            self._header_deadline = None
            # Only a connection between requests (no cycle running) is cut.
            if (self.cycle is None or self.cycle.response_complete) and not (
                self.transport.is_closing()
            ):
                self.transport.close()

    return HeaderDeadlineProtocol
