"""A Herald server with an auth file of one token per role (PROTOCOL §6), and a 3-node
cluster with the same auth file (PROTOCOL §7: any node serves everything a token allows)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess

if TYPE_CHECKING:
    from tests.cluster.nodes import HeraldCluster

# name -> (roles, topic patterns)
TOKENS: dict[str, tuple[list[str], list[str]]] = {
    "admin": (["admin"], []),
    "metrics": (["metrics"], []),
    "publisher": (["publish"], ["orders.*"]),
    "subscriber": (["subscribe"], ["orders.*"]),
    "stranger": (["publish", "subscribe"], ["other.*"]),
}


@dataclass
class Secured:
    server: HeraldProcess
    auth_file: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def headers(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}


def write_auth_file(path: Path, tokens: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
    clear: dict[str, str] = {}
    lines = []
    for who, (roles, topics) in tokens.items():
        token_id, token = new_token()
        clear[who] = token
        lines.append(f"# {who}\n" + toml_entry(token_id, token, roles, topics))
    path.write_text("\n".join(lines))
    return clear


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    auth_file = base / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    server = HeraldProcess(
        base / "data",
        extra_args=["--auth-file", str(auth_file), "--audit-log", str(base / "audit.jsonl")],
    ).start()
    s = Secured(server, auth_file, tokens)
    admin = s.headers("admin")
    httpx.put(f"{s.url}/v1/topics/orders.a", json={"partitions": 1}, headers=admin)
    httpx.put(f"{s.url}/v1/subscriptions/s-orders", json={"topic": "orders.a"}, headers=admin)
    try:
        yield s
    finally:
        server.terminate()


@dataclass
class SecuredCluster:
    cluster: HeraldCluster
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.cluster.nodes.values()]

    def headers(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    """Three nodes, one auth file; topic ``orders.a`` and pull subscription ``s-orders``
    (coordinated by one node) seen by every node."""
    from tests.cluster.nodes import HeraldCluster

    base = tmp_path_factory.mktemp("secured-cluster")
    auth_file = base / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    cluster = HeraldCluster(
        base / "cluster",
        3,
        extra_args=["--auth-file", str(auth_file)],
        env={"HERALD_CLUSTER_TOKEN": tokens["admin"]},  # the nodes' token for each other
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    with cluster:
        cluster.create_topic("orders.a", partitions=1)
        made = cluster.put("n1", "/v1/subscriptions/s-orders", {"topic": "orders.a"})
        assert made.status_code == 201, made.text
        cluster.wait_known_everywhere("/v1/subscriptions/s-orders")
        yield SecuredCluster(cluster, tokens)
