"""The server in this process (uvicorn on a free loopback port, as `herald serve` runs
it), for tests that look at the server's own objects while real clients use it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from server.app import create_app
from server.config import ServerConfig
from server.websocket_protocol import LeanWebSocketProtocol


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """(the app, its base URL), served by uvicorn in this process."""
    app = create_app(ServerConfig(data_dir=tmp_path / "data"))
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        loop="none",  # this test's loop
        interface="asgi3",
        ws=LeanWebSocketProtocol,
        lifespan="on",
        log_config=None,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            assert not serving.done(), "the server did not start"
            await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield app, f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving
