"""The consumer: `async for msg in Consumer(url, subscription)` over the WebSocket
protocol of PROTOCOL §3, with batched acks, credit replenished as messages are
consumed, and reconnection with exponential backoff once a connection has been
ready (a server never reached, or not a Herald server, is an error at once).

Given the URLs of a cluster's nodes (PROTOCOL §7: a consumer may connect to any
node), it connects to one and, whenever a connection fails or is lost — a node
killed, a close with 1012 "service restart" when its subscription's coordinator
dies, 1001 when a node shuts down — reconnects to the next one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, get_args
from urllib.parse import quote, urlencode

import msgspec
import websockets
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from herald._http import DEFAULT_URL, node_urls, ws_ssl
from herald.errors import ConsumerClosedError, HeraldClientError, HeraldConnectionError
from herald.message import Message, PackedMessage
from herald.protocol.close_codes import COME_BACK, TERMINAL, CloseCode
from herald.protocol.encodings import MSGPACK_SUBPROTOCOL
from herald.protocol.frames import (
    AckFrame,
    ConsumerFrame,
    CreditFrame,
    DeliverFrame,
    ErrorFrame,
    ExtendFrame,
    NackFrame,
    PackedConsumerFrame,
    PackedDeliverFrame,
    ReadyFrame,
)
from herald.protocol.limits import MAX_CREDIT
from herald.protocol.unchecked import unchecked, unchecked_struct

log = logging.getLogger(__name__)

# PROTOCOL §3 close codes after which reconnecting cannot help.


class Consumer:
    """A durable consumer of one subscription, reconnecting until closed.

    `credit` is how many records may be on their way or waiting here unread; the
    consumer gives credit back as the application takes messages, so at most
    `credit` records are buffered locally. Messages buffered but not yet taken
    when the connection drops are discarded: the server gives them back for
    redelivery (PROTOCOL §3).

    `limit` makes the consumer take at most that many records in all: it grants no
    credit beyond them (so none is sent that would come back as a redelivery) and
    iteration ends after the last.

    `url` is one server's URL or a list of a cluster's nodes. A lost connection is
    followed by a new one to the next node in the list (after a jittered backoff), with
    the same credit. What was in flight on the lost connection the server redelivers
    (PROTOCOL §3), and what had arrived here unread is discarded, so no record is lost
    and none is handed over twice for one delivery. Acks are by record id and count
    on any connection (PROTOCOL §3: an in-flight record acked by any consumer is acked):
    acks queued but not yet sent when a connection drops go out on the next one, so a
    record the application finished is not worked on again needlessly; acks already
    sent are not sent again. Nacks and extends are tied to the connection that delivered
    the record and are dropped once it is gone, since the server has already given the
    record back (a nack then would take it from whichever consumer now holds it).
    A consumer never connected tries each URL once before failing, except that a node
    closing it with 1012 (its subscription's coordinator is moving) is come back to.
    """

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        subscription: str = "",
        token: str | None = None,
        credit: int = 100,
        *,
        ack_interval_ms: float = 20.0,
        max_ack_batch: int = 1000,
        min_backoff: float = 0.05,
        max_backoff: float = 5.0,
        open_timeout: float = 10.0,
        compression: str | None = None,
        limit: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        encoding: str = "auto",
    ) -> None:
        if not subscription:
            raise ValueError("subscription is required")
        # "auto": frames in msgpack when the server speaks it (a bytes record's bytes
        # travel as themselves, not as base64: docs/protocol.md "MessagePack"); "json":
        # JSON always.
        self._subprotocols = offered(encoding)
        self.encoding = encoding
        self._wire = _WIRES[None]  # the live connection's, once one is open
        if not 1 <= credit <= MAX_CREDIT:
            raise ValueError(f"credit must be 1..{MAX_CREDIT}")
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._taken = 0  # records handed to the application, over all connections
        self._grant_left: int | None = None  # credit this connection may still grant
        self.urls = node_urls(url)
        self._current = 0  # the node connected to, or to be tried next
        self._ws_path = f"/v1/subscriptions/{quote(subscription, safe='')}/ws"
        self.ws_url = self._session_url(credit)
        self.subscription = subscription
        self.credit = credit
        self.ack_interval = ack_interval_ms / 1000
        self.max_ack_batch = max_ack_batch
        self.min_backoff, self.max_backoff = min_backoff, max_backoff
        self.open_timeout = open_timeout
        # No permessage-deflate by default: measured with 1 KiB records (issue #13), it
        # cost the server 12 µs and this client 3 µs of CPU per record (server 29.6 vs
        # 17.6 µs, client 11.8 vs 9.0 µs per record consumed and acked). "deflate" is for
        # links where bandwidth costs more than CPU.
        self.compression = compression
        self._ssl = ssl_context  # a private CA's, for wss:// nodes
        self.consumer_id: str | None = None
        self.connections = 0  # how many times a connection became ready
        self._ready_attempt = 0
        self._quick_retries = 0  # 1012 retries since then: they do not grow the backoff
        self._failures = 0  # connection attempts failed since the last ready one
        self._lost_url = self.url  # the node whose connection failed last (for the log)
        self._session_answerer: _SessionAnswerer | None = None  # the live connection's
        self._headers = {"authorization": f"Bearer {token}"} if token else None
        # At most `credit` messages: the server never sends more than the credit given.
        self._inbox = _Inbox(credit)
        self._pending_acks: list[str] = []
        self._frames: deque[NackFrame | ExtendFrame] = deque(maxlen=10_000)
        self._owed_credit = 0  # taken from the inbox, not yet given back to the server
        self._outgoing = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._done = asyncio.Event()

    @property
    def frame_encoding(self) -> str:
        """How the live (or last) connection's frames went: "msgpack" or "json"."""
        return "msgpack" if self._wire.message is PackedMessage else "json"

    @property
    def url(self) -> str:
        """The node connected to (or to be tried next)."""
        return self.urls[self._current]

    # -- the application side ----------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        if self.limit is not None and self._taken >= self.limit:
            raise StopAsyncIteration
        self.start()
        items = self._inbox.items
        while not items:
            if self._failure is not None:
                raise self._failure
            if self._closed or self._done.is_set():
                raise StopAsyncIteration
            # One plain future, no helper tasks: at a few thousand messages a second
            # that is most of the time from frame to application.
            await self._inbox.wait()
        self._took(1)
        return items.popleft()

    async def take_batch(self, limit: int) -> list[Message]:
        """Wait for the next message, then take it and up to `limit - 1` more that are
        already here: one await per batch for consumers that work in bulk. An empty
        list means the consumer is closed (as `async for` would stop)."""
        try:
            first = await self.__anext__()
        except StopAsyncIteration:
            return []
        items = self._inbox.items
        more = min(limit - 1, len(items))
        if self.limit is not None:
            more = min(more, self.limit - self._taken)
        if more <= 0:
            return [first]
        batch = [first, *(items.popleft() for _ in range(more))]
        self._took(more)
        return batch

    def start(self) -> None:
        if self._runner is None and not self._closed:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Send pending acks, close the connection, stop iterating."""
        if self._closed:
            return
        self._closed = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(websockets.ConnectionClosed, OSError):
                await self._flush(ws)
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.wait((self._runner,))  # never swallows our own cancellation
        self._finish()

    async def ack_many(self, messages: Iterable[Message]) -> None:
        """Ack every one of `messages` (what `await msg.ack()` on each does, in one call:
        for a batch from `take_batch`)."""
        self._pending_acks.extend(message.id for message in messages)
        if len(self._pending_acks) >= self.max_ack_batch:
            self._outgoing.set()

    def queue_ack(self, message_id: str) -> None:
        self._pending_acks.append(message_id)
        if len(self._pending_acks) >= self.max_ack_batch:
            self._outgoing.set()

    def queue_frame(self, frame: NackFrame | ExtendFrame) -> None:
        """A nack or extend frame for the current connection (dropped if it is lost
        before the frame is sent: the server gives its records back anyway)."""
        self._frames.append(frame)
        self._outgoing.set()

    def _queue_frame_of(self, session: _SessionAnswerer, frame: NackFrame | ExtendFrame) -> None:
        # A nack or extend of a record delivered on a connection that is gone: the
        # server already gave it back for redelivery, so it is not ours to answer.
        if session is self._session_answerer:
            self.queue_frame(frame)
        else:
            log.debug(
                "herald: %s of a lost connection's record dropped", frame.__struct_config__.tag
            )

    def _session_url(self, credit: int) -> str:
        # The token travels in the Authorization header only: a URL ends up in logs.
        query = {"credit": str(credit)}
        base = self.url.replace("http", "ws", 1)
        return f"{base}{self._ws_path}?{urlencode(query)}"

    def _took(self, n: int) -> None:
        # Credit goes back as messages are taken, half the window at a time, so the
        # server keeps sending while the application works (PROTOCOL §3 credit).
        self._taken += n
        self._owed_credit += n
        if self._owed_credit >= max(1, self.credit // 2):
            self._outgoing.set()

    # -- the connection side -----------------------------------------------------------

    async def _run(self) -> None:
        try:
            retrying = AsyncRetrying(
                retry=retry_if_exception(self._worth_reconnecting),
                wait=self._reconnect_wait,
                before_sleep=self._log_reconnect,
            )
            async for attempt in retrying:
                with attempt:
                    await self._session(attempt.retry_state.attempt_number)
        except Exception as exc:  # handed to the iterating application, not swallowed
            self._failure = as_client_error(exc, self._lost_url)
        finally:
            self._finish()

    def _finish(self) -> None:
        if not self._done.is_set():
            self._done.set()
            self._inbox.wake_all()  # every reader waiting sees the end

    def _worth_reconnecting(self, exc: BaseException) -> bool:
        # Only a consumer that has been connected reconnects for good: one that never
        # got as far as `ready` is pointed at dead or wrong servers, which waiting will
        # not fix; it tries each URL once (a cluster may have a node down) — unless a
        # Herald node asked it to come back (1012 while its coordinator moves).
        if not _worth_reconnecting(exc):
            return False
        return self.connections > 0 or self._failures < len(self.urls) or _asked_to_come_back(exc)

    def _log_reconnect(self, state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "herald: consumer of %r lost its connection to %s (%s); reconnecting in %.2f s to %s",
            self.subscription,
            self._lost_url,
            _describe(exc),
            delay,
            self.url,
        )

    def _reconnect_wait(self, state: RetryCallState) -> float:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is not None and _closed_with(exc, COORDINATOR_MOVING):
            # PROTOCOL §7: the subscription's coordinator is moving and the node asks us
            # back; its successor takes over within about a second of the old one's
            # lease. Come back soon, jittered, and do not count it as a failure that
            # grows the backoff as a dead server's would.
            self._quick_retries += 1
            return random.uniform(*COORDINATOR_MOVING_RETRY_S)
        # The backoff starts again from min_backoff after every connection that got
        # as far as `ready`, so a long-lived consumer does not wait max_backoff.
        failures = max(1, state.attempt_number - self._ready_attempt - self._quick_retries)
        delay = min(self.max_backoff, self.min_backoff * 2.0 ** (failures - 1))
        return delay * random.uniform(0.5, 1.0)

    async def _session(self, attempt: int) -> None:
        """One connection to the current node; on its failure or loss the next node of
        the list is the one the following attempt tries."""
        try:
            await self._connection(attempt)
        except Exception:
            self._failures += 1
            self._lost_url = self.url
            self._current = (self._current + 1) % len(self.urls)
            raise

    async def _connection(self, attempt: int) -> None:
        """One connection: ready, then read and write until it ends (raises on loss)."""
        credit = self.credit
        if self.limit is not None:
            # Never more credit than records still to take (PROTOCOL §3: the server
            # sends no more than the credit given).
            credit = max(1, min(credit, self.limit - self._taken))
            self._grant_left = self.limit - self._taken - credit
        self.ws_url = self._session_url(credit)
        async with websockets.connect(
            self.ws_url,
            additional_headers=self._headers,
            max_size=None,
            open_timeout=self.open_timeout,
            compression=self.compression,
            subprotocols=self._subprotocols,
            **ws_ssl(self.ws_url, self._ssl),
        ) as ws:
            # msgpack when the server selected it, else JSON (a Herald before msgpack).
            wire = self._wire = _WIRES[ws.subprotocol]
            try:
                # A server that upgrades but never says `ready` is not Herald's.
                async with asyncio.timeout(self.open_timeout):
                    ready = wire.read(await ws.recv())
                if not isinstance(ready, ReadyFrame):
                    raise ConnectionError("the server did not start with a ready frame")
                self.consumer_id = ready.consumer
                self.connections += 1
                self._ready_attempt = attempt
                self._quick_retries = 0
                self._failures = 0
                self._ws = ws
                self._session_answerer = _SessionAnswerer(self)
                self._owed_credit = 0  # the new connection starts with `credit` again
                # The writer is owned by this connection: cancelled and awaited with it.
                writer = asyncio.ensure_future(self._write_loop(ws))
                try:
                    await self._read_loop(ws, self._session_answerer)
                finally:
                    writer.cancel()
                    await asyncio.wait((writer,))
            except websockets.ConnectionClosed as closed:
                _raise_if_terminal(closed)
                raise
            finally:
                self._ws = None
                self._session_answerer = None
                self._discard_unread()

    async def _read_loop(self, ws: ClientConnection, answerer: _SessionAnswerer) -> None:
        read, deliver, message = self._wire.read, self._wire.read.deliver, self._wire.message
        async for raw in ws:
            frame = read(raw)
            if type(frame) is deliver:
                # A Message wraps the decoded record: nothing copied.
                self._inbox.put([message(item, answerer) for item in frame.messages])
            elif isinstance(frame, ErrorFrame):
                log.warning("server refused a frame: %s %s", frame.code, frame.message)
        # The server closed the connection normally or going away; find out why.
        if ws.close_code is not None and ws.close_code in TERMINAL:
            raise ConsumerClosedError(ws.close_code, ws.close_reason or "")
        raise ConnectionError(f"connection closed ({ws.close_code})")

    async def _write_loop(self, ws: ClientConnection) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation that races the event, and this task is cancelled on close.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ack_interval):
                    await self._outgoing.wait()
            self._outgoing.clear()
            await self._flush(ws)

    async def _flush(self, ws: ClientConnection) -> None:
        write = self._wire.write
        if self._pending_acks:
            ids, self._pending_acks = self._pending_acks, []
            await ws.send(write(AckFrame(ids=ids)))
        while self._frames:
            await ws.send(write(self._frames.popleft()))
        if self._owed_credit > 0:
            n, self._owed_credit = self._owed_credit, 0
            if self._grant_left is not None:
                n = min(n, self._grant_left)
                self._grant_left -= n
            if n > 0:
                await ws.send(write(CreditFrame(n=n)))

    def _discard_unread(self) -> None:
        # The server redelivers what the lost connection had in flight (PROTOCOL §3):
        # records here unread would otherwise be handed over twice. Nacks and extends
        # not yet sent go too (they name records no longer ours); acks stay queued for
        # the next connection (by record id, valid on any).
        self._inbox.items.clear()
        self._frames.clear()


class FrameReader:
    """PROTOCOL §3 server frames of one kind of socket (herald/protocol/frames.py), read
    without their constraints: what a Herald server sends is not checked again
    (herald/protocol/unchecked.py). A frame of a `type` this SDK does not know (a newer
    server's) reads as None and is skipped; one that is not what its `type` says raises
    ValueError (msgspec's), which ends the connection. ``packed``: frames in msgpack
    (docs/protocol.md "MessagePack")."""

    __slots__ = ("_decode", "_known", "_typed", "deliver")

    def __init__(self, frames: Any, deliver: type[Any], packed: bool = False) -> None:
        codec = msgspec.msgpack if packed else msgspec.json
        self._decode = codec.Decoder(unchecked(frames)).decode
        self._typed = codec.Decoder(_Typed).decode
        self._known = frozenset(str(f.__struct_config__.tag) for f in get_args(frames))
        self.deliver = unchecked_struct(deliver)  # compared by identity: the hot path

    def __call__(self, raw: str | bytes) -> Any:
        try:
            return self._decode(raw)
        except msgspec.ValidationError:
            if self._type_of(raw) in self._known:
                raise
            return None

    def _type_of(self, raw: str | bytes) -> object:
        try:
            return self._typed(raw).type
        except msgspec.DecodeError:
            return None


class _Typed(msgspec.Struct):
    type: object = None


class Wire:
    """How one connection's frames go: JSON in text frames (PROTOCOL §3), or msgpack in
    binary frames once the server selected the subprotocol (docs/protocol.md
    "MessagePack"). ``read`` decodes a server frame; ``write`` encodes a client frame
    for ``send`` (str: a text frame, bytes: a binary one); ``message`` wraps a record."""

    __slots__ = ("message", "read", "write")

    def __init__(self, read: FrameReader, packed: bool) -> None:
        self.read = read
        self.write: Callable[[Any], str | bytes] = (
            _encode_packed if packed else lambda frame: encode_frame(frame).decode()
        )
        self.message: type[Message] = PackedMessage if packed else Message


def wires(
    frames: Any, deliver: type[Any], packed_frames: Any, packed_deliver: type[Any]
) -> dict[str | None, Wire]:
    """A socket's two wires, by the subprotocol the server selected (None: JSON)."""
    return {
        None: Wire(FrameReader(frames, deliver), packed=False),
        MSGPACK_SUBPROTOCOL: Wire(FrameReader(packed_frames, packed_deliver, True), packed=True),
    }


def offered(encoding: str) -> list[Subprotocol] | None:
    """The subprotocols a socket offers for ``encoding`` ("auto": msgpack, "json": none)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    return [Subprotocol(MSGPACK_SUBPROTOCOL)] if encoding == "auto" else None


ENCODINGS = ("auto", "json")
encode_frame = msgspec.json.Encoder().encode
_encode_packed = msgspec.msgpack.Encoder().encode
_WIRES = wires(ConsumerFrame, DeliverFrame, PackedConsumerFrame, PackedDeliverFrame)


class _SessionAnswerer:
    """What the messages of one connection answer through: acks go to the consumer
    whatever connection is live; nacks and extends only while theirs is."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def queue_ack(self, message_id: str) -> None:
        self._consumer.queue_ack(message_id)

    def queue_frame(self, frame: NackFrame | ExtendFrame) -> None:
        self._consumer._queue_frame_of(self, frame)


class _Inbox:
    """Records delivered and not yet taken, and the readers waiting for them. Bounded
    by the credit: the server never sends more than it was given (PROTOCOL §3), and a
    server that does is dropped (the connection is lost, the consumer reconnects)."""

    __slots__ = ("bound", "items", "waiters")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.items: deque[Message] = deque()
        self.waiters: list[asyncio.Future[None]] = []

    def put(self, messages: list[Message]) -> None:
        if len(self.items) + len(messages) > self.bound:
            raise ConnectionError("the server sent more records than the credit given")
        self.items.extend(messages)
        self.wake_all()  # each re-checks: one takes what is there, the others wait again

    async def wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                self.waiters.remove(waiter)

    def wake_all(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _raise_if_terminal(closed: websockets.ConnectionClosed) -> None:
    received = closed.rcvd
    if received is not None and received.code in TERMINAL:
        raise ConsumerClosedError(received.code, received.reason) from closed


def as_client_error(exc: Exception, url: str) -> Exception:
    """The SDK's own error for what ended a connection (HeraldClientError as it is)."""
    if isinstance(exc, HeraldClientError):
        return exc
    error: HeraldClientError
    if isinstance(exc, websockets.InvalidStatus):
        response = exc.response
        error = HeraldClientError.from_answer(
            response.status_code, bytes(response.body or b""), response.headers.get("retry-after")
        )
    elif isinstance(exc, OSError | websockets.WebSocketException | TimeoutError | ValueError):
        error = HeraldConnectionError(url, _describe(exc))
    else:
        return exc
    error.__cause__ = exc
    return error


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


COORDINATOR_MOVING = CloseCode.SERVICE_RESTART  # the subscription's coordinator moves
COORDINATOR_MOVING_RETRY_S = (0.05, 0.2)  # jittered; no backoff growth


def _closed_with(exc: BaseException, code: int) -> bool:
    return isinstance(exc, websockets.ConnectionClosed) and (
        exc.rcvd is not None and exc.rcvd.code == code
    )


def _asked_to_come_back(exc: BaseException) -> bool:
    if not isinstance(exc, websockets.ConnectionClosed):
        return False
    received = exc.rcvd
    return received is not None and received.code in COME_BACK


def _worth_reconnecting(exc: BaseException) -> bool:
    if isinstance(exc, ConsumerClosedError):
        return False
    if isinstance(exc, websockets.InvalidStatus):
        return exc.response.status_code >= 500
    return isinstance(exc, OSError | websockets.WebSocketException | TimeoutError | ValueError)
