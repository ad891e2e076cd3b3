"""An ephemeral tail of a topic (PROTOCOL §3): `async for msg in Tail(url, topic)`.

At most once and nothing stored on the server: no subscription, no cursor, gone on
disconnect. So it never reconnects either (a new tail would start again from its
`start`): a lost connection ends the iteration with the SDK's error. Given a cluster's
node URLs, it opens at the first that can be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Sequence
from urllib.parse import quote, urlencode

import websockets
from websockets.asyncio.client import ClientConnection

from herald._http import DEFAULT_URL, node_urls, ws_ssl
from herald.consumer import as_client_error, offered, wires
from herald.errors import ConsumerClosedError
from herald.message import Message, PackedMessage
from herald.protocol.close_codes import TERMINAL, CloseCode
from herald.protocol.frames import (
    CreditFrame,
    PackedTailDeliverFrame,
    PackedTailFrame,
    ReadyFrame,
    TailDeliverFrame,
    TailFrame,
)
from herald.protocol.limits import MAX_CREDIT


class Tail:
    """Records of `topic` as they are published (`start`: "latest", "earliest", an
    offset applied to every partition, or "ts:<ms>"), `credit` at a time; `limit`
    ends it after that many records. Use it as `async with Tail(...) as tail:`."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        topic: str = "",
        token: str | None = None,
        *,
        start: str | int = "latest",
        credit: int = 1000,
        limit: int | None = None,
        open_timeout: float = 10.0,
        compression: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        encoding: str = "auto",
    ) -> None:
        if not topic:
            raise ValueError("topic is required")
        # As a Consumer's: msgpack frames when the server speaks them, else JSON.
        self._subprotocols = offered(encoding)
        self.encoding = encoding
        if not 1 <= credit <= MAX_CREDIT:
            raise ValueError(f"credit must be 1..{MAX_CREDIT}")
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        if limit is not None:
            credit = min(credit, limit)  # never sent records it will not take
        # The token travels in the Authorization header only: a URL ends up in logs.
        query = {"from": str(start), "credit": str(credit)}
        self.urls = node_urls(url)
        self._target = f"/v1/topics/{quote(topic, safe='')}/ws?{urlencode(query)}"
        self.url = self.urls[0]
        self.ws_url = self._ws_url(self.url)
        self.topic = topic
        self.credit = credit
        self.limit = limit
        self.open_timeout = open_timeout
        self.compression = compression
        self._ssl = ssl_context  # a private CA's, for wss:// nodes
        self._headers = {"authorization": f"Bearer {token}"} if token else None
        self._ws: ClientConnection | None = None
        self._buffer: deque[Message] = deque()
        self._taken = 0
        self._granted = credit  # in all, so that `limit` is never exceeded
        self._owed = 0
        self._closed = False

    @property
    def frame_encoding(self) -> str:
        """How the open connection's frames go: "msgpack", "json", or "none" before it opens."""
        ws = self._ws
        if ws is None:
            return "none"
        return "msgpack" if _WIRES[ws.subprotocol].message is PackedMessage else "json"

    async def __aenter__(self) -> Tail:
        await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Tail:
        return self

    async def close(self) -> None:
        self._closed = True
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(websockets.WebSocketException, OSError):
                await ws.close()

    async def __anext__(self) -> Message:
        if self._closed or (self.limit is not None and self._taken >= self.limit):
            raise StopAsyncIteration
        ws = self._ws or await self._connect()
        wire = _WIRES[ws.subprotocol]
        while not self._buffer:
            try:
                raw = await ws.recv()
            except websockets.ConnectionClosed as closed:
                received = closed.rcvd
                if received is not None and received.code in TERMINAL:
                    raise ConsumerClosedError(received.code, received.reason) from closed
                if received is not None and received.code in (
                    CloseCode.NORMAL,
                    CloseCode.GOING_AWAY,
                ):
                    raise StopAsyncIteration from None  # the server went away cleanly
                raise as_client_error(closed, self.url)  # noqa: B904 (its context is kept)
            frame = wire.read(raw)
            if type(frame) is wire.read.deliver:
                self._buffer.extend(wire.message(m) for m in frame.messages)
        self._taken += 1
        self._owed += 1
        await self._give_credit(ws)
        return self._buffer.popleft()

    async def _give_credit(self, ws: ClientConnection) -> None:
        # Half the window at a time, as the Consumer does; never past `limit`.
        if self._owed < max(1, self.credit // 2):
            return
        n, self._owed = self._owed, 0
        if self.limit is not None:
            n = min(n, self.limit - self._granted)
        if n > 0:
            self._granted += n
            await ws.send(_WIRES[ws.subprotocol].write(CreditFrame(n=n)))

    def _ws_url(self, url: str) -> str:
        return url.replace("http", "ws", 1) + self._target

    async def _connect(self) -> ClientConnection:
        if self._ws is not None:
            return self._ws
        for index, url in enumerate(self.urls):
            # PROTOCOL §7: any node serves a tail; the next one when this is down.
            self.url, self.ws_url = url, self._ws_url(url)
            try:
                ws = await websockets.connect(
                    self.ws_url,
                    additional_headers=self._headers,
                    max_size=None,
                    open_timeout=self.open_timeout,
                    compression=self.compression,
                    subprotocols=self._subprotocols,
                    **ws_ssl(self.ws_url, self._ssl),
                )
                break
            except Exception as exc:
                if index == len(self.urls) - 1 or not _node_down(exc):
                    raise as_client_error(exc, url)  # noqa: B904 (its context is kept)
        try:
            async with asyncio.timeout(self.open_timeout):
                ready = _WIRES[ws.subprotocol].read(await ws.recv())
            if not isinstance(ready, ReadyFrame):
                raise ConnectionError("the server did not start with a ready frame")
        except websockets.ConnectionClosed as closed:
            await ws.close()
            received = closed.rcvd
            if received is not None and received.code in TERMINAL:
                raise ConsumerClosedError(received.code, received.reason) from closed
            raise as_client_error(closed, self.url)  # noqa: B904 (its context is kept)
        except Exception as exc:
            await ws.close()
            raise as_client_error(exc, self.url)  # noqa: B904 (its context is kept)
        self._ws = ws
        return ws


_WIRES = wires(TailFrame, TailDeliverFrame, PackedTailFrame, PackedTailDeliverFrame)


def _node_down(exc: Exception) -> bool:
    """A failure another node may not have: unreachable, or a 5xx on the upgrade."""
    if isinstance(exc, websockets.InvalidStatus):
        return exc.response.status_code >= 500
    return isinstance(exc, OSError | TimeoutError)
