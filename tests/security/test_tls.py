"""HTTP and WebSocket over TLS, with a CA made in the test (PROTOCOL §6)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import HeraldProcess
from tests.pki import TestCA, common_name


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key) for 127.0.0.1 and localhost."""
    ca = TestCA(directory / "ca.pem")
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    ca.issue(cert_path, key_path, common_name("127.0.0.1"))
    return ca.path, cert_path, key_path


class TlsHerald(HeraldProcess):
    def __init__(self, *args: object, ca: ssl.SSLContext, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ca = self.verify = ca

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def tls_herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsHerald]:
    base = tmp_path_factory.mktemp("tls")
    ca_path, cert_path, key_path = make_ca_and_server_cert(base)
    ca = ssl.create_default_context(cafile=str(ca_path))
    server = TlsHerald(
        base / "data",
        extra_args=["--tls-cert", str(cert_path), "--tls-key", str(key_path)],
        ca=ca,
    ).start()
    try:
        yield server
    finally:
        server.terminate()


async def test_publish_and_consume_over_tls_with_the_test_ca(tls_herald: TlsHerald) -> None:
    url = tls_herald.url
    async with httpx.AsyncClient(verify=tls_herald.ca) as client:
        published = await client.post(
            f"{url}/v1/topics/secure/messages", json={"messages": [{"value": "over tls"}]}
        )
        assert published.status_code == 200, published.text
        made = await client.put(
            f"{url}/v1/subscriptions/secure-sub", json={"topic": "secure", "start": "earliest"}
        )
        assert made.status_code in (200, 201), made.text
    ws_url = url.replace("https://", "wss://") + "/v1/subscriptions/secure-sub/ws?credit=1"
    async with websockets.connect(ws_url, ssl=tls_herald.ca) as ws:
        frames = [await ws.recv() for _ in range(2)]
    assert any("over tls" in str(frame) for frame in frames)


def test_clients_without_the_ca_are_refused_and_plain_http_is_not_served(
    tls_herald: TlsHerald,
) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tls_herald.url}/healthz")  # the system CAs do not know the test CA
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{tls_herald.port}/healthz", timeout=3)


def test_cert_without_key_is_a_config_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--tls-cert", str(tmp_path / "c.pem"),
         "--data-dir", str(tmp_path / "d")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "tls_cert and tls_key" in done.stderr
