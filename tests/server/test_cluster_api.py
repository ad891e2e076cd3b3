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
        http.post("/v1/topics/b/messages", json={"messages": [{"value": 1}, {"value": 2}]})
        answer = http.get("/v1/cluster")
        topic = http.get("/v1/topics/a").json()
    assert answer.status_code == 200
    body = answer.json()
    assert body.pop("partitions") == [
        {
            "topic": name,
            "partition": n,
            "leader": "local",
            "epoch": 0,
            "replicas": ["local"],
            "isr": ["local"],
            "high_watermark": end,
            "log_end": end,
            "lag": {},
        }
        for name, n, end in [("a", 0, 0), ("a", 1, 0), ("a", 2, 0), ("b", 0, 2)]
    ]
    assert body.pop("subscriptions") == []  # none yet; each would name "local"
    assert body == {
        "name": None,
        "node": "local",
        "nodes": [
            # credentials: the digest of the node's credentials file (none here: null)
            {"id": "local", "url": herald_server.url, "live": True, "leads": 4, "credentials": None}
        ],
    }
    # PROTOCOL §7: replication settings shown as 1, each partition led by the node.
    assert topic["config"]["replication_factor"] == topic["config"]["min_insync_replicas"] == 1
    assert [(p["leader"], p["epoch"], p["replicas"], p["isr"]) for p in topic["partitions"]] == [
        ("local", 0, ["local"], ["local"])
    ] * 3


def test_a_single_node_accepts_only_one_replica(herald_server: HeraldProcess) -> None:
    with httpx.Client(base_url=herald_server.url, timeout=10) as http:
        for field in ("replication_factor", "min_insync_replicas"):
            refused = http.put("/v1/topics/r", json={field: 2})
            assert refused.status_code == 400
            assert refused.json()["code"] == "validation_error"
            assert field in refused.json()["detail"]
        assert http.get("/v1/topics/r").status_code == 404
        assert http.put("/v1/topics/r", json={"replication_factor": 1}).status_code == 201


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
