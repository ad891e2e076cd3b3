"""PROTOCOL §6 (settled 2026-11-26): memory per connection is bounded in bytes — a
WebSocket consumer that does not read is sent nothing more once its unsent frames pass a
few MiB, whatever credit it gave (issue 26, item 7).

The attack: a consumer grants 100,000 credits and never reads; every record the
subscription has goes into the server's outbox for it (credit x record size: ~100 MB in
the probe). Here a real client does the WebSocket handshake on a raw socket with a small
receive buffer and then reads nothing; 600 records of 64 KiB (37.5 MiB) wait in the
subscription. The records sent to it (the subscription's `in_flight`) stop well short of
all of them: the outbox (4 MiB), uvicorn's buffer and both kernels' socket buffers (at
most 4 MiB for the server's on this host) hold a bounded number.
"""

from __future__ import annotations

import base64
import os
import socket
import time

import httpx

from tests.conftest import HeraldProcess

RECORD_BYTES = 64 * 1024
RECORDS = 600
# Outbox 4 MiB + a frame in hand + socket buffers (4 MiB + 16 KiB): ~8.6 MiB; 16 MiB
# leaves room and is well under the 37.5 MiB the old outbox took in.
BOUND_BYTES = 16 * 1024 * 1024


def _stats(url: str) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(f"{url}/v1/subscriptions/unread", timeout=30).json()["stats"]
    return stats


def test_a_consumer_that_does_not_read_holds_a_few_mib(herald_server: HeraldProcess) -> None:
    url = herald_server.url
    assert httpx.put(f"{url}/v1/topics/big", json={"partitions": 1}).status_code == 201
    sub = {"topic": "big", "start": "earliest", "ack_deadline_ms": 600_000}
    assert httpx.put(f"{url}/v1/subscriptions/unread", json=sub).status_code == 201
    value = "x" * RECORD_BYTES
    for _ in range(RECORDS // 50):
        r = httpx.post(
            f"{url}/v1/topics/big/messages",
            json={"messages": [{"value": value}] * 50},
            timeout=60,
        )
        assert r.status_code == 200, r.text

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", herald_server.port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                "GET /v1/subscriptions/unread/ws?credit=100000 HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{herald_server.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)  # byte by byte: nothing past the handshake is read
            assert chunk, "the server closed the connection"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head

        # Until the number sent stops moving (no more than 60 s): then no more is sent.
        readings: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            readings.append(_stats(url)["in_flight"])
            if len(readings) >= 4 and readings[-1] == readings[-4] > 0:
                break
            time.sleep(1)
        in_flight = readings[-1]
        print(f"in_flight readings: {readings}")
        assert 0 < in_flight * RECORD_BYTES <= BOUND_BYTES, readings
        assert in_flight < RECORDS
