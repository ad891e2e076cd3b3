"""A deliver frame leaves in the delivery step that made it, not from a writer task of
its own, when nothing else waits to be written (issue 27 §2: a task and a loop pass
less per record). The server runs in this process (conftest's `served`), so the test
can count the connection's writer task's runs; it counts the `acked` reply's too, so
the count is seen to work."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
import websockets

from subscribers.connection import ConsumerConnection

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def writer_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per run of a connection's writer task."""
    runs: list[int] = []
    original = ConsumerConnection._write_loop

    async def counted(self: ConsumerConnection) -> None:
        runs.append(1)
        await original(self)

    monkeypatch.setattr(ConsumerConnection, "_write_loop", counted)
    return runs


async def frame(ws: Any) -> dict[str, Any]:
    got: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(decode=False), 30))
    return got


@pytest.mark.parametrize("socket", ["subscription", "tail"])
async def test_each_deliver_frame_leaves_without_the_writer_task(
    served: tuple[Any, str], writer_runs: list[int], socket: str
) -> None:
    _, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        made = await http.put("/v1/subscriptions/now", json={"topic": "now"})
        assert made.status_code == 201, made.text
        path = (
            "/v1/subscriptions/now/ws?credit=10"
            if socket == "subscription"
            else "/v1/topics/now/ws?from=latest&credit=10"
        )
        async with websockets.connect(f"ws://{address}{path}") as ws:
            assert (await frame(ws))["type"] == "ready"
            ids = []
            for n in range(5):  # one at a time: each record its own deliver frame
                published = await http.post(
                    "/v1/topics/now/messages", json={"messages": [{"value": n}]}
                )
                assert published.status_code == 200, published.text
                deliver = await frame(ws)
                assert deliver["type"] == "deliver"
                assert [m["value"] for m in deliver["messages"]] == [n]
                ids.append(deliver["messages"][0].get("id"))
            assert writer_runs == []
            if socket == "subscription":
                await ws.send(orjson.dumps({"type": "ack", "ids": ids, "req": 1}).decode())
                acked = await frame(ws)
                assert acked == {"type": "acked", "req": 1, "ok": ids, "unknown": []}
                assert writer_runs == [1]
