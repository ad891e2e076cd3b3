"""A configured encryption key set that lacks a key the log needs: the server refuses to
start, in one line naming the key id (storage/key_check.py), instead of answering 503
once a read reaches those batches. Nothing of the log is touched: with the key back,
every record reads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from storage import encryption
from storage.key_check import key_ids_needed
from tests.conftest import PROJECT_ROOT, HeraldProcess

REFUSED = 2


def serve(data_dir: Path, keys: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != encryption.ENV_VAR}
    if keys is not None:
        env[encryption.ENV_VAR] = keys
    return subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "0", "--data-dir", str(data_dir)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def written_with(herald_factory: Callable[..., HeraldProcess], keys: str) -> HeraldProcess:
    server = herald_factory(env={encryption.ENV_VAR: keys})
    answer = httpx.post(
        f"{server.url}/v1/topics/sealed/messages", json={"messages": [{"value": "kept"}]}
    )
    assert answer.status_code == 200, answer.text
    assert server.terminate() == 0
    return server


def test_a_key_set_without_a_key_the_log_needs_refuses_to_start(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    one, two = encryption.new_key_line(1), encryption.new_key_line(2)
    server = written_with(herald_factory, one)
    assert set(key_ids_needed(server.data_dir)) == {1}

    refused = serve(server.data_dir, two)  # key 1 rotated out too early
    assert refused.returncode == REFUSED
    assert "Traceback" not in refused.stderr + refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert "key id 1" in line and "(2)" in line and "--encryption-key-file" in line

    without = serve(server.data_dir, None)  # encryption left off
    assert without.returncode == REFUSED
    assert "key id 1" in without.stderr and "no encryption key is configured" in without.stderr

    server.env = {encryption.ENV_VAR: f"{one}\n{two}"}
    server.restart()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        read = http.get("/v1/topics/sealed/partitions/0/messages", params={"offset": 0})
    assert [m["value"] for m in read.json()["messages"]] == ["kept"]


def test_a_plain_log_needs_no_key(herald_factory: Callable[..., HeraldProcess]) -> None:
    server = herald_factory()
    answer = httpx.post(f"{server.url}/v1/topics/plain/messages", json={"messages": [{"value": 1}]})
    assert answer.status_code == 200
    assert server.terminate() == 0
    assert key_ids_needed(server.data_dir) == {}
