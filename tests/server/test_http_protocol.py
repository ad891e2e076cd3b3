"""server/http_protocol.py's protocol, served by a real uvicorn (the server's HTTP and
WebSocket protocol classes) on a loopback port, to real WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator

import uvicorn
import websockets
from starlette.types import Receive, Scope, Send

from server.http_protocol import HeaderDeadlineProtocol, guarded_protocol
from server.websocket_protocol import LeanWebSocketProtocol

SOCKETS = 20


async def echo_once(scope: Scope, receive: Receive, send: Send) -> None:
    """Accepts a WebSocket, sends "ready", then waits for its end."""
    assert scope["type"] == "websocket"
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": "ready"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # clients wait in its backlog until uvicorn serves it
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        echo_once,
        interface="asgi3",
        lifespan="off",
        http=guarded_protocol(10.0),
        ws=LeanWebSocketProtocol,
        log_config=None,
        ws_ping_interval=20.0,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        yield f"ws://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task
        listener.close()


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
