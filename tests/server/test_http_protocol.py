"""server/http_protocol.py's and server/websocket_protocol.py's protocols, served by a
real uvicorn (the server's HTTP and WebSocket protocol classes) on a loopback port, to
real HTTP and WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import uvicorn
import websockets
from starlette.types import Receive, Scope, Send

from server.http_protocol import (
    DirectHandler,
    DirectRequest,
    HeaderDeadlineProtocol,
    guarded_protocol,
)
from server.websocket_protocol import LeanWebSocketProtocol
from subscribers.connection import SEND_NOWAIT

SOCKETS = 20


async def echo_once(scope: Scope, receive: Receive, send: Send) -> None:
    """Accepts a WebSocket, sends "ready", then waits for its end."""
    assert scope["type"] == "websocket"
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": "ready"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


class DirectApp:
    """An app that serves ``POST /direct`` below ASGI (its ``direct_route``, as
    server/direct_publish.py is Herald's) and answers everything else through ASGI at
    once, without reading a body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        headers = [(b"content-length", b"4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"asgi"})

    def direct_route(self, scope: dict[str, Any]) -> DirectHandler | None:
        return self.answer if scope["path"] == "/direct" else None

    async def answer(self, request: DirectRequest) -> None:
        await request.respond(200, [(b"content-length", b"%d" % len(request.body))], request.body)


@contextlib.asynccontextmanager
async def served(app: Any = echo_once, scheme: str = "ws") -> AsyncIterator[str]:
    """``app`` served as `herald serve` serves (no trusted proxy: the app unwrapped, so
    that the protocol finds its ``direct_route``)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # clients wait in its backlog until uvicorn serves it
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app,
        interface="asgi3",
        lifespan="off",
        http=guarded_protocol(10.0),
        ws=LeanWebSocketProtocol,
        log_config=None,
        ws_ping_interval=20.0,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        yield f"{scheme}://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task
        listener.close()


def post(path: str, body: bytes) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        % (
            path.encode(),
            len(body),
        )
        + body
    )


async def answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


def live_http_protocols() -> int:
    return sum(isinstance(o, HeaderDeadlineProtocol) for o in gc.get_objects())


async def test_a_websocket_upgrade_leaves_no_http_protocol_behind() -> None:
    """Once a connection is upgraded it is the WebSocket protocol's, and the HTTP
    protocol that read its handshake is freed at once: left as a reference cycle (its
    parser calls its bound methods) it lived on until a full collection, which a server
    holding many long-lived connections seldom runs (about 5 KiB per WebSocket, issue
    27 §3). The collector is off meanwhile: only what is really let go is gone."""
    gc.collect()
    gc.disable()
    try:
        async with served() as url, contextlib.AsyncExitStack() as sockets:
            for _ in range(SOCKETS):
                ws = await sockets.enter_async_context(websockets.connect(url))
                assert await ws.recv() == "ready"
            assert live_http_protocols() == 0
    finally:
        gc.enable()


def live_direct_requests() -> int:
    return sum(isinstance(o, DirectRequest) for o in gc.get_objects())


async def test_requests_served_below_asgi_are_let_go() -> None:
    """A keep-alive connection holds its last request at most: each request once kept
    the one before it (to go the ASGI way with), so a connection held every request it
    had served, and a long-lived producer's connection grew without end. The collector
    is off meanwhile: only what is really let go is gone."""
    gc.collect()
    gc.disable()
    try:
        async with served(DirectApp(), "http") as url:
            reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
            try:
                for n in range(50):
                    writer.write(post("/direct", b"%d" % n))
                    assert await asyncio.wait_for(answer(reader), 30) == b"%d" % n
                assert live_direct_requests() <= 1
            finally:
                writer.close()
    finally:
        gc.enable()


async def test_a_body_not_all_there_with_its_headers_goes_the_asgi_way() -> None:
    """The app's ASGI side answers without reading the body; served below ASGI the
    request would wait for the rest of its body, which is not sent before the answer."""
    async with served(DirectApp(), "http") as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
        try:
            whole = post("/direct", b"0123456789")
            writer.write(whole[:-5])
            assert await asyncio.wait_for(answer(reader), 30) == b"asgi"
            writer.write(whole[-5:] + whole)  # the rest of that body, then the request whole
            assert await asyncio.wait_for(answer(reader), 30) == b"0123456789"
        finally:
            writer.close()


class SendNowaitApp:
    """Accepts a WebSocket and sends through the scope's SEND_NOWAIT what the test asks
    for; ``said`` has what each call answered."""

    def __init__(self, before_accept: bool = False) -> None:
        self.before_accept = before_accept
        self.said: list[bool] = []
        self.messages: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self.gone = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send_nowait = scope["extensions"][SEND_NOWAIT]
        await receive()  # websocket.connect
        if self.before_accept:
            self.said.append(send_nowait(b"early", False))
        await send({"type": "websocket.accept"})
        reading = asyncio.ensure_future(receive())
        while True:
            taking = asyncio.ensure_future(self.messages.get())
            await asyncio.wait([taking, reading], return_when=asyncio.FIRST_COMPLETED)
            if reading.done():  # the client went away (it sends nothing else)
                taking.cancel()
                self.said.append(send_nowait(b"late", False))
                self.gone.set()
                return
            self.said.append(send_nowait(*taking.result()))


async def test_send_nowait_writes_each_message_at_once_once_accepted() -> None:
    """Text and binary, in the order sent; before the accept it declines and writes
    nothing (the handshake's answer must come first)."""
    app = SendNowaitApp(before_accept=True)
    async with served(app) as url, websockets.connect(url) as ws:
        for message in [(b"one", False), (b"\x00\x01two", True), ("\u00e9".encode(), False)]:
            app.messages.put_nowait(message)
        got = [await asyncio.wait_for(ws.recv(), 30) for _ in range(3)]
        assert got == ["one", b"\x00\x01two", "\u00e9"]
        assert app.said == [False, True, True, True]


async def test_send_nowait_declines_once_the_client_is_gone() -> None:
    app = SendNowaitApp()
    async with served(app) as url:
        async with websockets.connect(url) as ws:
            app.messages.put_nowait((b"one", False))
            assert await asyncio.wait_for(ws.recv(), 30) == "one"
        await asyncio.wait_for(app.gone.wait(), 30)
        assert app.said == [True, False]


async def test_send_nowait_declines_while_the_transport_is_paused() -> None:
    """A client that reads nothing past the handshake fills the socket's buffers; the
    server's transport pauses, and from then on SEND_NOWAIT says False instead of
    buffering without bound. Every message it said True to arrives whole."""
    chunk = b"x" * (256 * 1024)
    said: list[bool] = []

    async def fill(scope: Scope, receive: Receive, send: Send) -> None:
        send_nowait = scope["extensions"][SEND_NOWAIT]
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        for _ in range(400):  # 100 MiB at most: loopback's buffers take a few MiB
            said.append(send_nowait(chunk, True))
            if not said[-1]:
                break
            await asyncio.sleep(0)  # the loop runs: the transport can pause
        while (await receive())["type"] != "websocket.disconnect":
            pass

    async with served(fill) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
        try:
            writer.write(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            assert b" 101 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            for _ in range(3000):  # 60 s; the stream reader stops reading at 64 KiB
                if said and (not said[-1] or len(said) == 400):
                    break
                await asyncio.sleep(0.02)
            assert said[-1] is False, "the transport never paused"
            accepted = said.count(True)
            assert said == [True] * accepted + [False]
            for _ in range(accepted):  # binary, 256 KiB: opcode, 127, 8 bytes of length
                head = await asyncio.wait_for(reader.readexactly(10), 30)
                assert head == b"\x82\x7f" + len(chunk).to_bytes(8, "big")
                assert await asyncio.wait_for(reader.readexactly(len(chunk)), 30) == chunk
        finally:
            writer.close()
