"""`herald serve` as a process: startup output, config from flags and env, SIGTERM, SIGKILL."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.helpers import wait_until
from tests.server import assert_problem


def test_serve_prints_the_console_and_api_urls(herald_server: HeraldProcess) -> None:
    log = herald_server.log()
    assert f"http://127.0.0.1:{herald_server.port}/console" in log
    assert f"http://127.0.0.1:{herald_server.port}/v1" in log


def test_env_vars_configure_the_server_and_flags_win(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    server = herald_factory(env={"HERALD_MAX_MESSAGE_BYTES": "10", "HERALD_AUTO_CREATE": "false"})
    with httpx.Client(base_url=server.url) as http:
        topic = unique("env")
        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": 1}]}),
            404,
            "topic_not_found",
        )
        http.put(f"/v1/topics/{topic}")
        assert_problem(
            http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"value": "x" * 20}]}),
            413,
            "message_too_large",
        )
    flagged = herald_factory("--max-message-bytes", "100", env={"HERALD_MAX_MESSAGE_BYTES": "10"})
    with httpx.Client(base_url=flagged.url) as http:
        assert (
            http.post(
                f"/v1/topics/{unique('f')}/messages", json={"messages": [{"value": "x" * 20}]}
            ).status_code
            == 200
        )


def test_json_log_format_writes_one_object_per_line(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    server = herald_factory("--log-format", "json", "--access-log")
    httpx.get(f"{server.url}/healthz", headers={"x-request-id": "trace-me"})
    assert server.terminate() == 0
    entries = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert entries, server.log()
    assert all({"ts", "level", "logger", "msg"} <= entry.keys() for entry in entries)
    assert any(entry.get("request_id") == "trace-me" for entry in entries)


def test_bad_flag_values_fail_fast(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--log-format",
            "xml",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2


def test_sigterm_shuts_down_gracefully_and_keeps_everything(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic, sub = unique("term"), unique("s")
    with httpx.Client(base_url=herald_server.url) as http:
        http.put(f"/v1/topics/{topic}", json={"partitions": 2})
        http.put(f"/v1/subscriptions/{sub}", json={"topic": topic, "ack_deadline_ms": 1234})
        for acks in ("0", "1", "all"):
            http.post(
                f"/v1/topics/{topic}/messages?acks={acks}",
                json={"messages": [{"value": acks, "partition": 1}]},
            )
    started = time.monotonic()
    assert herald_server.terminate() == 0
    assert time.monotonic() - started < 15
    assert "SIGTERM received: shutting down" in herald_server.log()
    herald_server.restart()
    with httpx.Client(base_url=herald_server.url) as http:
        assert http.get(f"/v1/subscriptions/{sub}").json()["config"]["ack_deadline_ms"] == 1234
        messages = http.get(f"/v1/topics/{topic}/partitions/1/messages").json()["messages"]
        # The acks=0 append finished too; it is answered before it is appended, so its
        # place beside the next publish's is not promised (PROTOCOL §2).
        assert sorted(m["value"] for m in messages) == ["0", "1", "all"]


def test_sigterm_wakes_long_polls(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    topic = unique("poll")
    httpx.put(f"{herald_server.url}/v1/topics/{topic}")

    async def poll_then_terminate() -> httpx.Response:
        async with httpx.AsyncClient(base_url=herald_server.url, timeout=60) as client:
            poll = asyncio.create_task(
                client.get(f"/v1/topics/{topic}/partitions/0/messages?wait_ms=30000")
            )
            # Time for the poll to reach the server on a loaded host (nothing shows it
            # from outside); a SIGTERM before that would find no poll to wake.
            await asyncio.sleep(2.0)
            assert not poll.done()
            started = time.monotonic()
            await asyncio.to_thread(herald_server.terminate)
            assert time.monotonic() - started < 10
            return await poll

    response = asyncio.run(poll_then_terminate())
    assert response.status_code == 200
    assert response.json()["messages"] == []


async def _publish_until_stopped(
    url: str, topic: str, worker: int, acked: list[dict[str, Any]], stop: asyncio.Event
) -> None:
    """Publishes acks=all batches with producer ids; records every 200-answered record."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        seq = 0
        while not stop.is_set():
            batch = [
                {
                    "value": {"w": worker, "n": seq + i},
                    "id": f"w{worker}-{seq + i}",
                    "key": f"k{(seq + i) % 7}",
                }
                for i in range(20)
            ]
            try:
                response = await client.post(
                    f"/v1/topics/{topic}/messages?acks=all", json={"messages": batch}
                )
            except httpx.TransportError:
                return  # the server is gone: what it answered before is what counts
            if response.status_code == 200:
                for message, result in zip(batch, response.json()["results"], strict=True):
                    acked.append({**message, **result})
            seq += len(batch)


def _verify_after_crash(url: str, topic: str, acked: list[dict[str, Any]], partitions: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        stored: dict[tuple[int, int], dict[str, Any]] = {}
        for partition in range(partitions):
            offset = 0
            expected_offset = 0
            while True:
                body = http.get(
                    f"/v1/topics/{topic}/partitions/{partition}/messages",
                    params={"offset": offset, "limit": 10000},
                ).json()
                for record in body["messages"]:
                    assert record["offset"] == expected_offset  # contiguous, no holes
                    expected_offset += 1
                    stored[(partition, record["offset"])] = record
                if not body["messages"]:
                    break
                offset = body["next_offset"]
    values = [(r["value"]["w"], r["value"]["n"]) for r in stored.values()]
    assert len(values) == len(set(values)), "a producer id was appended twice"
    for message in acked:
        record = stored.get((message["partition"], message["offset"]))
        assert record is not None, f"acknowledged record {message['id']} lost"
        assert record["value"] == message["value"]


@pytest.mark.parametrize("seconds", [1.5])
def test_sigkill_during_concurrent_acks_all_publishing_loses_nothing_acknowledged(
    herald_server: HeraldProcess, unique: Callable[[str], str], seconds: float
) -> None:
    _crash_and_verify(herald_server, unique("crash"), seconds, rounds=1)


@pytest.mark.slow
def test_repeated_sigkill_soak(herald_server: HeraldProcess, unique: Callable[[str], str]) -> None:
    _crash_and_verify(herald_server, unique("soak"), seconds=5, rounds=5)


def _crash_and_verify(server: HeraldProcess, topic: str, seconds: float, rounds: int) -> None:
    partitions = 3
    httpx.put(f"{server.url}/v1/topics/{topic}", json={"partitions": partitions})
    acked: list[dict[str, Any]] = []
    for round_ in range(rounds):

        async def run(round_: int = round_) -> None:
            stop = asyncio.Event()
            workers = [
                asyncio.create_task(
                    _publish_until_stopped(server.url, topic, round_ * 100 + w, acked, stop)
                )
                for w in range(6)
            ]
            # Publishing under way first (a loaded host may take seconds to answer the
            # first one), then `seconds` more of it before the kill.
            answered_before = len(acked)
            await wait_until(
                lambda: len(acked) > answered_before, within=120, what="a publish answered"
            )
            await asyncio.sleep(seconds)
            await asyncio.to_thread(server.kill)  # mid-flight: some requests never get answers
            stop.set()
            await asyncio.gather(*workers)

        asyncio.run(run())
        assert acked, "nothing was published before the kill"
        server.restart()
        _verify_after_crash(server.url, topic, acked, partitions)
    # Retrying the acknowledged ids after the crash appends nothing new (dedup survives restart).
    retry = [{"value": m["value"], "id": m["id"], "key": m["key"]} for m in acked[-50:]]
    results = httpx.post(
        f"{server.url}/v1/topics/{topic}/messages", json={"messages": retry}, timeout=30
    ).json()
    assert all(r["duplicate"] for r in results["results"])


async def test_sigterm_closes_consumers_with_1001_and_persists_their_acks(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    import websockets

    topic, sub = unique("ws"), unique("s")
    ws_url = herald_server.url.replace("http", "ws", 1)
    async with httpx.AsyncClient(base_url=herald_server.url) as http:
        await http.put(f"/v1/subscriptions/{sub}", json={"topic": topic, "start": "earliest"})
        await http.post(
            f"/v1/topics/{topic}/messages", json={"messages": [{"value": i} for i in range(4)]}
        )
    async with websockets.connect(f"{ws_url}/v1/subscriptions/{sub}/ws?credit=2") as ws:
        assert json.loads(await ws.recv())["type"] == "ready"
        delivered: list[str] = []
        while len(delivered) < 2:
            frame = json.loads(await ws.recv())
            delivered += [m["id"] for m in frame["messages"]]
        await ws.send(json.dumps({"type": "ack", "ids": delivered, "req": 1}))
        assert json.loads(await ws.recv())["ok"] == delivered
        assert await asyncio.to_thread(herald_server.terminate) == 0
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    herald_server.restart()
    async with httpx.AsyncClient(base_url=herald_server.url) as http:
        stats = (await http.get(f"/v1/subscriptions/{sub}")).json()["stats"]
    assert stats["partitions"] == [{"partition": 0, "ack_floor": 2}]
    assert stats["backlog"] == 2
