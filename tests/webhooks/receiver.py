"""A real webhook receiver on a free loopback port, as a user would run one: every
request is verified with the official `standardwebhooks` package, whatever its body
(the JSON of M, a batch, a raw value)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook

from tests.helpers import wait_until_sync


@dataclass
class Received:
    at: float  # time.monotonic()
    headers: dict[str, str]
    body: bytes
    # The body's JSON object; None when the signature did not verify (or, for a raw body,
    # the value is not a JSON object).
    message: dict[str, Any] | None
    status: int = 0
    verified: bool = False

    def ids(self) -> list[str]:
        """The ids of the records the request carried, whatever its body form."""
        if "herald-id" in self.headers:  # PROTOCOL §8 raw
            return [self.headers["herald-id"]]
        if self.message is None:
            return []
        if "messages" in self.message and "id" not in self.message:  # a batch
            return [m["id"] for m in self.message["messages"]]
        return [self.message["id"]]


@dataclass
class Answer:
    status: int = 200  # 0: close the connection without answering
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Behaviour = Callable[[Received], Answer]


class Receiver:
    def __init__(self, secrets: Sequence[str], behaviour: Behaviour | None = None) -> None:
        self.webhooks = [Webhook(s) for s in secrets]
        self.behaviour: Behaviour = behaviour or (lambda _: Answer())
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the dispatcher reuses connections

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = receiver.verify(body, headers)
                received = Received(
                    time.monotonic(), headers, body, _json_object(body) if verified else None
                )
                received.verified = verified
                with receiver.lock:
                    receiver.received.append(received)
                answer = receiver.behaviour(received)
                received.status = answer.status
                if answer.status == 0:  # hang up without an answer
                    self.close_connection = True
                    return
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the dispatcher timed out and hung up

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def verify(self, body: bytes, headers: dict[str, str]) -> bool:
        for webhook in self.webhooks:
            try:
                # Not parsed here: a raw body need not be JSON. (standardwebhooks reads
                # the body as UTF-8 text, so it cannot verify a raw body of other bytes.)
                webhook.verify(body, headers, json_parse=False)
            except Exception:
                continue
            return True
        return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    def acked_ids(self) -> set[str]:
        return {i for r in self.snapshot() if r.verified and 200 <= r.status < 300 for i in r.ids()}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        # 30 s, not 10: the wait ends as soon as the condition holds, and on a loaded
        # machine a first push can take long (10 s was missed once, 2026-11-28, in a
        # whole-suite run beside the nemesis, as it cut a disk's power and checked it).
        wait_until_sync(predicate, timeout, "the receiver's condition")


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def body_json(received: Received) -> dict[str, Any]:
    value = json.loads(received.body)
    assert isinstance(value, dict)
    return value
