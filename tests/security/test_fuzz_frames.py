"""Hypothesis fuzz of consumer WebSocket frames: no internal error (1011), the server lives,
and an acknowledged record is still delivered afterwards (bounded examples)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import HeraldProcess

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
_frame_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["credit", "ack", "nack", "extend", "bogus"])},
    optional={"n": _json, "ids": _json, "delay_ms": _json, "ms": _json},
)
frames = st.lists(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        _json.map(json.dumps),
        _frame_like.map(json.dumps),
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HeraldProcess, str]]:
    server = HeraldProcess(tmp_path_factory.mktemp("frames") / "data").start()
    httpx.put(
        f"{server.url}/v1/subscriptions/fz",
        json={
            "topic": "fz",
            "start": "earliest",
            # Fuzzed credit frames take the record; it must come back soon and never
            # be dead-lettered for it.
            "ack_deadline_ms": 500,
            "max_deliveries": 0,
            "retry_backoff": {"min_ms": 1, "max_ms": 10},
        },
    ).raise_for_status()
    httpx.post(
        f"{server.url}/v1/topics/fz/messages", json={"messages": [{"value": "kept"}]}
    ).raise_for_status()
    try:
        yield server, server.url.replace("http://", "ws://") + "/v1/subscriptions/fz/ws"
    finally:
        server.terminate()


async def _send_all(url: str, sent: list[str | bytes]) -> int | None:
    """The close code if the server closed the socket, else None."""
    async with websockets.connect(url + "?credit=0") as ws:
        try:
            for frame in sent:
                await ws.send(frame)
            async with asyncio.timeout(0.3):
                while True:
                    await ws.recv()
        except TimeoutError:
            return None
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    return None


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(sent=frames)
def test_arbitrary_frames_never_cause_an_internal_error(
    consumer: tuple[HeraldProcess, str], sent: list[str | bytes]
) -> None:
    server, url = consumer
    code = asyncio.run(_send_all(url, sent))
    assert code != 1011
    assert server.is_running()


def test_the_acknowledged_record_survives_the_fuzzing(
    consumer: tuple[HeraldProcess, str],
) -> None:
    # Fuzzed frames may legitimately hold the record (a nack with a long delay_ms), so a
    # fresh subscription proves it is still in the log and still delivered.
    server, url = consumer
    read = httpx.get(f"{server.url}/v1/topics/fz/partitions/0/messages?offset=0").json()
    assert [m["value"] for m in read["messages"]] == ["kept"]
    httpx.put(
        f"{server.url}/v1/subscriptions/fz-after", json={"topic": "fz", "start": "earliest"}
    ).raise_for_status()

    async def receive_one() -> str:
        after = url.replace("/fz/ws", "/fz-after/ws")
        async with websockets.connect(after + "?credit=1") as ws, asyncio.timeout(20):
            while True:
                frame = await ws.recv()
                if "kept" in str(frame):
                    return str(frame)

    assert "kept" in asyncio.run(receive_one())
    assert httpx.get(f"{server.url}/healthz").status_code == 200
