"""`herald serve` and its data directory, with real processes: one server per directory,
and a start that cannot serve (directory in use, port taken) touches no data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import PROJECT_ROOT, HeraldProcess, free_port


def serve_once(data_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    """A second `herald serve` that is expected to exit by itself."""
    command = [
        sys.executable, "-m", "server.cli", "serve",
        "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def publish(server: HeraldProcess, values: list[int]) -> list[int]:
    answer = httpx.post(
        f"{server.url}/v1/topics/orders/messages?acks=all",
        json={"messages": [{"value": v} for v in values]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return [r["offset"] for r in answer.json()["results"]]


def read_all(server: HeraldProcess) -> list[tuple[int, int]]:
    answer = httpx.get(
        f"{server.url}/v1/topics/orders/partitions/0/messages?offset=0&limit=100", timeout=30
    )
    assert answer.status_code == 200, answer.text
    return [(m["offset"], m["value"]) for m in answer.json()["messages"]]


def test_a_second_server_on_the_same_data_dir_is_refused_and_nothing_is_lost(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "shared"
    first = herald_factory(data_dir=data_dir)
    assert publish(first, [1, 2, 3]) == [0, 1, 2]

    second = serve_once(data_dir, free_port())

    assert second.returncode != 0
    assert str(data_dir.resolve()) in second.stderr
    assert "in use by another Herald process" in second.stderr
    assert f"pid {first.pid}" in second.stderr
    assert "recovered" not in second.stdout + second.stderr
    assert publish(first, [4, 5, 6]) == [3, 4, 5]
    first.restart()
    assert read_all(first) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]


def test_kill_9_of_the_holder_never_blocks_a_restart(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    server = herald_factory(data_dir=tmp_path / "data")
    publish(server, [1, 2])
    server.kill()
    assert (tmp_path / "data" / ".lock").exists()  # left behind, and harmless
    server.restart()
    assert read_all(server) == [(0, 1), (1, 2)]


def test_a_busy_port_exits_before_touching_the_data_dir(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = serve_once(tmp_path / "data", port)
    assert refused.returncode != 0
    assert f"127.0.0.1:{port}" in refused.stderr
    assert "already in use" in refused.stderr
    assert "--port" in refused.stderr and "HERALD_PORT" in refused.stderr
    assert not (tmp_path / "data").exists()


def test_a_start_on_a_live_servers_port_and_dir_leaves_it_serving(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    server = herald_factory(data_dir=tmp_path / "data")
    publish(server, [7])
    refused = serve_once(tmp_path / "data", server.port)
    assert refused.returncode != 0
    assert "already in use" in refused.stderr
    assert publish(server, [8]) == [1]
    assert read_all(server) == [(0, 7), (1, 8)]
