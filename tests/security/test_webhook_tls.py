"""Webhook deliveries verify the endpoint's certificate; --webhook-ca-file adds a private CA."""

from __future__ import annotations

import base64
import http.server
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import HeraldProcess
from tests.helpers import wait_until_sync
from tests.security.test_tls import make_ca_and_server_cert


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def https_receiver(tmp_path: Path) -> Iterator[tuple[str, Path, list[bytes]]]:
    ca_path, cert_path, key_path = make_ca_and_server_cert(tmp_path)
    bodies: list[bytes] = []
    handler = type("Receiver", (_Receiver,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hook", ca_path, bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def push_one(server: HeraldProcess, hook: str) -> None:
    made = httpx.put(
        f"{server.url}/v1/subscriptions/hooked",
        json={
            "topic": "hooked",
            "start": "earliest",
            "push": {"url": hook, "secret": "whsec_" + base64.b64encode(b"k" * 32).decode()},
        },
    )
    assert made.status_code in (200, 201), made.text
    sent = httpx.post(
        f"{server.url}/v1/topics/hooked/messages", json={"messages": [{"value": "secret"}]}
    )
    assert sent.status_code == 200


def test_webhook_to_a_private_ca_endpoint_is_delivered_with_the_ca_file(
    herald_factory: Callable[..., HeraldProcess],
    https_receiver: tuple[str, Path, list[bytes]],
) -> None:
    hook, ca_path, bodies = https_receiver
    server = herald_factory("--webhook-ca-file", str(ca_path))
    push_one(server, hook)
    wait_until_sync(lambda: bool(bodies), within=15, what="the POST over TLS")
    assert b"secret" in bodies[0]


def test_webhook_to_an_unknown_ca_is_not_delivered(
    herald_factory: Callable[..., HeraldProcess],
    https_receiver: tuple[str, Path, list[bytes]],
) -> None:
    hook, _, bodies = https_receiver
    server = herald_factory()
    push_one(server, hook)

    def failed_attempts() -> list[dict[str, object]]:
        log = httpx.get(f"{server.url}/v1/subscriptions/hooked/attempts").json()["attempts"]
        return [a for a in log if a["error"] is not None]

    # Several attempts fail certificate verification, and none reached the endpoint.
    wait_until_sync(lambda: len(failed_attempts()) >= 2, within=15, what="failed attempts")
    assert bodies == []
    assert all(a["status"] is None for a in failed_attempts())
