"""uvicorn's websockets-sansio protocol, holding less per idle connection (issue 27 §3).

An idle consumer is mostly what its connection object holds, and uvicorn's holds, for
the connection's whole life, things only its first moments need or that are sized for
more than one waiter. This subclass changes no behaviour on the wire:

* the receive queue and the `writable` event: an `asyncio.Queue` (three deques, 2.3 KiB)
  and an `asyncio.Event` (a deque, 0.8 KiB) for a single reader, replaced by a list
  that exists while messages wait and a `Flag`;
* the handshake's request and response (their headers, about 3 KiB) are let go once the
  handshake is answered, including the request websockets' parser generator keeps in a
  local variable for the connection's life (about 2 KiB), and so are the ASGI scope's
  headers: a WebSocket's request headers are read before its accept, never after;
* the keepalive pings (PROTOCOL §3): one timer of the event loop serves every
  connection's pings and pong deadlines (server/keepalive.py) instead of a timer handle
  per connection (about 650 bytes and a libuv timer);
* a message the app can send at once goes at once: the scope extension `SEND_NOWAIT`
  (subscribers/connection.py) writes it synchronously when nothing stands in its way
  (the handshake done, the connection open, the transport not paused), so a consumer's
  deliver frame needs no task and no loop pass of its own (issue 27 §2);
* permessage-deflate as uvicorn negotiates it (window bits 12, memLevel 5), but its zlib
  streams made at the first message that needs them, and messages under 256 bytes sent
  uncompressed until then (the `ready` frame): a compressor of those settings holds
  about 38 KiB, which an idle consumer with compression on held from its handshake on.
"""

from __future__ import annotations

import logging
import random
import struct
import zlib
from collections.abc import Sequence
from types import FunctionType
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import OPEN, Protocol
from websockets.server import ServerProtocol
from websockets.typing import ExtensionParameter

from delivery.flag import Flag
from server.keepalive import KeepaliveWheel, wheel_of
from subscribers.connection import SEND_NOWAIT

# Messages shorter than this go uncompressed while no compressor exists (see encode).
_UNCOMPRESSED_BELOW = 256


# What uvicorn sets on every connection at the same value: the server's own objects...
_SERVER_WIDE = (
    "config", "app", "loop", "logger", "root_path", "asgi_version", "app_state",
    "connections", "tasks", "default_headers", "close_timeout", "ping_interval",
    "ping_timeout",
)  # fmt: skip
# ... and the first values of its connection state, until a connection changes them.
_AT_FIRST: dict[str, object] = {
    "transport": None, "server": None, "client": None, "scheme": None,
    "handshake_initiated": False, "handshake_complete": False, "close_sent": False,
    "disconnected": False, "close_timer": None, "initial_response": None,
    "read_paused": False, "ping_timer": None, "pong_timer": None,
    "pending_ping_payload": None, "ping_sent_at": 0.0, "last_ping_rtt": 0.0,
    "curr_msg_data_type": "bytes", "request": None, "response": None,
}  # fmt: skip


class LeanWebSocketProtocol(WebSocketsSansIOProtocol):
    # The server-wide values as class attributes, taken from the first connection (a
    # connection of another server in the same process keeps its own: see __init__).
    _server_wide: dict[str, object] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _ReceiveQueue()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]
        self._share_attributes()
        if self.config.ws_per_message_deflate:
            self.conn = ServerProtocol(
                # As uvicorn's own factory: window bits 12, memLevel 5.
                extensions=[
                    _LazyDeflateFactory(
                        server_max_window_bits=12,
                        client_max_window_bits=12,
                        compress_settings={"memLevel": 5},
                    )
                ],
                max_size=self.config.ws_max_size,
                logger=logging.getLogger("uvicorn.error"),
            )

    def _share_attributes(self) -> None:
        """uvicorn gives each connection some 38 attributes, past the 30 that Python keeps
        in a key table shared by a class's instances, so each connection had a dict of its
        own sized for 64 (1.6 KiB). Those whose value every connection shares (the
        server's objects, identical) or starts with (None, False, 0.0) are read from the
        class instead, until the connection sets its own: its dict holds about 18, in a
        table sized for 32."""
        cls = type(self)
        mine = vars(self)
        wide = cls._server_wide
        if wide is None:
            wide = {name: mine[name] for name in _SERVER_WIDE}
            for name, value in wide.items():
                # A function (an app that is one) read from the class would be a method.
                shared = staticmethod(value) if isinstance(value, FunctionType) else value
                setattr(cls, name, shared)
            cls._server_wide = wide
        self.__dict__ = {
            name: value
            for name, value in mine.items()
            if not (name in wide and wide[name] is value)
            and not (name in _AT_FIRST and _same(_AT_FIRST[name], value))
        }

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        conn = self.conn
        # ServerProtocol.parse reads the request into a local variable, then parses frames
        # in the same generator, which keeps the request (and its headers) alive for the
        # connection's life. uvicorn hands over exactly the request's bytes, so here the
        # parser has nothing buffered and waits for a frame's first byte: a fresh frame
        # parser is in the same state. Not after a rejection (the parser discards then).
        if self.response.status_code != 101:
            return  # refused by websockets itself: no scope, no app
        if not conn.reader.buffer:
            conn.parser = Protocol.parse(conn)
            next(conn.parser)
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["extensions"][SEND_NOWAIT] = self.send_nowait

    def send_nowait(self, message: bytes, binary: bool) -> bool:
        """Write one message (UTF-8 text, or binary) now and say True; False, having done
        nothing, when it cannot go at once: then the app sends it the ASGI way, which
        waits for a paused transport and raises for a connection gone."""
        if (
            not self.handshake_complete
            or self.disconnected
            or self.close_sent
            or self.initial_response is not None
            or not self.writable.is_set()
            or self.conn.state is not OPEN
            or self.transport.is_closing()
        ):
            return False
        if binary:
            self.conn.send_binary(message)
        else:
            self.conn.send_text(message)
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope.pop("extensions", None)  # SEND_NOWAIT: the scope lets go of this object

    def start_keepalive(self) -> None:
        # uvicorn calls this once, right after the handshake's response is written: the
        # request and response are not read again.
        mine = vars(self)
        mine.pop("request", None)  # the class's None again
        mine.pop("response", None)
        # Nor the scope's handshake-only parts: the request's headers (read by the layers
        # that decide on the handshake: request id, client cap, access, relaying to a
        # coordinator; none after the accept), the ASGI version and the denial-response
        # extension (usable only before the accept). About 1.2 KiB a connection. Only
        # SEND_NOWAIT stays, until the connection is lost.
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["headers"] = ()
        scope.pop("asgi", None)
        scope["extensions"] = {SEND_NOWAIT: self.send_nowait}
        super().start_keepalive()

    # -- keepalive: PROTOCOL §3's pings through the loop's one wheel (server/keepalive.py)
    # instead of a timer handle per connection; uvicorn's ping_timer and pong_timer stay
    # None. While a ping's payload is pending, the slot waited in is its pong deadline;
    # else it is the next ping's time.

    _keepalive_slot: int | None = None

    def schedule_ping(self) -> None:
        assert self.ping_interval is not None
        self._keepalive_in(max(0.0, self.ping_interval - self.last_ping_rtt))

    def send_keepalive_ping(self) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        # As uvicorn: a random payload, so that a stale or unsolicited pong is ignored.
        self.pending_ping_payload = struct.pack("!I", random.getrandbits(32))
        self.ping_sent_at = self.loop.time()
        self.conn.send_ping(self.pending_ping_payload)
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.ping_timeout is not None:
            self._keepalive_in(self.ping_timeout)
        else:
            self.schedule_ping()

    def handle_pong(self, event: Frame) -> None:
        if self.pending_ping_payload is None or bytes(event.data) != self.pending_ping_payload:
            return
        self.last_ping_rtt = self.loop.time() - self.ping_sent_at
        self.pending_ping_payload = None
        self._keepalive_out()
        self.schedule_ping()

    def stop_keepalive(self) -> None:
        self._keepalive_out()
        super().stop_keepalive()

    def keepalive_due(self) -> None:
        """The wheel's call: this connection's ping time or pong deadline has come."""
        self._keepalive_slot = None
        if self.pending_ping_payload is None:
            self.send_keepalive_ping()
        else:
            self.keepalive_timeout()

    def _keepalive_in(self, delay_s: float) -> None:
        self._keepalive_out()
        self._keepalive_slot = self._wheel().add(self, delay_s)

    def _keepalive_out(self) -> None:
        slot = self._keepalive_slot
        if slot is not None:
            self._keepalive_slot = None
            self._wheel().discard(self, slot)

    def _wheel(self) -> KeepaliveWheel:
        assert self.ping_interval is not None  # no keepalive is started without one
        return wheel_of(self.loop, self.ping_interval, self.ping_timeout or self.ping_interval)


def _same(first: object, value: object) -> bool:
    return type(first) is type(value) and first == value


for _name, _value in _AT_FIRST.items():
    setattr(LeanWebSocketProtocol, _name, _value)


class _ReceiveQueue:
    """What uvicorn uses of an `asyncio.Queue`: `put_nowait`, `get`, `empty`."""

    __slots__ = ("_items", "_ready")

    def __init__(self) -> None:
        self._items: list[Any] | None = None
        self._ready = Flag()

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = []
        self._items.append(item)
        self._ready.set()

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.pop(0)  # uvicorn pauses reading while messages pile up
        if not self._items:
            self._items = None
        return item


class _LazyDeflateFactory(ServerPerMessageDeflateFactory):
    def process_request_params(
        self, params: Sequence[ExtensionParameter], accepted_extensions: Sequence[Extension]
    ) -> tuple[list[ExtensionParameter], PerMessageDeflate]:
        response, made = super().process_request_params(params, accepted_extensions)
        lazy = _LazyPerMessageDeflate(
            made.remote_no_context_takeover,
            made.local_no_context_takeover,
            made.remote_max_window_bits,
            made.local_max_window_bits,
            made.compress_settings,
        )
        return response, lazy


class _LazyPerMessageDeflate(PerMessageDeflate):
    """`PerMessageDeflate` whose encoder and decoder are made when first used."""

    def __init__(
        self,
        remote_no_context_takeover: bool,
        local_no_context_takeover: bool,
        remote_max_window_bits: int,
        local_max_window_bits: int,
        compress_settings: dict[Any, Any] | None = None,
    ) -> None:
        # As "no context takeover" both ways, the base makes no zlib stream; then the
        # negotiated flags.
        super().__init__(
            True, True, remote_max_window_bits, local_max_window_bits, compress_settings
        )
        self.remote_no_context_takeover = remote_no_context_takeover
        self.local_no_context_takeover = local_no_context_takeover

    def encode(self, frame: Frame) -> Frame:
        # RFC 7692 §6: a message goes compressed only when its first frame says so
        # (RSV1). Until one needs compressing, small ones (`ready`, `acked`) go as they
        # are and no compressor is made: an idle consumer never gets one.
        if (
            "encoder" not in self.__dict__
            and frame.fin
            and frame.opcode in (Opcode.TEXT, Opcode.BINARY)
            and len(frame.data) < _UNCOMPRESSED_BELOW
        ):
            return frame
        return super().encode(frame)

    def __getattr__(self, name: str) -> Any:
        # Only reached while the attribute is missing: before the first message (the
        # base class deletes and remakes them itself without context takeover).
        if name == "encoder":
            self.encoder = zlib.compressobj(
                wbits=-self.local_max_window_bits, **self.compress_settings
            )
            return self.encoder
        if name == "decoder":
            self.decoder = zlib.decompressobj(wbits=-self.remote_max_window_bits)
            return self.decoder
        raise AttributeError(name)
