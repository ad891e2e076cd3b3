"""What an HTTP server costs per one-record publish, before Herald does any work.

Issue 27 §2: Herald spends 330-350 µs of server CPU per one-record publish and
delivery where NATS spends 162. This bench answers one question under it: how much
of a request's CPU is the HTTP stack's, and would another server take it away?

The same trivial handler (read the body, answer a 40-byte JSON publish answer) is
served three ways, each on a free loopback port in its own process, in turn
(the order alternating every round, so a busy host weighs on each alike):

- ``uvicorn``: a bare ASGI app under uvicorn with uvloop and httptools, as
  ``herald serve`` runs it, without Herald's middlewares;
- ``granian``: the same ASGI app under granian (a Rust HTTP server; one worker,
  one runtime thread, uvloop) — only if ``granian`` is installed
  (``pip install granian``; it is not a Herald dependency);
- ``herald``: the same, under uvicorn as ``herald serve`` configures it: no proxy
  headers (none trusted by default), and server/http_protocol.py's protocol class
  (the header deadline, a response's head and body in one write);
- ``lean``: the same ASGI app under the least an ASGI server must do on uvloop and
  httptools (a scope, a task per request, ``receive`` and ``send`` as coroutines):
  what ASGI itself costs, as against uvicorn's implementation of it;
- ``raw``: an asyncio protocol on uvloop parsing with httptools and writing a
  prebuilt answer: the floor of any Python server on this loop.

A hand-built client sends one request at a time over one keep-alive connection
(stop-and-wait, as one-record publishing is) and the figure is the server
process tree's user+system CPU per request, read from /proc: CPU time, not
latency, is the figure to compare on a shared machine.

    python -m bench.http_servers [--rounds 4] [--requests 5000]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import cpu_seconds, free_port, wait_for_port

ANSWER = b'{"results":[{"partition":0,"offset":1}]}'

ASGI_APP = f"""
ANSWER = {ANSWER!r}
HEAD = [(b"content-type", b"application/json"), (b"content-length", b"{len(ANSWER)}")]

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({{"type": "lifespan.startup.complete"}})
            else:
                await send({{"type": "lifespan.shutdown.complete"}})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({{"type": "http.response.start", "status": 200, "headers": HEAD}})
    await send({{"type": "http.response.body", "body": ANSWER}})
"""

# What both bare servers share: the imports, the connection and parser set-up, and main.
_PROTOCOL_HEAD = """
import asyncio, sys
import httptools, uvloop

class Base(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data):
        self.parser.feed_data(data)
"""
_MAIN = """
async def main(port):
    server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", port)
    await server.serve_forever()

uvloop.run(main(int(sys.argv[1])))
"""

RAW_SERVER = (
    _PROTOCOL_HEAD
    + f"""
ANSWER = {ANSWER!r}
RESPONSE = (
    b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
    b"content-length: {len(ANSWER)}\\r\\n\\r\\n" + ANSWER
)

class Protocol(Base):
    def on_message_complete(self):
        self.transport.write(RESPONSE)
"""
    + _MAIN
)

LEAN_SERVER = (
    _PROTOCOL_HEAD
    + """
from app import app

class Protocol(Base):
    def on_message_begin(self):
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        self.headers.append((name.lower(), value))

    def on_body(self, body):
        self.body.append(body)

    def on_message_complete(self):
        url = httptools.parse_url(self.url)
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": self.parser.get_method().decode("ascii"), "scheme": "http",
            "path": url.path.decode("ascii"), "raw_path": url.path,
            "query_string": url.query or b"", "root_path": "", "headers": self.headers,
            "client": None, "server": None,
        }
        body, transport, head = b"".join(self.body), self.transport, []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                head.append(b"HTTP/1.1 %d OK\\r\\n" % message["status"])
                head.extend(b"%s: %s\\r\\n" % pair for pair in message["headers"])
                head.append(b"\\r\\n")
            else:
                transport.write(b"".join(head) + message["body"])

        asyncio.get_running_loop().create_task(app(scope, receive, send))
"""
    + _MAIN
)


HERALD_UVICORN = """
import sys
sys.path.insert(0, sys.argv[2])
import uvicorn
from app import app
from server.http_protocol import guarded_protocol

uvicorn.run(
    app, port=int(sys.argv[1]), loop="uvloop", http=guarded_protocol(10.0),
    proxy_headers=False, access_log=False, server_header=False, log_level="warning",
)
"""


def _command(kind: str, port: int) -> list[str]:
    if kind == "herald":
        return [sys.executable, "herald_uvicorn.py", str(port), str(Path(__file__).parents[1])]
    if kind == "uvicorn":
        return [
            sys.executable, "-m", "uvicorn", "app:app", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning",
        ]  # fmt: skip
    if kind == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "asgi", "--port", str(port),
            "--workers", "1", "--runtime-threads", "1", "--runtime-mode", "st",
            "--loop", "uvloop", "--log-level", "warning", "app:app",
        ]  # fmt: skip
    return [sys.executable, f"{kind}.py", str(port)]


def _cpu_seconds(pid: int) -> float:
    """User+system CPU of ``pid`` and its children (granian serves from a child)."""
    children = subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    return sum(cpu_seconds(one) or 0.0 for one in [pid, *map(int, children)])


def _request() -> bytes:
    body = b'{"messages":[{"value":"' + b"x" * 1000 + b'"}]}'
    head = (
        b"POST /v1/topics/t/publish HTTP/1.1\r\nhost: bench\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    return head + body


def _stop_and_wait(port: int, pid: int, requests: int) -> float:
    """Server CPU µs per request, one request at a time on one connection."""
    request = _request()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one() -> None:
            sock.sendall(request)
            received = b""
            while not received.endswith(ANSWER):
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("the server closed the connection")
                received += chunk

        for _ in range(500):  # warm up
            one()
        before = _cpu_seconds(pid)
        for _ in range(requests):
            one()
        return (_cpu_seconds(pid) - before) / requests * 1e6


def _serve(kind: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        _command(kind, port), cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, proc, kind, 30)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    return proc, port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_servers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args(argv)
    kinds = ["uvicorn", "herald", "lean", "raw"]
    if importlib.util.find_spec("granian") is not None:
        kinds.insert(1, "granian")
    else:
        print("granian is not installed (pip install granian): left out")
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="herald-http-") as tmp:
        workdir = Path(tmp)
        (workdir / "app.py").write_text(ASGI_APP)
        (workdir / "raw.py").write_text(RAW_SERVER)
        (workdir / "lean.py").write_text(LEAN_SERVER)
        (workdir / "herald_uvicorn.py").write_text(HERALD_UVICORN)
        for round_ in range(args.rounds):
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                proc, port = _serve(kind, workdir)
                try:
                    cpu = _stop_and_wait(port, proc.pid, args.requests)
                finally:
                    proc.send_signal(signal.SIGINT)
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                figures[kind].append(cpu)
                print(f"round {round_ + 1} {kind:8} {cpu:6.0f} µs CPU per request", flush=True)
    floor = statistics.median(figures["raw"])
    print(
        f"medians of {args.rounds} rounds, {args.requests} requests each (load {os.getloadavg()[0]:.1f}):"
    )
    for kind, values in figures.items():
        median = statistics.median(values)
        print(
            f"  {kind:8} {median:6.0f} µs CPU per request  ({median / floor:.1f} x the raw floor)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
