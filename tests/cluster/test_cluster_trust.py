"""A cluster that does not trust etcd with more than it must (issue 26 item 3,
docs/security.md "A cluster"):

- a node's URL rewritten in etcd to a listener someone else runs receives no client
  token and no cluster token: credentials go only to a URL that proved it holds the
  cluster secret — and a listener that relays the proof challenge to the real node
  gets a proof of the real node's URL, which does not count for its own;
- push secrets are sealed before they go to etcd, and the nodes still sign with them;
- nodes serving TLS advertise https:// unasked and verify each other with
  ``--peer-ca-file`` (issue 26 item 8).

A closed etcd (TLS with client certificates, users) is test_etcd_closed.py's.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from cluster.etcd import EtcdClient
from cluster.membership import node_key
from storage.encryption import new_key_line
from tests.cluster.conftest import EtcdProcess
from tests.cluster.nodes import NODE_TTL_MS, REPLICA_LAG_MS, ClusterNode, HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated
from tests.helpers import wait_until_sync
from tests.security.conftest import write_auth_file
from tests.security.test_tls import make_ca_and_server_cert
from tests.webhooks.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"sealed-secret-in-etcd-0123456789").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"rotated-secret-in-etcd-012345678").decode()


class Listener:
    """An HTTP listener the test controls, recording every request it is sent. A proof
    challenge it relays to ``relay_to`` (the real node), answering with that node's
    proof: the best an attacker without the secret can do."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.relay_to: str | None = None
        self._lock = threading.Lock()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> bytes:
                length = int(self.headers.get("content-length", "0") or 0)
                body = self.rfile.read(length) if length else b""
                with listener._lock:
                    listener.requests.append(
                        (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                    )
                return body

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self._record()
                if self.path.startswith("/v1/cluster/proof") and listener.relay_to:
                    relayed = httpx.post(listener.relay_to + self.path, content=body, timeout=10)
                    self._send(relayed.status_code, relayed.content)
                    return
                self._send(200, b'{"results": [{"partition": 0, "offset": 0}]}')

            def do_GET(self) -> None:
                self._record()
                self._send(200, b'{"partitions": [], "subscriptions": []}')

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def seen(self) -> list[tuple[str, str, dict[str, str]]]:
        with self._lock:
            return list(self.requests)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as started:
        yield started


async def _rewrite_url(etcd_urls: list[str], cluster: str, node: str, url: str) -> None:
    """What anyone who can write etcd can do: point a node's registration elsewhere
    (under the node's own lease, so it stays live and keeps leading)."""
    async with EtcdClient(etcd_urls, timeout=20, attempt_timeout=5) as etcd:
        key = node_key(cluster, node)
        current = await etcd.get(key)
        assert current is not None
        await etcd.put(key, orjson.dumps({"id": node, "url": url}), lease=current.lease)


def test_a_node_url_rewritten_in_etcd_receives_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: Listener
) -> None:
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(
        auth_file,
        {"admin": (["admin"], []), "writer": (["publish", "subscribe"], ["trust.*"])},
    )
    monkeypatch.setenv("HERALD_CLUSTER_TOKEN", tokens["admin"])  # the nodes' own token
    cluster = HeraldCluster(tmp_path / "cluster", 2, extra_args=["--auth-file", str(auth_file)])
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    with cluster:
        cluster.create_topic("trust.t", partitions=1, replication_factor=1)
        leader = cluster.partition_state("trust.t")["leader"]
        other = next(n for n in cluster.nodes if n != leader)
        listener.relay_to = cluster.nodes[leader].url  # a borrowed proof, at best
        assert cluster.etcd is not None
        asyncio.run(_rewrite_url(cluster.etcd.urls, cluster.cluster_name, leader, listener.url))

        def rewritten() -> bool:
            nodes = cluster.cluster_view(other)["nodes"]
            return any(n["id"] == leader and n["url"] == listener.url for n in nodes)

        cluster.wait_for(rewritten, 30, f"{other} sees {leader} at the listener's URL")

        writer = {"Authorization": f"Bearer {tokens['writer']}"}
        node = cluster.nodes[other].url
        published = httpx.post(
            f"{node}/v1/topics/trust.t/messages",
            json={"messages": [{"value": 1}]},
            headers=writer,
            timeout=30,
        )
        read = httpx.get(
            f"{node}/v1/topics/trust.t/partitions/0/messages",
            params={"offset": 0},
            headers=writer,
            timeout=30,
        )
        stats = cluster.get(other, "/v1/stats")  # gathers every node's (the cluster token)
        cluster.get(other, "/v1/topics/trust.t")  # and the leaders' replication reports

        seen = listener.seen()
        assert seen, "the listener was never contacted: the attack did not take place"
        for method, path, headers in seen:
            assert "authorization" not in headers, (method, path)
            for token in tokens.values():
                assert token not in path and token not in str(headers.values()), (method, path)
        # What the other node answered instead: the leader is unreachable (never a 500).
        assert published.status_code == 503, published.text
        assert published.json()["code"] == "leader_unavailable"
        assert read.status_code == 503, read.text
        assert stats.status_code == 200, stats.text
        assert "did not prove it holds the cluster secret" in cluster.nodes[other].log()


def test_push_secrets_are_sealed_in_etcd_and_still_sign(tmp_path: Path) -> None:
    cluster = HeraldCluster(tmp_path / "cluster", 2, cluster_secret=True)
    with cluster, Receiver([SECRET, NEW_SECRET]) as receiver:
        cluster.create_topic("hooks", partitions=1, replication_factor=2)
        url = receiver.url + "?receiver-password=hunter2"  # credentials in a url, too
        created = cluster.put(
            "n1",
            "/v1/subscriptions/hooked",
            {"topic": "hooks", "start": "earliest", "push": {"url": url, "secret": SECRET}},
        )
        assert created.status_code == 201, created.text
        wait_coordinated(cluster, "hooked")
        # Every node knows it (one whose watch lags answers 404, or closes with 4404).
        cluster.wait_known_everywhere("/v1/subscriptions/hooked")
        # A rotation (from either node: forwarded to the coordinator) is stored again.
        rotated = cluster.post(
            "n2",
            "/v1/subscriptions/hooked/push/rotate-secret",
            {"secret": NEW_SECRET, "previous_ttl_ms": 3_600_000},
        )
        assert rotated.status_code == 200, rotated.text
        published = cluster.post("n2", "/v1/topics/hooks/messages", {"messages": [{"value": 42}]})
        assert published.status_code == 200, published.text
        receiver.wait_for(lambda: bool(receiver.acked_ids()), 60)
        assert all(r.verified for r in receiver.snapshot())

        assert cluster.etcd is not None
        values = asyncio.run(_every_value(cluster.etcd.urls))
        sealed = [k for k in values if "/subscriptions/" in k]
        assert sealed and all(values[k].startswith(b"herald-sealed:v1:") for k in sealed)
        for key, value in values.items():
            for secret in (SECRET, NEW_SECRET):
                assert secret.encode() not in value, key
                assert secret.removeprefix("whsec_").encode() not in value, key
            assert b"whsec_" not in value and b"hunter2" not in value, key


async def _every_value(etcd_urls: list[str]) -> dict[str, bytes]:
    """Every key Herald wrote to etcd and its raw value."""
    async with EtcdClient(etcd_urls, timeout=20, attempt_timeout=5) as etcd:
        everything = await etcd.range("/herald/", prefix=True)
        return {kv.key.decode(errors="replace"): kv.value for kv in everything.kvs}


class TlsClusterNode(ClusterNode):
    """A node serving TLS, with no --advertise-url: it advertises https:// itself."""

    def __init__(self, *args: Any, ca: ssl.SSLContext, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ca = self.verify = ca

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--advertise-url")
        return command[:at] + command[at + 2 :]


def test_nodes_serving_tls_advertise_https_and_verify_each_other(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    ca_path, cert_path, key_path = make_ca_and_server_cert(tmp_path)
    ca = ssl.create_default_context(cafile=str(ca_path))
    secret = tmp_path / "cluster.key"
    secret.write_text(new_key_line(1) + "\n")
    args = [
        "--tls-cert", str(cert_path), "--tls-key", str(key_path),
        "--peer-ca-file", str(ca_path), "--cluster-secret-file", str(secret),
    ]  # fmt: skip
    nodes = [
        TlsClusterNode(
            f"n{i}",
            tmp_path / f"n{i}",
            etcd_server.urls,
            cluster_name="tls",
            node_ttl_ms=NODE_TTL_MS,
            replica_lag_ms=REPLICA_LAG_MS,
            extra_args=args,
            ca=ca,
        )
        for i in (1, 2)
    ]
    try:
        for node in nodes:
            node.start()
        with httpx.Client(verify=ca, timeout=30) as http:

            def urls() -> dict[str, str]:
                view = http.get(f"{nodes[1].url}/v1/cluster").json()
                return {n["id"]: n["url"] for n in view["nodes"] if n["live"]}

            wait_until_sync(lambda: len(urls()) == 2, 60, "both nodes live")
            assert urls() == {"n1": nodes[0].url, "n2": nodes[1].url}  # https://, unasked
            made = http.put(
                f"{nodes[0].url}/v1/topics/tls.t",
                json={"partitions": 1, "replication_factor": 1},
            )
            assert made.status_code == 201, made.text

            def published() -> bool:  # through n2, whichever node leads: forwarded if n1
                answer = http.post(
                    f"{nodes[1].url}/v1/topics/tls.t/messages", json={"messages": [{"value": 5}]}
                )
                return answer.status_code == 200

            wait_until_sync(published, 60, "a publish through n2")
            read = http.get(
                f"{nodes[0].url}/v1/topics/tls.t/partitions/0/messages", params={"offset": 0}
            )
            assert read.status_code == 200, read.text
            assert 5 in [m["value"] for m in read.json()["messages"]]
    finally:
        for node in nodes:
            node.terminate()
    for node in nodes:
        assert "did not prove" not in node.log()
