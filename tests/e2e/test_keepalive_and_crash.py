"""Pings drop silent consumers; a SIGKILL during consumption keeps every ack older than 1 s
and loses no unacked record (PROTOCOL §3)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import PROJECT_ROOT, HeraldProcess
from tests.e2e import ack
from tests.subscribers import make_subscription, publish, receive_records, recv_json, ws_url


def consumer_url(server: HeraldProcess, name: str, credit: int) -> str:
    return ws_url(server.url, f"/v1/subscriptions/{name}/ws?credit={credit}")


async def test_consumer_that_stops_answering_pings_is_dropped_and_its_records_go_elsewhere(
    herald_factory: Callable[..., HeraldProcess], unique: Callable[[str], str]
) -> None:
    # The interval as a flag, the timeout from the environment: both ways configure it.
    # A timeout a stall of the loaded host stays within, so that only the silent one goes.
    server = herald_factory("--ws-ping-interval", "0.2", env={"HERALD_WS_PING_TIMEOUT": "3"})
    topic, name = unique("pg"), unique("pgs")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await make_subscription(http, name, topic, ack_deadline_ms=600_000)
        await publish(http, topic, ["held"])
    # Client pings off: only the server's pings keep these connections alive.
    silent = await websockets.connect(consumer_url(server, name, 1), ping_interval=None)
    try:
        await recv_json(silent)
        [held] = await receive_records(silent, 1)
        async with websockets.connect(consumer_url(server, name, 1), ping_interval=None) as other:
            await recv_json(other)
            # The silent one stops reading: the server's pings go unanswered.
            silent.transport.pause_reading()
            # Long before the 600 s ack deadline, with the next attempt.
            [again] = await receive_records(other, 1, within=30)
            assert (again["id"], again["attempt"]) == (held["id"], 2)
            # The one that answers pings is kept through many ping rounds.
            await asyncio.sleep(1.0)
            answer = await ack(other, [again["id"]])
            assert answer["ok"] == [again["id"]]
    finally:
        silent.transport.abort()


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (["--ws-ping-interval", "0"], {}),
        (["--ws-ping-timeout", "-1"], {}),
        ([], {"HERALD_WS_PING_INTERVAL": "soon"}),
    ],
)
def test_bad_ping_settings_fail_fast(tmp_path: Path, flags: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--data-dir", str(tmp_path / "d"), *flags],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert b"ping" in result.stderr.lower()
    assert not (tmp_path / "d").exists(), "nothing is created"


async def consume_and_kill(server: HeraldProcess, name: str, count: int) -> None:
    """Ack steadily for 1.5 s, SIGKILL mid-stream, restart, then check what comes back."""
    acked_at: dict[str, float] = {}  # id -> when the server confirmed the ack
    async with websockets.connect(consumer_url(server, name, count)) as ws:
        await recv_json(ws)
        records = await receive_records(ws, count, within=30)
        all_ids = {r["id"] for r in records}
        assert len(all_ids) == count

        async def acker() -> None:
            try:
                for index, record in enumerate(records):
                    await ack(ws, [record["id"]], req=index)
                    acked_at[record["id"]] = time.monotonic()
                    await asyncio.sleep(0.005)
            except websockets.ConnectionClosed:
                return

        acking = asyncio.create_task(acker())
        # The scenario: acks older and younger than 1 s at the kill, counted from the
        # first ack confirmed (on a loaded host that can take a while).
        for _ in range(600):
            if acked_at or acking.done():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)
        killed_at = time.monotonic()
        await asyncio.to_thread(server.kill)
        await asyncio.wait_for(acking, 30)
    assert 0 < len(acked_at) < count, "the kill fell in the middle of the acks"
    old = {i for i, t in acked_at.items() if t < killed_at - 1.0}
    assert old, "some acks are more than 1 s old"

    await asyncio.to_thread(server.restart)
    must_come_back = all_ids - set(acked_at)
    back: dict[str, int] = {}
    async with websockets.connect(consumer_url(server, name, count)) as ws:
        await recv_json(ws)
        async with asyncio.timeout(30):
            while not must_come_back <= set(back):
                frame = await recv_json(ws)
                for record in frame.get("messages", []):
                    back[record["id"]] = record["attempt"]
        # Whatever else is redelivered (acks younger than 1 s may be) arrives with them.
        while True:
            try:
                frame = await recv_json(ws, 0.5)
            except TimeoutError:
                break
            for record in frame.get("messages", []):
                back[record["id"]] = record["attempt"]
    assert not old & set(back), "a record acked more than 1 s before the kill came back"
    assert must_come_back <= set(back), "every unacked record is delivered"
    assert set(back) <= all_ids


async def setup_consumption(server: HeraldProcess, unique: Callable[[str], str], count: int) -> str:
    topic, name = unique("ck"), unique("cks")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await make_subscription(http, name, topic, ack_deadline_ms=600_000)
        await publish(http, topic, list(range(count)))
    return name


async def test_sigkill_during_consumption_keeps_old_acks_and_loses_no_unacked_record(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    name = await setup_consumption(herald_server, unique, 1000)
    await consume_and_kill(herald_server, name, 1000)


@pytest.mark.slow
async def test_repeated_sigkill_during_consumption_soak(
    herald_server: HeraldProcess, unique: Callable[[str], str]
) -> None:
    for _ in range(5):
        name = await setup_consumption(herald_server, unique, 1000)
        await consume_and_kill(herald_server, name, 1000)
