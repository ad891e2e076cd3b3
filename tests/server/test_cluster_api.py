"""`GET /v1/cluster` on a single node (PROTOCOL §7): a cluster of one, with no name."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import PROJECT_ROOT, HeraldProcess, free_port


def test_a_single_node_is_a_nameless_cluster_of_one_that_leads_every_partition(
    herald_server: HeraldProcess,
) -> None:
    with httpx.Client(base_url=herald_server.url, timeout=10) as http:
        assert http.put("/v1/topics/a", json={"partitions": 3}).status_code == 201
        assert http.put("/v1/topics/b").status_code == 201
        answer = http.get("/v1/cluster")
    assert answer.status_code == 200
    assert answer.json() == {
        "name": None,
        "node": "local",
        "nodes": [{"id": "local", "url": herald_server.url, "live": True, "leads": 4}],
    }


def test_node_id_names_the_node(herald_factory: Callable[..., HeraldProcess]) -> None:
    server = herald_factory("--node-id", "eu-1")
    body = httpx.get(f"{server.url}/v1/cluster", timeout=10).json()
    assert body["node"] == "eu-1"
    assert [n["id"] for n in body["nodes"]] == ["eu-1"]


def test_a_bad_node_id_is_refused_at_start(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "server.cli", "serve", "--port", str(free_port()),
        "--data-dir", str(tmp_path / "data"), "--node-id", "no spaces",
    ]  # fmt: skip
    refused = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "node_id must match" in refused.stderr
