"""HTTP and WebSocket over TLS, with a CA made in the test (PROTOCOL §6)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import START_TIMEOUT_S, HeraldProcess


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key) for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("Herald test CA"))
        .issuer_name(_name("Herald test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


class TlsHerald(HeraldProcess):
    def __init__(self, *args: object, ca: ssl.SSLContext, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ca = ca

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _wait_healthy(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/healthz", verify=self.ca, timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return False


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
