"""uvicorn's websockets-sansio protocol, holding less per idle connection (issue 27 §3).

An idle consumer is mostly what its connection object holds, and uvicorn's holds, for
the connection's whole life, things only its first moments need or that are sized for
more than one waiter. This subclass changes no behaviour on the wire:

* the receive queue and the `writable` event: an `asyncio.Queue` (three deques, 2.3 KiB)
  and an `asyncio.Event` (a deque, 0.8 KiB) for a single reader, replaced by a list
  that exists while messages wait and a `Flag`;
* the handshake's request and response (their headers, about 3 KiB) are let go once the
  handshake is answered, including the request websockets' parser generator keeps in a
  local variable for the connection's life (about 2 KiB);
* permessage-deflate as uvicorn negotiates it (window bits 12, memLevel 5), but its zlib
  streams made at the first message that needs them, and messages under 256 bytes sent
  uncompressed until then (the `ready` frame): a compressor of those settings holds
  about 38 KiB, which an idle consumer with compression on held from its handshake on.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Protocol
from websockets.server import ServerProtocol
from websockets.typing import ExtensionParameter

from subscribers.flag import Flag

# Messages shorter than this go uncompressed while no compressor exists (see encode).
_UNCOMPRESSED_BELOW = 256


class LeanWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _ReceiveQueue()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]
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

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        conn = self.conn
        # ServerProtocol.parse reads the request into a local variable, then parses frames
        # in the same generator, which keeps the request (and its headers) alive for the
        # connection's life. uvicorn hands over exactly the request's bytes, so here the
        # parser has nothing buffered and waits for a frame's first byte: a fresh frame
        # parser is in the same state. Not after a rejection (the parser discards then).
        if self.response.status_code == 101 and not conn.reader.buffer:
            conn.parser = Protocol.parse(conn)
            next(conn.parser)

    def start_keepalive(self) -> None:
        # uvicorn calls this once, right after the handshake's response is written: the
        # request and response are not read again.
        self.request = self.response = None  # type: ignore[assignment]
        super().start_keepalive()


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
