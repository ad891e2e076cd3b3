"""A member whose answers are not Herald's (another program on its port, a proxy's page)
never turns a gathered answer into a 500 (issue 26, item 9): GET /v1/stats and
GET /v1/cluster, which ask every live node, leave out what is not a report.

The "node" is a listener of the test's, registered in etcd as a member of the cluster the
way a node registers itself (its id and URL under a lease).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest

from cluster.etcd import EtcdClient
from cluster.membership import node_key
from tests.cluster.nodes import HeraldCluster

# 200 answers of every wrong shape: GET /v1/cluster/replication and GET /v1/stats of a node.
NOT_REPORTS: list[object] = [
    [1, 2],
    "text",
    None,
    {"partitions": [1, {"topic": "t"}], "subscriptions": [1, {"name": 5}]},
    {"partitions": "x", "subscriptions": "x"},
    {"subscriptions": [{"name": "s", "stats": {"backlog": "many"}}]},
    {"subscriptions": [{"name": "s", "stats": None}]},
]


class _Impostor(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[tuple[str, type[_Impostor]]]:
    handler = type("Impostor", (_Impostor,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def _register(etcd_urls: list[str], cluster: str, node_id: str, url: str) -> None:
    async with EtcdClient(etcd_urls, timeout=10, attempt_timeout=5) as etcd:
        lease = await etcd.lease_grant(300)  # outlives the test: the cluster stops first
        value = orjson.dumps({"id": node_id, "url": url})
        await etcd.put(node_key(cluster, node_id), value, lease=lease.id)


def test_answers_of_a_member_that_are_not_reports_are_left_out(
    tmp_path: Path, impostor: tuple[str, type[_Impostor]]
) -> None:
    url, handler = impostor
    with HeraldCluster(tmp_path / "cluster", 2) as cluster:
        assert cluster.etcd is not None
        asyncio.run(_register(cluster.etcd.urls, cluster.cluster_name, "n9", url))
        cluster.wait_for(lambda: "n9" in cluster.live_ids("n1"), 30.0, "n9 listed as live")
        for body in NOT_REPORTS:
            handler.body = orjson.dumps(body)
            for path in ("/v1/stats", "/v1/cluster"):
                answer = cluster.get("n1", path)
                assert answer.status_code == 200, (body, path, answer.text)
            nodes = {n["id"]: n for n in cluster.cluster_view("n1")["nodes"]}
            assert nodes["n9"]["live"] is True
