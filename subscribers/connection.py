"""The frame I/O of one WebSocket consumer connection (PROTOCOL §3), shared by the
durable session and the ephemeral tail.

The reader parses client frames and hands them to a handler, in the connection's own
task; a writer task drains two bounded outboxes: control frames (`acked`, `error`)
and encoded records, which leave batched into as few `deliver` frames as fit. The
writer exists only while something waits to be written: an idle consumer holds one
task, not three (issue 27 §3: a task and its frames cost about 1 KiB). Records are
queued only against credit the client granted, so that outbox is bounded by the
credit (≤ 1,000,000 records); the control outbox is bounded by count and the
reader waits for room, so a client that stops reading stops being read.

A deliver frame goes out at once, in the engine's own step, when nothing else waits to
be written and the ASGI server offers the scope extension ``SEND_NOWAIT`` (Herald's
own WebSocket protocol does, server/websocket_protocol.py): no writer task and no loop
pass of its own per frame (issue 27 §2). Otherwise, and whenever the socket cannot take
it at once, the writer task sends it.

Frames are encoded by the connection's codec (subscribers/codec.py), chosen in the
handshake: JSON in text frames, or msgpack in binary frames.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from delivery.flag import Flag
from herald.protocol.close_codes import CloseCode
from herald.protocol.frames import ClientFrame
from subscribers.codec import JSON, Codec
from subscribers.frames import BadFrame

log = logging.getLogger(__name__)

# The scope extension an ASGI server may offer: (message, binary) -> bool, which writes
# one message at once and says True, or does nothing and says False when it cannot
# (handshake not done, transport paused, connection closing).
SEND_NOWAIT = "herald.send_nowait"
SendNowait = Callable[[bytes, bool], bool]


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    # Soft size of one `deliver` frame: a frame holds at least one record, and stops
    # before the record that would take it past this. Under the 1 MiB default
    # max_size of common clients (python-websockets), so they never see 1009.
    max_frame_bytes: int = 512 * 1024
    max_control_frames: int = 256  # queued `acked`/`error` replies before the reader waits
    max_bad_frames: int = 100  # PROTOCOL §3: after 100 bad frames, close 1008
    # PROTOCOL §6: records queued for a consumer that does not read stop here (in bytes),
    # whatever credit it gave (subscribers/session.py hands the engine credit in slices).
    max_unsent_bytes: int = 4 * 1024 * 1024


FrameHandler = Callable[[ClientFrame], bytes | None]


class ConsumerConnection:
    """Reader and writer of one accepted WebSocket; knows frames, not subscriptions."""

    def __init__(
        self,
        websocket: WebSocket,
        settings: ConnectionSettings | None = None,
        codec: Codec = JSON,
    ) -> None:
        self.websocket = websocket
        self.settings = settings or ConnectionSettings()
        self.codec = codec  # what every frame of this connection is encoded with
        # Lists and Flags, not deques and asyncio.Events: an empty deque or Event holds
        # 760 bytes on CPython, and an idle consumer holds nothing else of this size
        # (issue 27 §3). Frames leave in batches, so taking from the front is rare.
        self._records: list[bytes] = []
        self._records_bytes = 0
        self._control: list[bytes] = []
        self._group: asyncio.TaskGroup | None = None  # while `run` runs
        self._writer: asyncio.Task[None] | None = None  # while something waits to be written
        self._on_disconnect: Callable[[], None] | None = None
        self._control_room = Flag(True)
        self._drained = Flag(True)  # the record outbox is empty
        self._close: tuple[int, str] | None = None
        self._close_sent = False
        self.disconnected = False  # the client went away (or a send failed)
        self.bad_frames = 0
        self.on_written: Callable[[], None] | None = None  # after each deliver frame left
        self._send_nowait: SendNowait | None = websocket.scope.get("extensions", {}).get(
            SEND_NOWAIT
        )

    # -- called on the loop, never block --------------------------------------------

    def push_records(self, encoded: Iterable[bytes]) -> None:
        """Queue encoded records for `deliver` frames; the caller already spent credit."""
        if self._close is not None or self.disconnected:
            return
        records = self._records
        before = len(records)
        for item in encoded:
            records.append(item)
            self._records_bytes += len(item)
        if len(records) != before:
            self._drained.clear()
            if not self._write_at_once():
                self._start_writer()

    def request_close(self, code: int, reason: str) -> None:
        """Close once what is queued has been written; the first request wins."""
        if self._close is None:
            self._close = (code, reason)
            self._start_writer()

    @property
    def closing(self) -> bool:
        return self._close is not None or self.disconnected

    @property
    def queued_bytes(self) -> int:
        return self._records_bytes

    async def wait_drained(self) -> None:
        """Wait until every queued record has been written (tail backpressure)."""
        await self._drained.wait()

    # -- the connection's tasks -------------------------------------------------------

    async def send_now(self, frame: bytes) -> None:
        """Write one frame before the writer runs (the `ready` frame)."""
        if self.codec.binary:
            await self.websocket.send_bytes(frame)
        else:
            await self.websocket.send_text(frame.decode())

    async def run(
        self,
        handle: FrameHandler,
        on_disconnect: Callable[[], None],
        worker: Coroutine[Any, Any, None] | None = None,
    ) -> None:
        """Read and write until the client goes away or a requested close is sent.

        STYLE 4: the writer lives in this connection's TaskGroup, so it never outlives
        the connection; so does ``worker``, a task the connection owns (a tail's
        delivery), cancelled once reading ends, its failure the connection's. Reading
        ends at the `websocket.disconnect` the ASGI server delivers once the client goes
        away or the writer has sent the close.
        """
        self._on_disconnect = on_disconnect
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                working = None if worker is None else group.create_task(worker)
                self._start_writer()  # what was queued before (after the `ready` frame)
                await self._read_loop(handle, on_disconnect)
                if working is not None:
                    working.cancel()
                if self.disconnected and self._writer is not None:
                    self._writer.cancel()  # blocked on a send that cannot complete
        finally:
            self._group = None
            # Let go of the owner's callbacks (a tail's runtime's wake, a consumer
            # session's top-up), which nothing calls once the writer has ended: each held
            # the session that holds this connection, a cycle only the collector frees,
            # later (issue 27 §3: a busy server seldom runs a full collection).
            self._on_disconnect = None
            self.on_written = None

    def _start_writer(self) -> None:
        group = self._group
        if group is None or self._writer is not None or self._close_sent:
            return
        if self._control or self._records or self._close is not None:
            self._writer = group.create_task(self._write_loop())

    async def _read_loop(self, handle: FrameHandler, on_disconnect: Callable[[], None]) -> None:
        while not self.closing:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self._lost(on_disconnect)
                return
            try:
                reply = handle(self.codec.parse(message))
            except BadFrame as bad:
                reply = self.codec.error_frame(bad.code, bad.message)
                self.bad_frames += 1
                if self.bad_frames >= self.settings.max_bad_frames:
                    # PROTOCOL §3: the 100th bad frame is answered, then the connection closed.
                    await self._queue_control(reply)
                    self.request_close(CloseCode.POLICY, "too many bad frames")
                    return
            if reply is not None:
                await self._queue_control(reply)

    async def _queue_control(self, frame: bytes) -> None:
        while len(self._control) >= self.settings.max_control_frames:
            self._control_room.clear()
            await self._control_room.wait()
        self._control.append(frame)
        self._start_writer()

    async def _write_loop(self) -> None:
        """Write what is queued, then the close if one was requested; ends when nothing
        is left (the next push starts a writer again)."""
        try:
            while self._control or self._records:
                if self._control:
                    frame = self._control.pop(0)  # at most max_control_frames
                    self._control_room.set()
                    await self.send_now(frame)
                if self._records:
                    await self.send_now(self._next_deliver_frame())
                    if self.on_written is not None:
                        self.on_written()
            self._drained.set()
            if self._close is not None and not self.disconnected:
                code, reason = self._close
                self._close_sent = True
                # A close reason is at most 123 bytes (RFC 6455 §5.5).
                await self.websocket.close(code, reason.encode()[:123].decode(errors="ignore"))
        except (WebSocketDisconnect, WebSocketDisconnected, OSError) as exc:
            # uvicorn raises ClientDisconnected (an OSError) or Starlette turns it into
            # WebSocketDisconnect; a send after the close is WebSocketDisconnected.
            log.debug("consumer connection lost while writing: %r", exc)
            if self._on_disconnect is not None:
                self._lost(self._on_disconnect)
        finally:
            self._writer = None

    def _write_at_once(self) -> bool:
        """Write the queued records now, if nothing else waits to be written (the writer
        task, control frames, a close) and the socket takes every frame at once; else
        False, with what is left still queued for the writer task."""
        send = self._send_nowait
        if send is None or self._group is None or self._writer is not None:
            return False  # `_group` None: not running yet, the `ready` frame goes first
        if self._control or self._close is not None:
            return False
        records, binary = self._records, self.codec.binary
        while records:
            n, size = self._next_batch()
            if not send(self.codec.deliver_frame(records[:n]), binary):
                return False
            del records[:n]
            self._records_bytes -= size
        self._drained.set()
        if self.on_written is not None:
            # Not inside the engine's step that pushed these records: right after it, as
            # from the writer task.
            asyncio.get_running_loop().call_soon(self._written)
        return True

    def _written(self) -> None:
        if self.on_written is not None:
            self.on_written()

    def _next_deliver_frame(self) -> bytes:
        n, size = self._next_batch()
        batch = self._records[:n]
        del self._records[:n]
        self._records_bytes -= size
        return self.codec.deliver_frame(batch)

    def _next_batch(self) -> tuple[int, int]:
        """(n, bytes) of the first queued records that fit one frame; always at least one
        (PROTOCOL §3: a frame carries 1..k records, never more than the credit already
        spent on them)."""
        records, budget = self._records, self.settings.max_frame_bytes
        size, n = len(records[0]), 1
        while n < len(records) and size + len(records[n]) + 1 <= budget:
            size += len(records[n]) + 1
            n += 1
        return n, size - (n - 1)

    def _lost(self, on_disconnect: Callable[[], None]) -> None:
        if not self.disconnected:
            self.disconnected = True
            self._records.clear()
            self._records_bytes = 0
            self._drained.set()
            self._control_room.set()
            on_disconnect()  # PROTOCOL §3: in-flight records are given back at once
