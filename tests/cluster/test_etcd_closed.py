"""A cluster on a closed etcd (issue 26 item 3): etcd 3.4 serving only TLS, asking every
client for a certificate of its CA (``--client-cert-auth``) and with users (``auth
enable``). Nodes given the CA, a client certificate and a user work end to end; a node
with a wrong password or without a client certificate refuses to start, in one line
that says what to check (like an etcd that does not answer: test_etcd_absent.py).

The CA is made in the test (``cryptography``); etcd's users are added through its JSON
gateway (Debian's etcd-server ships no etcdctl), as ``etcdctl user add root`` and
``etcdctl auth enable`` would.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from cluster.etcd import EtcdAccess, EtcdClient
from tests.cluster.conftest import EtcdProcess
from tests.cluster.nodes import HeraldCluster, refusal_line, serve_to_exit
from tests.conftest import free_port
from tests.pki import SERVER_AND_CLIENT, TestCA, common_name

PASSWORD = "correct-horse-battery-staple-7"


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path  # etcd's, for 127.0.0.1
    key: Path
    # A node's: without a Common Name, which etcd's gateway refuses when auth is on
    # ("CommonName of client sending a request against gateway will be ignored").
    client_cert: Path
    client_key: Path


def make_pki(directory: Path) -> Pki:
    pki = Pki(
        directory / "ca.pem",
        directory / "etcd.pem",
        directory / "etcd.key",
        directory / "node.pem",
        directory / "node.key",
    )
    ca = TestCA(pki.ca, "herald etcd test CA")
    ca.issue(pki.cert, pki.key, common_name("127.0.0.1"), SERVER_AND_CLIENT)
    ca.issue(pki.client_cert, pki.client_key, x509.Name([]), SERVER_AND_CLIENT)
    return pki


class ClosedEtcd(EtcdProcess):
    """etcd on https:// client URLs, requiring a client certificate of ``pki``'s CA."""

    def __init__(self, data_dir: Path, pki: Pki) -> None:
        super().__init__(data_dir)
        self.pki = pki

    @property
    def urls(self) -> list[str]:
        return [f"https://127.0.0.1:{port}" for port in self.client_ports]

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cert-file", str(self.pki.cert),
            "--key-file", str(self.pki.key),
            "--trusted-ca-file", str(self.pki.ca),
            "--client-cert-auth",
            # bcrypt at its lowest cost: at cost 10 one authenticate took over 3 s on this
            # host under load (the nodes allow 10 s; cluster/etcd_access.py).
            "--bcrypt-cost", "4",
        ]  # fmt: skip

    def client(self) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.client_cert), str(self.pki.client_key))
        return httpx.Client(verify=context, timeout=10)

    def _healthy(self, url: str) -> bool:  # type: ignore[override]
        try:
            with self.client() as http:
                response = http.get(f"{url}/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200 and response.json().get("health") == "true"

    def enable_auth(self) -> None:
        """``etcdctl user add root && etcdctl auth enable``, through the gateway."""
        with self.client() as http:
            for path, body in (
                ("/v3/auth/role/add", {"name": "root"}),
                ("/v3/auth/user/add", {"name": "root", "password": PASSWORD}),
                ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
                ("/v3/auth/enable", {}),
            ):
                answer = http.post(self.urls[0] + path, json=body)
                assert answer.status_code == 200, (path, answer.text)


@pytest.fixture(scope="module")
def closed_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClosedEtcd]:
    base = tmp_path_factory.mktemp("closed-etcd")
    etcd = ClosedEtcd(base / "etcd", make_pki(base))
    try:
        etcd.start()
        etcd.enable_auth()
        yield etcd
    finally:
        etcd.terminate()


def _trust_args(etcd: ClosedEtcd, *, client_cert: bool = True) -> list[str]:
    args = ["--etcd-ca-file", str(etcd.pki.ca), "--etcd-user", "root"]
    if client_cert:
        pki = etcd.pki
        args += ["--etcd-cert-file", str(pki.client_cert), "--etcd-key-file", str(pki.client_key)]
    return args


def test_a_cluster_on_a_closed_etcd_works_end_to_end(
    closed_etcd: ClosedEtcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERALD_ETCD_PASSWORD", PASSWORD)  # inherited by the nodes
    cluster = HeraldCluster(
        tmp_path / "cluster",
        2,
        etcd=closed_etcd,
        cluster_name="closed",
        extra_args=_trust_args(closed_etcd),
        cluster_secret=True,
    )
    with cluster:  # started: both nodes registered, and each sees the other live
        cluster.create_topic("closed.t", partitions=2, replication_factor=2)
        published = cluster.post(
            "n1",
            "/v1/topics/closed.t/messages",
            {"messages": [{"key": "k", "value": 1}]},
            acks="all",
        )
        assert published.status_code == 200, published.text
        (result,) = published.json()["results"]
        read = cluster.get(
            "n2", f"/v1/topics/closed.t/partitions/{result['partition']}/messages", offset=0
        )
        assert read.status_code == 200, read.text
        assert [m["value"] for m in read.json()["messages"]] == [1]
        made = cluster.put("n2", "/v1/subscriptions/closed-s", {"topic": "closed.t"})
        assert made.status_code == 201, made.text
        logs = "".join(node.log() for node in cluster.nodes.values())
    assert PASSWORD not in logs


def _serve(
    tmp_path: Path, etcd: ClosedEtcd, args: list[str], password: str
) -> subprocess.CompletedProcess[str]:
    return serve_to_exit(
        tmp_path / "data",
        etcd.urls,
        "--cluster-name", "refused", *args,
        port=free_port(),
        env={"HERALD_ETCD_PASSWORD": password},
    )  # fmt: skip


def test_a_wrong_etcd_password_refuses_the_start_in_one_line(
    closed_etcd: ClosedEtcd, tmp_path: Path
) -> None:
    wrong = "not-the-password-8"
    line = refusal_line(_serve(tmp_path, closed_etcd, _trust_args(closed_etcd), wrong))
    assert "root" in line and "HERALD_ETCD_PASSWORD" in line, line
    assert wrong not in line


def test_a_start_without_a_client_certificate_is_refused_in_one_line(
    closed_etcd: ClosedEtcd, tmp_path: Path
) -> None:
    args = _trust_args(closed_etcd, client_cert=False)
    line = refusal_line(_serve(tmp_path, closed_etcd, args, PASSWORD))
    assert "--etcd-cert-file" in line and closed_etcd.urls[0] in line, line


async def test_a_token_etcd_no_longer_knows_is_replaced(closed_etcd: ClosedEtcd) -> None:
    """etcd forgets a token (``--auth-token-ttl`` unused, a restart): the call that is
    refused with "invalid auth token" takes a new one and is sent again; so does a
    watch."""
    pki = closed_etcd.pki
    access = EtcdAccess("root", PASSWORD, pki.ca, pki.client_cert, pki.client_key)
    async with EtcdClient(closed_etcd.urls, timeout=20, attempt_timeout=5, access=access) as etcd:
        await etcd.authenticate(within_s=30)
        etcd.auth._token = "forgotten.1"  # what etcd answers a forgotten token with
        await etcd.put("/token-test/a", "1")
        assert etcd.auth._token not in (None, "forgotten.1")
        etcd.auth._token = "forgotten.2"
        async with etcd.watch("/token-test/", prefix=True) as watch:
            await etcd.put("/token-test/b", "2")
            event = await asyncio.wait_for(anext(watch), 30)
        assert event.kv.key == b"/token-test/b" and event.kv.value == b"2"
        assert (await etcd.get("/token-test/a")) is not None
